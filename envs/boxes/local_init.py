"""PID 1 of a `local` sandbox: builds its world, then waits out the lifetime and reaps orphans.

Run by the backend as `python -S -I local_init.py` (a fresh interpreter, standard library only:
it starts in ~20 ms and imports nothing of the farm, whose modules could not be reached after
pivot_root anyway), as root, with its configuration as JSON on stdin. It:

1. joins the sandbox's cgroups (so it and everything below it is limited from the first fork);
2. unshares mount, PID, IPC, UTS (and network, unless the spec wants the host's) namespaces and
   forks: the child is PID 1 of the new PID namespace; the parent prints `pid <host pid>` and exits;
3. in the child: every mount private; a tmpfs of `disk_mb` (or, for image builds, a host
   directory) holding the overlay's upper and work dirs; the overlay of the image's layers over the
   base tree; the spec's `mounts` (host directories bound read-only); /proc, a minimal /dev (null
   zero full random urandom tty bound from the host, /dev/shm, the fd links); /etc/hosts (and
   /etc/resolv.conf with the host network); hostname `sandbox`; loopback up; then pivot_root into
   the overlay and the old root detached, so nothing of the host's filesystem is reachable by path;
4. prints `ready` (or `error <why>`), points its stdio at /dev/null, and loops: reap every child
   that ends (orphans come here), exit at the lifetime's end or on SIGTERM. When it exits the
   kernel kills every process in the PID namespace, and the mount namespace (overlay, tmpfs and
   all) goes with the last of them: nothing is left mounted on the host.

PID 1 is shielded from the memory cgroup's OOM killer (oom_score_adj -1000) where root holds
CAP_SYS_RESOURCE; elsewhere it is the smallest process (~9 MB), which the OOM killer, choosing the
largest, leaves for last.
"""

import ctypes
import fcntl
import json
import os
import signal
import socket
import struct
import sys
import time

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tsandbox\n"

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src, target, fstype, flags, data=None):
    enc = [None if v is None else v.encode() for v in (src, target, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], flags, enc[3]), f"mount {target}")


def _dev(root):
    dev = f"{root}/dev"
    _mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=65536k,mode=755")
    for name in DEVICES:
        open(f"{dev}/{name}", "w").close()
        _mount(f"/dev/{name}", f"{dev}/{name}", None, MS_BIND)
    os.mkdir(f"{dev}/shm", 0o1777)
    os.chmod(f"{dev}/shm", 0o1777)
    os.mkdir(f"{dev}/pts")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1")):
        os.symlink(target, f"{dev}/{name}")
    os.symlink("/proc/self/fd/2", f"{dev}/stderr")


def _write_etc(root, name, text):
    path = f"{root}/etc/{name}"
    if os.path.islink(path) or (os.path.lexists(path) and not os.path.isfile(path)):
        os.unlink(path)
    with open(path, "w") as f:
        f.write(text)


def _loopback_up():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, 0x8914, struct.pack("16sH14x", b"lo", 0x1 | 0x8 | 0x40))  # SIOCSIFFLAGS: UP|LOOPBACK|RUNNING


def _world(cfg):
    """Steps 3's mounts, in the child that is PID 1."""
    scratch = cfg["scratch"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    if cfg.get("upper"):
        upper, work = cfg["upper"], cfg["work"]
    else:
        _mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, f"size={int(cfg['disk_mb'])}m,mode=700")
        upper, work = f"{scratch}/upper", f"{scratch}/work"
        os.mkdir(upper, 0o755)
        os.mkdir(work, 0o700)
    root = f"{scratch}/root"
    os.makedirs(root, exist_ok=True)
    lower = ":".join(cfg["lowerdirs"])
    _mount("overlay", root, "overlay", MS_NODEV, f"lowerdir={lower},upperdir={upper},workdir={work}")
    for d in ("proc", "dev", "tmp", "etc"):
        os.makedirs(f"{root}/{d}", exist_ok=True)
    _mount("proc", f"{root}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _dev(root)
    for src, dest in cfg.get("mounts") or ():  # host directories the spec binds in (before the pivot)
        target = f"{root}/{dest.strip('/')}"
        os.makedirs(target, exist_ok=True)
        _mount(src, target, None, MS_BIND)
        _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    _write_etc(root, "hosts", HOSTS)
    _write_etc(root, "hostname", "sandbox\n")
    if cfg["network"]:
        try:
            with open("/etc/resolv.conf") as f:
                _write_etc(root, "resolv.conf", f.read())
        except OSError:
            pass
    else:
        _loopback_up()
    _check(_libc.sethostname(b"sandbox", 7), "sethostname")
    os.chdir(root)
    _check(_libc.syscall(SYS_PIVOT_ROOT[os.uname().machine], b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "detach the old root")
    os.chdir("/")


def _serve(deadline):
    """Reap every child until the deadline or SIGTERM; then return (and PID 1 exits)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT})
    while True:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        left = deadline - time.monotonic()
        if left <= 0:
            return
        info = signal.sigtimedwait({signal.SIGCHLD, signal.SIGTERM, signal.SIGINT}, min(left, 5.0))
        if info is not None and info.si_signo != signal.SIGCHLD:
            return


def main():
    cfg = json.loads(sys.stdin.read())
    deadline = time.monotonic() + float(cfg["lifetime_s"])
    for procs in cfg["cgroup_procs"]:
        with open(procs, "w") as f:
            f.write("0")
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | (0 if cfg["network"] else CLONE_NEWNET)
    _check(_libc.unshare(flags), "unshare")
    pid = os.fork()
    if pid:
        print(f"pid {pid}", flush=True)
        os._exit(0)
    try:
        os.setsid()
        try:  # lowering it needs CAP_SYS_RESOURCE, which some hosts' root lacks
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("-1000")
        except PermissionError:
            pass
        _world(cfg)
    except BaseException as exc:  # one line back to the backend, whatever went wrong
        print(f"error {' '.join(str(exc).split())}", flush=True)
        os._exit(1)
    print("ready", flush=True)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, 65536)
    _serve(deadline)
    os._exit(0)


if __name__ == "__main__":
    main()
