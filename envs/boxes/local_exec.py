"""One process inside a `local` sandbox: how it gets in, what it may do, how it is ended.

Entry: the host's util-linux `nsenter --target <PID 1> --mount --uts --ipc --net --pid --root
--wd` (PID namespace entered, so nsenter forks once and its child is in the sandbox), after
the process has written itself into the sandbox's cgroups and a fresh exec group (see
local_cg). nsenter then runs the *sandbox's* `setpriv`, which empties the capability bounding
set down to Docker's default set (chown, dac_override, fowner, fsetid, kill, setgid, setuid,
setpcap, net_bind_service, net_raw, sys_chroot, audit_write, setfcap: no sys_admin, no mknod, no
module loading, no ptrace of the host) and, for `user`, switches to its uid, gid and groups as
the sandbox's own /etc/passwd defines them; then `sh -c 'cd <cwd>'` (exit 125 when it cannot) execs
the command. Nothing of the sandbox's tree ever runs outside its
namespaces, cgroup and reduced capabilities (file copies go through the same path).

Ending: past the timeout (or when the awaiting task is cancelled) every process of this exec is
SIGKILLed: the session nsenter leads (its process group) and every process in the exec's cgroup
group, however it detached (setsid, double fork, nohup, `&`): the cgroup is the complete record.
Processes left behind by an exec that *finished* (a server started with `&`) keep running until
kill_all or close. Output: each stream's first `max_output` bytes are kept, the rest counted;
once the command has exited, output still held open by such background processes is waited for
at most OUTPUT_GRACE_S.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

from envs.boxes.local_cg import SandboxCgroup

NSENTER = shutil.which("nsenter") or "/usr/bin/nsenter"
KEEP_CAPS = (
    "chown,dac_override,fowner,fsetid,kill,setgid,setuid,setpcap,net_bind_service,net_raw,sys_chroot,"
    "audit_write,setfcap"
)
OUTPUT_GRACE_S = 0.5


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


def argv_for(pid: int, cwd: str, who: Identity, cmd: Sequence[str]) -> list[str]:
    setpriv = ["setpriv", f"--bounding-set=-all,+{KEEP_CAPS.replace(',', ',+')}", "--inh-caps=-all"]
    if who.uid is not None:
        setpriv += [f"--reuid={who.uid}", f"--regid={who.gid}", "--init-groups"]
    # nsenter's --wd=DIR resolves DIR on the host, not in the sandbox: enter at the sandbox's /, then
    # cd there as the command's own user (a directory it may not enter fails as it would in a shell).
    ns = ["--mount", "--uts", "--ipc", "--net", "--pid", "--root", "--wd"]
    enter_cwd = ["/bin/sh", "-c", 'cd -- "$0" || exit 125; exec "$@"', cwd]
    return [NSENTER, f"--target={pid}", *ns, "--", *setpriv, "--", *enter_cwd, *cmd]


def _join(procs: list[str]) -> None:
    """In the child before exec: into the sandbox's cgroups (nothing else: it runs after fork)."""
    for path in procs:
        fd = os.open(path, os.O_WRONLY)
        os.write(fd, b"0")
        os.close(fd)


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


async def _feed(proc: asyncio.subprocess.Process, data: bytes) -> None:
    assert proc.stdin is not None
    try:
        proc.stdin.write(data)
        await proc.stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        proc.stdin.close()


def kill_exec(proc: asyncio.subprocess.Process, cg: SandboxCgroup, group: Path) -> None:
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
    proc = await asyncio.create_subprocess_exec(
        *argv_for(pid, cwd, who, cmd),
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env),
        start_new_session=True,
        preexec_fn=lambda: _join(procs),
    )
    out, err = _Sink(max_output), _Sink(max_output)
    readers = asyncio.ensure_future(asyncio.gather(out.drain(proc.stdout), err.drain(proc.stderr)))
    feeder = asyncio.ensure_future(_feed(proc, stdin)) if stdin is not None else None
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
        for task in (readers, feeder):
            if task is not None and not task.done():
                task.cancel()
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
