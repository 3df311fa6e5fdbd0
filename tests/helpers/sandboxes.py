"""Shared by the `local` sandbox tests: the base tree (built once if absent), and what a removed
sandbox must not leave behind.

The base tree is the real one under the data dir (`farm sandbox base` builds the same): building
it takes about a minute from the machine's apt mirror, once; later sessions find it. The local
backend needs root (namespaces, cgroups, overlay): without root the tests skip, except under
CI=true, where that is a failure (as a missing binary is: helpers.processes.need_binary).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest

from envs.boxes.base import BaseTree, build_base, load_base
from helpers.processes import need_binary


def need_root() -> None:
    if os.geteuid() == 0:
        return
    reason = "the local sandbox backend needs root (namespaces, cgroups, overlay mounts)"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def data_dir() -> Path:
    from farm.settings import load_settings

    return load_settings().data_path


@functools.lru_cache(maxsize=None)
def _built(path: Path) -> BaseTree:
    return build_base(path, progress=lambda line: print(line, flush=True))


def base_tree() -> BaseTree:
    """The real base tree, built (minutes, once) when it is absent."""
    need_root()
    found = load_base(data_dir())
    if found is not None:
        return found
    need_binary("debootstrap", "debootstrap")
    return _built(data_dir())


def leftovers(meta: Path, scratch_root: Path, sandbox_id: str, pid: int, cgroups: list[str]) -> list[str]:
    """What of a removed sandbox is still there (empty: nothing)."""
    left = []
    if Path(f"/proc/{pid}").exists() and f"/{sandbox_id}" in Path(f"/proc/{pid}/cgroup").read_text():
        left.append(f"PID 1 ({pid})")
    left += [f"cgroup {d}" for d in cgroups if Path(d).exists()]
    if (scratch_root / sandbox_id).exists():
        left.append(f"scratch {scratch_root / sandbox_id}")
    if meta.exists():
        left.append(f"metadata {meta}")
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if sandbox_id in line]
    left += [f"mount {line.split()[4]}" for line in mounts]
    return left


def metadata(meta: Path) -> dict:
    return json.loads(meta.read_text())
