"""The cgroups of one `local` sandbox: its limits, and the handle that finds and kills its processes.

A sandbox gets `<hierarchy>/rollout-farm/<id>` in each of memory, pids and cpu (cgroups v1, as
envs.sandbox.cgroups lays them out), or one directory on a pure cgroup v2 host, with memory
(memory_mb, no swap), pids (pids) and CPU (cpus as a CFS quota) limits. PID 1 and every exec
join it before they fork anything.

Each exec also gets a child group `x-<n>` in the *tracking* hierarchy (pids on v1, the one tree
on v2): the pids limit is hierarchical, so it still counts against the sandbox, and the group
holds every process that exec started, whatever it did to its session or process group (no
process in a sandbox can move itself: no cgroupfs is mounted there and CAP_SYS_ADMIN is out of
its bounding set). Killing an exec is "SIGKILL every pid in its group until the group is empty".

All of it is plain paths, so another process (the sweeper) rebuilds the handle from the sandbox's
metadata file and removes it the same way.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Iterable, Optional

from envs.sandbox.cgroups import CGROUP

PARENT = "rollout-farm"
CONTROLLERS = ("memory", "pids", "cpu")
PERIOD_US = 100_000


def _v2() -> bool:
    return (CGROUP / "cgroup.controllers").exists()


def _limits(flavour: str, cpus: float, memory_mb: int, pids: int) -> dict[str, str]:
    mem, quota = str(memory_mb * 2**20), str(max(1000, int(cpus * PERIOD_US)))
    return {
        "v2": {"memory.max": mem, "memory.swap.max": "0", "pids.max": str(pids), "cpu.max": f"{quota} {PERIOD_US}"},
        "memory": {"memory.limit_in_bytes": mem, "memory.memsw.limit_in_bytes": mem},
        "pids": {"pids.max": str(pids)},
        "cpu": {"cpu.cfs_period_us": str(PERIOD_US), "cpu.cfs_quota_us": quota},
    }[flavour]


def _enable_v2_controllers(parent: Path) -> None:
    for d in (parent.parent, parent):
        try:
            (d / "cgroup.subtree_control").write_text("+memory +pids +cpu")
        except OSError:
            pass


class SandboxCgroup:
    """The cgroup directories of one sandbox; `track` is the one that exec groups live under."""

    def __init__(self, dirs: list[Path], track: Path):
        self.dirs = dirs
        self.track = track
        self._next = 0

    @classmethod
    def create(cls, sandbox_id: str, cpus: float, memory_mb: int, pids: int) -> "SandboxCgroup":
        if _v2():
            bases = [(CGROUP / PARENT, "v2")]
            (CGROUP / PARENT).mkdir(exist_ok=True)
            _enable_v2_controllers(CGROUP / PARENT)
        else:
            bases = [(CGROUP / c / PARENT, c) for c in CONTROLLERS if (CGROUP / c / "cgroup.procs").exists()]
        made: list[Path] = []
        try:
            for base, flavour in bases:
                base.mkdir(exist_ok=True)
                d = base / sandbox_id
                d.mkdir()
                made.append(d)
                for name, value in _limits(flavour, cpus, memory_mb, pids).items():
                    if (d / name).exists():
                        (d / name).write_text(value)
        except OSError:
            SandboxCgroup(made, made[0] if made else Path("/nonexistent")).remove()
            raise
        track = next((d for d in made if "pids" in d.parts), made[0])
        return cls(made, track)

    @property
    def procs(self) -> list[str]:
        """The cgroup.procs files PID 1 writes itself into."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def exec_group(self) -> tuple[Path, list[str]]:
        """A fresh tracking group for one exec, and the cgroup.procs files its process joins."""
        self._next += 1
        group = self.track / f"x-{os.getpid()}-{self._next}"
        group.mkdir()
        return group, [str(d / "cgroup.procs") for d in self.dirs if d != self.track] + [str(group / "cgroup.procs")]

    def pids(self, under: Optional[Path] = None) -> list[int]:
        """Every process in the sandbox (or in one exec group), its sub-groups included."""
        out: list[int] = []
        for root, _dirs, _files in os.walk(under or self.track):
            try:
                out += [int(p) for p in Path(root, "cgroup.procs").read_text().split()]
            except (OSError, ValueError):
                continue
        return out

    def holds(self, pid: int) -> bool:
        """Whether `pid` is in the sandbox's own group (PID 1 is; a reused pid is not)."""
        try:
            return str(pid) in (self.track / "cgroup.procs").read_text().split()
        except OSError:
            return False

    def kill(self, under: Optional[Path] = None, spare: Iterable[int] = (), tries: int = 500) -> bool:
        """SIGKILL every process in the group (but `spare`) until none is left; False if some outlived it."""
        keep = set(spare)
        for _ in range(tries):
            victims = [p for p in self.pids(under) if p not in keep]
            if not victims:
                return True
            for pid in victims:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.005)
        return False

    def drop_group(self, group: Path) -> None:
        try:
            group.rmdir()
        except OSError:
            pass

    def memory_bytes(self) -> Optional[int]:
        for d in self.dirs:
            for name in ("memory.current", "memory.usage_in_bytes"):
                if (d / name).exists():
                    return int((d / name).read_text())
        return None

    def remove(self) -> None:
        """Kill everything, then remove every group, exec groups first; no error when gone."""
        if self.dirs:
            self.kill()
        for d in self.dirs:
            for _ in range(200):
                try:
                    for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                        sub.rmdir()
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # a process still dying
                    self.kill()
                    time.sleep(0.01)
        self.dirs = []
