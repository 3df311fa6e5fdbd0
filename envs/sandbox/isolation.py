"""The confinement of one sandbox run: who it runs as, what it sees, what it may use.

Layers, in the order the child sets them up between fork and exec (`preexec`):

  uid         as root: a fresh uid from a lock-guarded range (UID_BASE..), held for the run, so
              RLIMIT_NPROC counts only this run and nothing else shares its files; not root (the
              sandbox's rq worker drops to such a uid for its whole life): that uid.
  cgroup      a cgroup per run with memory, pids and CPU limits (v2, or v1's controllers),
              where this process may make one (root, or a subtree delegated to the worker's uid);
              `isolation["cgroup"]` says whether it held.
  namespaces  new user, mount, PID, network, IPC and UTS namespaces (unprivileged user
              namespaces; no root needed): no network at all (not even loopback), no SysV/POSIX
              IPC shared with the host, its own process tree (PID 1 is the runner; when it
              exits the kernel kills everything the program left), its own /proc (no other
              process's command line is visible).
  filesystem  every host mount read-only, nosuid and nodev; a private size-capped tmpfs on
              /tmp, /var/tmp, /dev/shm and /run (so no host Unix socket under them is reachable;
              abstract sockets stay behind the network namespace); the run's directory bound at
              /tmp/run, the only place it starts in.
  privileges  no_new_privs (setuid binaries gain nothing), the capability bounding set emptied
              (the namespace's root keeps no capability across exec).
  rlimits     CPU seconds, address space, file size, open files, processes, no core dumps.

The wall clock is the caller's (envs.sandbox.run): past it the run's process group is killed,
and with it the PID namespace.

Without unprivileged user namespaces (some hardened kernels, default Docker seccomp) none of
the namespaces can be made: the run raises SandboxUnavailable unless Limits.allow_network is
set, and then only the uid, rlimits and no_new_privs hold (`isolation` records which did).
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import os
import re
import resource
import secrets
import signal
import time
from pathlib import Path
from typing import Callable, Optional

from envs.sandbox.result import Limits, SandboxError

UID_BASE = 611_000  # sandbox uids: UID_BASE .. UID_BASE + UID_COUNT - 1 (unused by real accounts)
UID_COUNT = 512
LEASES = Path("/run/farm-sandbox-uids")  # root only (0700); a uid is held while its lock file is
RUN_DIR = "/tmp/run"  # where the run's directory appears inside the sandbox

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
NAMESPACES = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
_KEEP = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 1, 4, 24, 38, 36
PRIVATE_TMPFS = ("/tmp", "/var/tmp", "/dev/shm", "/run")


def libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _call(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


@functools.lru_cache(maxsize=None)
def can_unshare(flags: int = NAMESPACES) -> bool:
    """Whether a process of this uid may create these namespaces (probed once, in a throwaway child)."""
    pid = os.fork()
    if pid == 0:
        try:
            if os.geteuid() == 0:  # probe as an unprivileged uid would: that is how runs are made
                os.setresgid(UID_BASE + UID_COUNT - 1, UID_BASE + UID_COUNT - 1, UID_BASE + UID_COUNT - 1)
                os.setresuid(UID_BASE + UID_COUNT - 1, UID_BASE + UID_COUNT - 1, UID_BASE + UID_COUNT - 1)
            os._exit(0 if libc().unshare(flags) == 0 else 1)
        except BaseException:
            os._exit(2)
    return os.waitpid(pid, 0)[1] == 0


# ── uids ──────────────────────────────────────────────────────────────────────────────────────
class UidLease:
    """A sandbox uid no other run on this machine holds (flock on a per-uid file; root only)."""

    def __init__(self) -> None:
        self.fd: Optional[int] = None
        self.uid = -1

    def __enter__(self) -> int:
        LEASES.mkdir(mode=0o700, parents=True, exist_ok=True)
        start = secrets.randbelow(UID_COUNT - 1)
        for k in range(UID_COUNT - 1):
            uid = UID_BASE + (start + k) % (UID_COUNT - 1)
            fd = os.open(LEASES / str(uid), os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.fd, self.uid = fd, uid
            kill_uid(uid)  # stragglers of a crashed earlier holder
            return uid
        raise SandboxError(f"all {UID_COUNT - 1} sandbox uids are busy")

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _uid_processes(uid: int) -> list[tuple[int, str, int]]:
    """(pid, state, threads) of every process of `uid`."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                lines = Path(f"/proc/{entry}/status").read_text().splitlines()
            except OSError:
                continue
            fields = {line.split(":", 1)[0]: line.split(":", 1)[1].split() for line in lines if ":" in line}
            if fields.get("Uid", [""])[0] == str(uid):
                out.append((int(entry), fields.get("State", ["?"])[0], int(fields.get("Threads", ["1"])[0])))
    return out


def uid_tasks(uid: int) -> int:
    """Threads of every live process of `uid` (what RLIMIT_NPROC counts)."""
    return sum(threads for _pid, state, threads in _uid_processes(uid) if state != "Z")


def kill_uid(uid: int, tries: int = 50) -> None:
    """SIGKILL every process of `uid` (kill(-1) sent as that uid) until none runs; reap those that
    came back to this process (a child subreaper) as zombies."""
    for _ in range(tries):
        procs = _uid_processes(uid)
        for pid, state, _threads in procs:
            if state == "Z":
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
        if not any(state != "Z" for _pid, state, _threads in procs):
            return
        pid = os.fork()
        if pid == 0:
            try:
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
                os.kill(-1, signal.SIGKILL)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        time.sleep(0.01)
    raise SandboxError(f"processes of sandbox uid {uid} survived SIGKILL")


def drop_to(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    # A uid change makes the process non-dumpable, which leaves /proc/self owned by root, and a
    # new user namespace could not write its own uid_map: dumpable again, as any process of uid.
    libc().prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)


# ── the child's set-up ─────────────────────────────────────────────────────────────────────
def _mount(source: Optional[str], target: str, fstype: Optional[str], flags: int, data: Optional[str] = None) -> None:
    def enc(s: Optional[str]) -> Optional[bytes]:
        return s.encode() if s is not None else None

    _call(libc().mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


_OCTAL = re.compile(r"\\([0-7]{3})")


def _mounts() -> list[tuple[str, set[str]]]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        parts = line.split()
        # Octal escapes (\040 for a space) decoded by hand: no codec may be imported here, after
        # the uid drop the interpreter's own library can be out of reach.
        out.append((_OCTAL.sub(lambda m: chr(int(m.group(1), 8)), parts[4]), set(parts[5].split(","))))
    return out


def _filesystem(workdir_fd: int, limits: Limits) -> None:
    """In the new mount namespace: host mounts read-only, private tmpfs, the run's directory at RUN_DIR."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    size = f"size={limits.tmp_mb}m,mode=1777"
    for target in PRIVATE_TMPFS:
        if os.path.isdir(target) and not os.path.islink(target):
            _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, size if target != "/run" else "size=1m,mode=755")
    # The run's files are copied into the private /tmp: what the program writes stays in capped
    # memory (charged to its cgroup), never on the host's disk.
    os.mkdir(RUN_DIR, 0o700)
    for name in os.listdir(workdir_fd):
        src = os.open(name, os.O_RDONLY, dir_fd=workdir_fd)
        dst = os.open(f"{RUN_DIR}/{name}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        while chunk := os.read(src, 1 << 20):
            os.write(dst, chunk)
        os.close(src)
        os.close(dst)
    ours = set(PRIVATE_TMPFS)
    for point, opts in _mounts():
        if point in ours or point.startswith(("/proc", "/sys")):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
        for name, bit in _KEEP.items():
            if name in opts:
                flags |= bit
        if libc().mount(None, point.encode(), None, flags, None) != 0 and point == "/":
            _call(-1, "remount / read-only")
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _rlimits(limits: Limits, nproc: int) -> None:
    mem = limits.memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_mb * 2**20,) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _no_privileges(namespaced: bool) -> None:
    c = libc()
    _call(c.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if not namespaced:  # an unprivileged uid already holds no capability, and cannot drop from the set
        return
    for cap in range(64):
        if c.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 1:  # EPERM: cannot drop
            _call(-1, f"drop capability {cap}")
    _no_unix_sockets()


# seccomp: socket(AF_UNIX, ...) fails with EACCES. A read-only mount does not stop connect() on a
# host socket file a program can name, and the network namespace stops only abstract sockets.
_AUDIT_ARCH = {"x86_64": (0xC000003E, 41), "aarch64": (0xC00000B7, 198)}  # arch id, socket() number
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _no_unix_sockets() -> None:
    arch = _AUDIT_ARCH.get(os.uname().machine)
    if arch is None:
        return
    ld, jeq, ret = 0x20, 0x15, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_RET|K
    allow, deny = 0x7FFF0000, 0x00050000 | 13  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EACCES
    prog = [
        (ld, 0, 0, 4),
        (jeq, 1, 0, arch[0]),
        (ret, 0, 0, allow),  # another arch: not filtered
        (ld, 0, 0, 0),
        (jeq, 0, 3, arch[1]),  # not socket(): allow
        (ld, 0, 0, 16),
        (jeq, 0, 1, 1),  # args[0] == AF_UNIX
        (ret, 0, 0, deny),
        (ret, 0, 0, allow),
    ]
    filters = (_SockFilter * len(prog))(*[_SockFilter(*f) for f in prog])
    fprog = _SockFprog(len(prog), filters)
    _call(libc().prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


def _await_and_mirror(pid: int) -> None:
    """The process outside the new PID namespace: wait for its PID 1, then end the same way."""
    os.closerange(0, 4096)  # nothing of the parent's (its exec-status pipe above all) stays open here
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            if sig not in (signal.SIGKILL, signal.SIGSTOP):
                signal.signal(sig, signal.SIG_DFL)
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            os.kill(os.getpid(), sig)
        finally:
            os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def die_with(parent: int) -> None:
    """SIGKILL when `parent` dies (set after any uid change, which clears it); gone already: exit now."""
    libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def preexec(
    workdir: str, limits: Limits, *, uid: Optional[int], nproc: int, namespaces: bool, cgroup_procs: list[str]
) -> Callable[[], None]:
    """The set-up the child runs between fork and exec (see the module docstring for the order's why)."""

    def setup() -> None:
        parent = os.getppid()
        for procs in cgroup_procs:
            with open(procs, "w") as f:
                f.write("0")
        if uid is not None:
            drop_to(uid)
        if namespaces:
            outer_uid, outer_gid = os.getuid(), os.getgid()
            _call(libc().unshare(NAMESPACES), "unshare")
            workdir_fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)  # before /tmp is covered
            Path("/proc/self/setgroups").write_text("deny")
            Path("/proc/self/uid_map").write_text(f"0 {outer_uid} 1")
            Path("/proc/self/gid_map").write_text(f"0 {outer_gid} 1")
            # Dies with the process that started it (a stopped job's killed work horse), so its PID 1,
            # and with it every process of the run, dies too.
            die_with(parent)
            pid = os.fork()
            if pid:
                _await_and_mirror(pid)
            libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            _filesystem(workdir_fd, limits)
            os.close(workdir_fd)
            libc().sethostname(b"sandbox", 7)
            os.chdir(RUN_DIR)
        else:
            die_with(parent)
            os.chdir(workdir)
        _rlimits(limits, nproc)
        _no_privileges(namespaces)

    return setup
