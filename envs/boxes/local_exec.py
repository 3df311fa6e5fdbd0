"""One process inside a `local` sandbox: how it gets in, what it may do, how it is ended.

Entry, in the forked child before exec (no program of the sandbox's tree runs before its
privileges are cut, so a replaced binary in the sandbox gains nothing):
1. into the sandbox's cgroups and a fresh exec group (local_cg);
2. setns into PID 1's IPC, UTS, network, PID and mount namespaces, and chroot to its root;
3. fork (the PID namespace applies to children): the child is in the sandbox, the parent only
   waits for it and ends the same way (exit status or signal);
4. in the child: the capability bounding set cut down to Docker's default set (chown,
   dac_override, fowner, fsetid, kill, setgid, setuid, setpcap, net_bind_service, net_raw,
   sys_chroot, audit_write, setfcap: no sys_admin, no mknod, no module loading, no ptrace), so the
   program's root holds only those after exec; for `user`, its groups, gid and uid (looked up by
   a confined `getent`/`id` in the sandbox, never by loading the sandbox's NSS modules here);
5. exec `/bin/sh -c 'cd <cwd>'` (exit 125 when it cannot), which execs the command.

Ending: past the timeout (or when the awaiting task is cancelled) every process of this exec is
SIGKILLed: the session its first process leads (its process group) and every process in the exec's cgroup
group, however it detached (setsid, double fork, nohup, `&`): the cgroup is the complete record.
Processes left behind by an exec that *finished* (a server started with `&`) keep running until
kill_all or close. Output: each stream's first `max_output` bytes are kept, the rest counted;
once the command has exited, output still held open by such background processes is waited for
at most OUTPUT_GRACE_S.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from envs.boxes.local_cg import SandboxCgroup
from envs.sandbox.isolation import PR_CAPBSET_DROP, libc

# chown dac_override fowner fsetid kill setgid setuid setpcap net_bind_service net_raw sys_chroot
# audit_write setfcap (linux/capability.h numbers)
KEEP_CAPS = frozenset({0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 29, 31})
NAMESPACES = ("ipc", "uts", "net", "pid", "mnt")
OUTPUT_GRACE_S = 0.5
FEED_GRACE_S = 2.0  # an exec's stdin writer, once the program has ended


@dataclass
class Ran:
    exit_code: int
    stdout: bytes
    stderr: bytes
    stdout_dropped: int
    stderr_dropped: int
    timed_out: bool
    duration_s: float


@dataclass(frozen=True)
class Identity:
    """Who runs the command: uid/gid as the sandbox's passwd says (None: root)."""

    uid: Optional[int] = None
    gid: Optional[int] = None
    home: str = "/root"
    name: str = "root"
    groups: tuple[int, ...] = ()


def argv_for(cwd: str, cmd: Sequence[str]) -> list[str]:
    """The command behind a `cd` as its own user (a directory it may not enter fails as in a shell)."""
    return ["/bin/sh", "-c", 'cd -- "$0" || exit 125; exec "$@"', cwd, *cmd]


def _mirror(child: int) -> None:
    """The waiting parent of step 3: end as the child ended."""
    os.closerange(3, 65536)  # the caller's exec-status pipe above all: it must see EOF at the exec
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
        finally:
            os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status))


def enter(pid: int, procs: list[str], who: Identity) -> Callable[[], None]:
    """The child's set-up between fork and exec (steps 1-4 of the module docstring)."""
    last_cap = int(Path("/proc/sys/kernel/cap_last_cap").read_text())

    def setup() -> None:
        c = libc()
        for path in procs:
            fd = os.open(path, os.O_WRONLY)
            os.write(fd, b"0")
            os.close(fd)
        fds = [os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY) for name in NAMESPACES]
        root = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY)
        for fd in fds:
            if c.setns(fd, 0) != 0:
                raise OSError(ctypes.get_errno(), "setns")
        os.fchdir(root)
        os.chroot(".")
        os.chdir("/")
        for fd in (*fds, root):
            os.close(fd)
        child = os.fork()
        if child:
            _mirror(child)
        for cap in range(last_cap + 1):
            if cap not in KEEP_CAPS and c.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), f"drop capability {cap}")
        if who.uid is not None and who.gid is not None:
            os.setgroups(list(who.groups))
            os.setgid(who.gid)
            os.setuid(who.uid)

    return setup


class _Sink:
    """One stream's first `limit` bytes and the count of the rest (kept as it arrives, so what
    came before a cut-off is not lost)."""

    def __init__(self, limit: int):
        self.limit, self.kept, self.dropped = limit, bytearray(), 0

    async def drain(self, stream: Optional[asyncio.StreamReader]) -> None:
        while stream is not None and (chunk := await stream.read(1 << 16)):
            room = max(0, self.limit - len(self.kept))
            self.kept += chunk[:room]
            self.dropped += max(0, len(chunk) - room)


async def _feed(pipe: Any, data: bytes) -> None:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, pipe)
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    try:
        writer.write(data)
        await writer.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        writer.close()


async def _reader(pipe: Any) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    """The pipe as a stream, and its transport, which the caller closes: a pipe left open past its
    exec (a background process holds it) must leave the loop's registry with it, or a later pipe
    with the same descriptor number cannot be registered (uvloop: EEXIST)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 16)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    return reader, transport


class _Child:
    """A process spawned by the standard library's fork+exec (whatever the event loop: uvloop's own
    spawn cannot run the entry's set-up between fork and exec), its exit awaited through a pidfd."""

    def __init__(self, popen: subprocess.Popen):
        self.popen, self.pid = popen, popen.pid
        self._exited = asyncio.get_running_loop().create_future()
        self._fd = os.pidfd_open(self.pid)
        asyncio.get_running_loop().add_reader(self._fd, self._on_exit)

    def _on_exit(self) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(self._fd)
        os.close(self._fd)
        self.popen.wait()
        if not self._exited.done():
            self._exited.set_result(self.popen.returncode)

    @property
    def returncode(self) -> Optional[int]:
        return self.popen.returncode

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)


def kill_exec(proc: Any, cg: SandboxCgroup, group: Path) -> None:
    """SIGKILL the exec's process group and everything in its cgroup group."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    cg.kill(group)


async def run_inside(
    pid: int,
    cg: SandboxCgroup,
    cmd: Sequence[str],
    *,
    timeout_s: float,
    cwd: str,
    env: Mapping[str, str],
    who: Identity,
    max_output: int,
    stdin: Optional[bytes] = None,
) -> Ran:
    started = time.monotonic()
    group, procs = cg.exec_group()
    popen = subprocess.Popen(
        argv_for(cwd, cmd),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
        start_new_session=True,
        preexec_fn=enter(pid, procs, who),
    )
    proc = _Child(popen)
    out, err = _Sink(max_output), _Sink(max_output)
    (out_stream, out_pipe), (err_stream, err_pipe) = await _reader(popen.stdout), await _reader(popen.stderr)
    readers = asyncio.ensure_future(asyncio.gather(out.drain(out_stream), err.drain(err_stream)))
    feeder = asyncio.ensure_future(_feed(popen.stdin, stdin)) if stdin is not None else None
    timed_out = False
    try:
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except asyncio.TimeoutError:
            timed_out = True
            await asyncio.to_thread(kill_exec, proc, cg, group)
            await proc.wait()
        try:
            await asyncio.wait_for(asyncio.shield(readers), OUTPUT_GRACE_S if not timed_out else 5.0)
        except asyncio.TimeoutError:  # a background process holds the pipes open: keep what came
            pass
    finally:
        if proc.returncode is None:  # cancelled while it ran
            kill_exec(proc, cg, group)
        if feeder is not None:  # it ends at once when the program has (a broken pipe): let it close its pipe
            await asyncio.wait([feeder], timeout=FEED_GRACE_S)
        for task in (readers, feeder):
            if task is not None and not task.done():
                task.cancel()
        out_pipe.close()
        err_pipe.close()
        if not cg.pids(group):
            cg.drop_group(group)
    code = proc.returncode if proc.returncode is not None else -1
    return Ran(
        exit_code=-1 if timed_out else (128 - code if code < 0 else code),
        stdout=bytes(out.kept),
        stderr=bytes(err.kept),
        stdout_dropped=out.dropped,
        stderr_dropped=err.dropped,
        timed_out=timed_out,
        duration_s=time.monotonic() - started,
    )
