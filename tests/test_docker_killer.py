"""The docker backend's killer (`envs.boxes.docker_scripts.KILL`) runs inside a sandbox that a fork
bomb may hold at its pids limit, so it must never fork: dash ends with status 2 when a fork fails,
whatever the command's redirections. (A `sleep` between its scans did: the Harbor suite's fork-bomb
task then failed its tests now and then, "could not end its processes", 5 runs in 31.)

Here the killer runs on this machine in a pids cgroup that allows no fork at all (pids.max = 1:
itself) and ends a session outside it; it needs root and cgroups' pids controller, as the local
sandbox backend does."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from envs.boxes.docker_scripts import KILL
from envs.sandbox.cgroups import CGROUP

pytestmark = pytest.mark.slow


def no_fork_cgroup() -> Path:
    """A new pids cgroup (v1 or v2) that holds at most one process."""
    v2 = (CGROUP / "cgroup.controllers").exists()
    parent = CGROUP if v2 else CGROUP / "pids"
    if os.geteuid() != 0:
        reason = "a pids cgroup needs root"
    elif not (parent / "cgroup.procs").exists() or (v2 and "pids" not in (CGROUP / "cgroup.controllers").read_text()):
        reason = "no pids cgroup controller on this machine"
    else:
        if v2:
            (CGROUP / "cgroup.subtree_control").write_text("+pids")
        group = parent / f"farm-test-{uuid.uuid4().hex[:8]}"
        group.mkdir()
        (group / "pids.max").write_text("1")
        return group
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    print(f"SKIP: {reason}")
    pytest.skip(reason)


def test_the_killer_ends_a_session_where_no_process_can_fork():
    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)  # a session: its sid is its pid
    group = no_fork_cgroup()
    try:
        # The wrapper moves itself into the group (echo and > are the shell's own), then becomes the
        # killer (exec: no fork): every fork the killer tried would fail.
        wrapper = f'echo $$ > {group}/cgroup.procs && exec sh -c "$1" farm-kill {victim.pid} 0'
        done = subprocess.run(["sh", "-c", wrapper, "wrapper", KILL], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, f"the killer exited {done.returncode}: {done.stderr.strip()}"
        assert victim.wait(timeout=5) == -9
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
        group.rmdir()
