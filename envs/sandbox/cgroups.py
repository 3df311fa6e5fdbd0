"""Per-run cgroups of the sandbox: memory, pids and one CPU, on cgroups v2 or v1's controllers.

A run gets its cgroups where this process may make them: as root, or in a subtree delegated to
the sandbox worker's uid before it dropped root (delegate_cgroups). Where neither holds, a run
goes on without them and records that (`isolation["cgroup"]`).
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Optional

from envs.sandbox.result import Limits

CGROUP = Path("/sys/fs/cgroup")
DELEGATED = "FARM_SANDBOX_CGROUP"  # set by a worker that was given a cgroup subtree before dropping root


def _cgroup_bases() -> list[tuple[Path, str]]:
    """(directory to create run cgroups in, flavour) for each controller hierarchy we may use."""
    delegated = os.environ.get(DELEGATED, "")
    if (CGROUP / "cgroup.controllers").exists():
        return [(CGROUP / (delegated or "farm-sandbox"), "v2")]
    return [
        (CGROUP / c / (delegated or "farm-sandbox"), c)
        for c in ("memory", "pids", "cpu")
        if (CGROUP / c / "cgroup.procs").exists()
    ]


def _limits_for(flavour: str, limits: Limits, nproc: int) -> dict[str, str]:
    mem = str(limits.memory_mb * 2**20)
    return {
        "v2": {"memory.max": mem, "pids.max": str(nproc), "cpu.max": "100000 100000"},
        "memory": {"memory.limit_in_bytes": mem},
        "pids": {"pids.max": str(nproc)},
        "cpu": {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "100000"},
    }[flavour]


class RunCgroup:
    """One run's cgroups (memory, pids, one CPU); empty when this process may not make them."""

    def __init__(self, limits: Limits, nproc: int):
        self.dirs: list[Path] = []
        name = f"run-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            for base, flavour in _cgroup_bases():
                base.mkdir(exist_ok=True)
                d = base / name
                d.mkdir()
                self.dirs.append(d)
                for file, value in _limits_for(flavour, limits, nproc).items():
                    (d / file).write_text(value)
        except OSError:
            self.remove()

    @property
    def procs(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def remove(self) -> None:
        for d in self.dirs:
            for _ in range(100):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # still holds a dying process
                    time.sleep(0.01)
        self.dirs = []


def delegate_cgroups(uid: int) -> Optional[str]:
    """As root, before a worker drops to `uid`: give it a cgroup subtree it can make run cgroups in."""
    name = f"farm-sandbox/worker-{uid}"
    made = False
    for base, _flavour in _cgroup_bases():
        d = base / f"worker-{uid}"
        try:
            d.mkdir(parents=True, exist_ok=True)
            for p in (d, *(d / f for f in ("cgroup.procs", "tasks", "cgroup.subtree_control") if (d / f).exists())):
                os.chown(p, uid, uid)
            made = True
        except OSError:
            return None
    return name if made else None
