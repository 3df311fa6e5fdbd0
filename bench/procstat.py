"""What a benchmark reads about its processes from /proc: CPU, peak RSS, open sockets, children;
and py-spy profiles of them.

Sockets are counted from /proc/PID/fd (links to `socket:[inode]`): every TCP connection a
worker holds to the policy or to Redis, and its listeners. A sampler thread reads them once a
second while a round runs and keeps each process's peak, since the count falls as a round ends.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of the process (its threads included), 0.0 once it is gone."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(f[11]) + int(f[12])) / TICK


def peak_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def sockets(pid: int) -> int:
    """How many of the process's descriptors are sockets."""
    n = 0
    try:
        for fd in os.scandir(f"/proc/{pid}/fd"):
            try:
                n += os.readlink(fd.path).startswith("socket:")
            except OSError:
                pass
    except OSError:
        pass
    return n


def children(pid: int) -> list[int]:
    """The process's direct children (a `farm worker --processes P` supervisor's P workers)."""
    out: list[int] = []
    try:
        for task in os.scandir(f"/proc/{pid}/task"):
            out += [int(x) for x in Path(task.path, "children").read_text().split()]
    except OSError:
        pass
    return out


def redis_pid(port: int) -> int | None:
    """The pid of the redis-server listening on `port` on this machine, if it can be seen."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\x00", b" ").decode(errors="replace")
        except OSError:
            continue
        if "redis-server" in cmd and f":{port}" in cmd:
            return int(proc.name)
    return None


class SocketPeaks:
    """A thread that samples the sockets of `pids` every `every_s` and keeps each one's peak."""

    def __init__(self, pids: list[int], every_s: float = 1.0):
        self.pids, self.every_s = list(pids), every_s
        self.peak: Counter = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            for pid in self.pids:
                self.peak[pid] = max(self.peak[pid], sockets(pid))

    def __enter__(self) -> "SocketPeaks":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


class Profiles:
    """py-spy (from this interpreter's bin/ or PATH) recording each of `pids` for `seconds` after
    `delay_s` (past the first wave's connection set-up, to see the steady state), as collapsed
    stacks in out_dir/<label>-<pid>.txt; nothing when py-spy is not installed."""

    def __init__(
        self, pids: list[int], seconds: float, out_dir: Path, label: str, delay_s: float = 0.0, rate: int = 100
    ):
        exe = Path(sys.executable).with_name("py-spy")
        self.exe = str(exe) if exe.exists() else shutil.which("py-spy")
        self.pids, self.seconds, self.out_dir, self.label, self.rate = pids, seconds, out_dir, label, rate
        self.delay_s = delay_s
        self.procs: list[subprocess.Popen] = []
        self.paths: list[Path] = []

    def __enter__(self) -> "Profiles":
        if not self.exe or self.seconds <= 0:
            return self
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for pid in self.pids:
            path = self.out_dir / f"{self.label}-{pid}.txt"
            cmd = [self.exe, "record", "--pid", str(pid), "--duration", str(int(self.seconds))]
            cmd += ["--rate", str(self.rate), "--format", "raw", "--nonblocking", "--output", str(path)]
            line = f"sleep {self.delay_s:.1f}; exec " + " ".join(cmd)
            self.procs.append(
                subprocess.Popen(["sh", "-c", line], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
            self.paths.append(path)
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            try:
                p.wait(self.delay_s + self.seconds + 30)
            except subprocess.TimeoutExpired:
                p.terminate()
                p.wait()
