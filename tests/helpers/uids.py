"""The code sandbox's uids, seen from /proc: which processes run as one (tests/test_sandbox.py and
tests/test_sandbox_hostile.py check that a run leaves none behind)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from envs.sandbox import UID_BASE, UID_COUNT


def sandboxed(uid: int) -> bool:
    """Whether `uid` is one of the sandbox's."""
    return UID_BASE <= uid < UID_BASE + UID_COUNT


def process_uid(pid: int | str) -> Optional[int]:
    """The real uid of process `pid`; None once it is gone."""
    try:
        line = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("Uid:"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1])


def runs_sandboxed(pid: int | str, uids: Optional[list[int]] = None) -> bool:
    """Whether `pid` runs as a sandbox uid, or as one of `uids`."""
    uid = process_uid(pid)
    return uid is not None and (uid in uids if uids is not None else sandboxed(uid))


def sandbox_processes(uids: Optional[list[int]] = None) -> list[int]:
    """Live processes of any sandbox uid, or of `uids` (zombies included: they still hold a process
    slot). A test checks the uids its own runs leased: other tests of a parallel run may be running
    programs under other sandbox uids meanwhile."""
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and runs_sandboxed(e, uids)]
