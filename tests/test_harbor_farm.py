"""Harbor tasks through the farm: real `farm worker` processes, real sandboxes, the tasks' own tests.

The suite's oracle scores 1 and its nop 0 through the whole rollout path (rows, the task stream, a
sandbox per rollout started and removed, test.sh as the verifier, the settle); tasks that attack
their sandbox (a fork bomb, a disk fill, an agent that never stops and leaves a process writing)
end with their reason while the worker's other rollouts go on; a verifier that writes no reward
and a sandbox that cannot start are failures with a kind, never a 0; and no sandbox is left.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers.harbor import sandbox_owners, sandboxes_left
from helpers.processes import stop
from helpers.workers import spawn_worker

from envs.harbor.rows import suite_rows
from envs.harbor.task import SUITE_DIR
from farm.client import FarmClient

pytestmark = pytest.mark.slow

TOML = """\
schema_version = "1.4"
[metadata]
difficulty = "test"
[agent]
timeout_sec = {agent}
[verifier]
timeout_sec = {verifier}
[environment]
cpus = 1
memory_mb = 256
storage_mb = 64
network_mode = "no-network"
workdir = "/app"
{extra}
"""
# 1 when /app/ticks has lines and stops growing: nothing the agent started still runs.
STOPPED = (
    "mkdir -p /logs/verifier; a=$(wc -l < /app/ticks); sleep 1; b=$(wc -l < /app/ticks)\n"
    'if [ "$a" -gt 0 ] && [ "$a" = "$b" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n'
)
DOCKERFILE = "FROM rollout-farm/base:bookworm\nWORKDIR /app\n"
PASS_IF_DONE = (
    "mkdir -p /logs/verifier; if [ -f /app/done ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
)


def make_task(
    root: Path,
    name: str,
    solve: str,
    test: str = PASS_IF_DONE,
    agent: float = 20,
    verifier: float = 20,
    dockerfile: str | None = DOCKERFILE,
    extra: str = "",
) -> Path:
    task = root / name
    for sub in ("environment", "tests", "solution"):
        (task / sub).mkdir(parents=True)
    (task / "instruction.md").write_text(f"Task {name}.\n")
    (task / "task.toml").write_text(TOML.format(agent=agent, verifier=verifier, extra=extra))
    if dockerfile is not None:
        (task / "environment" / "Dockerfile").write_text(dockerfile)
    (task / "tests" / "test.sh").write_text("#!/bin/bash\n" + test)
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\n" + textwrap.dedent(solve))
    return task


def collect(settings, rows: list[dict], agent: str, backend: str, timeout_s: float = 240.0, concurrency: int = 4):
    """The rows through one real `farm worker --agent <agent>` process; its rollouts by task name."""
    proc = spawn_worker(settings, "--agent", agent, "--concurrency", str(concurrency), FARM_SANDBOX_BACKEND=backend)
    try:

        async def main():
            async with FarmClient(settings) as client:
                tasks = [client.task(run_id=f"harbor-{agent}", agent=agent, row=r) for r in rows]
                got = await client.run_batch(tasks, timeout_s=timeout_s)
            return {r["task_name"]: got[t.task_id] for r, t in zip(rows, tasks)}

        got = asyncio.run(main())
    finally:
        out = stop(proc, timeout=90)
    assert proc.returncode == 0, out
    return got, out


@pytest.mark.parametrize("agent,reward", [("harbor_oracle", 1.0), ("harbor_nop", 0.0)])
def test_every_task_of_the_suite_scores_1_with_its_oracle_and_0_with_nothing_done(settings, backend, agent, reward):
    """The project's suite is sound (its tests tell a solved task from an untouched one) and runs
    through the whole rollout path: rows, a real worker, a sandbox per rollout, test.sh, the settle."""
    rows = suite_rows(SUITE_DIR, agent=agent)
    got, _ = collect(settings, rows, agent, backend)
    assert len(got) == len(rows) >= 24
    failed = {name: r.error.message for name, r in got.items() if r.error is not None}
    assert {name: (r.status, r.reward) for name, r in got.items()} == {name: ("ok", reward) for name in got}, failed
    tiers = {r["task_name"]: r["tier"] for r in rows}
    assert all(r.metrics["tier"] == tiers[name] and r.metrics["task"] == name for name, r in got.items())
    assert sorted(set(tiers.values())) == ["tier1", "tier2", "tier3"]
    assert sandboxes_left(backend, settings.namespace) == []


# A fork bomb and a disk fill load the machine: beside the parallel run the bomb's verifier ran past its
# 20 s (a run of 73 s, 9 s alone), and the other tests' wall-clock bounds suffer from it.
@pytest.mark.quiet
def test_tasks_that_attack_their_sandbox_end_with_their_reason_and_the_others_go_on(settings, backend, tmp_path):
    """A fork bomb (pids limit), a disk fill (storage: the docker backend bounds memory and pids; the
    disk fill ends at the agent timeout or the disk), an agent that never returns and leaves a
    process writing (killed at the agent timeout, and before the tests run: the tests see the file
    stop growing), beside a task that simply passes: every one ends, each with its reason."""
    suite = tmp_path / "suite"
    make_task(suite, "plain", "touch /app/done\n")
    make_task(suite, "forkbomb", "bomb() { bomb | bomb & }; bomb\nsleep 2\ntouch /app/done\n", agent=8)
    make_task(
        suite, "diskfill", "dd if=/dev/zero of=/app/fill bs=1M count=3000 2>/dev/null\ntouch /app/done\n", agent=8
    )
    make_task(
        suite,
        "never-stops",
        "( while true; do date >> /app/ticks; sleep 0.1; done ) &\nsleep 100000\n",
        test=STOPPED,
        agent=3,
    )
    make_task(  # returns at once, leaving a writer in a session of its own: killed before the tests run
        suite,
        "escapes",
        "setsid bash -c 'while true; do date >> /app/ticks; sleep 0.1; done' >/dev/null 2>&1 < /dev/null &\nsleep 1\n",
        test=STOPPED,
    )
    rows = suite_rows(suite, agent="harbor_oracle")
    got, _ = collect(settings, rows, "harbor_oracle", backend, timeout_s=180)
    assert got["plain"].status == "ok" and got["plain"].reward == 1.0
    assert got["escapes"].status == "ok" and got["escapes"].reward == 1.0, got["escapes"]
    assert got["escapes"].metrics["oracle_timed_out"] is False
    # The agent's processes were killed at its timeout and before the tests ran: nothing kept writing.
    assert got["never-stops"].status == "ok" and got["never-stops"].reward == 1.0, got["never-stops"]
    assert got["never-stops"].metrics["oracle_timed_out"] is True
    assert got["forkbomb"].status == "ok" and got["forkbomb"].reward in (0.0, 1.0), got["forkbomb"].error
    # A full disk: graded if the tests still fit, else a verifier failure that says why (never a 0).
    fill = got["diskfill"]
    assert (fill.status == "ok" and fill.reward in (0.0, 1.0)) or (
        fill.error.kind == "verifier" and "No space left" in fill.error.message
    ), fill
    assert sandboxes_left(backend, settings.namespace) == []


def test_no_reward_file_and_a_sandbox_that_cannot_start_are_failures_never_a_zero(settings, backend, tmp_path):
    suite = tmp_path / "suite"
    make_task(suite, "no-reward", "touch /app/done\n", test="echo 'the checks crashed' >&2; exit 3\n")
    make_task(suite, "slow-tests", "touch /app/done\n", test="sleep 60\n", verifier=2)
    make_task(suite, "no-image", "true\n", dockerfile=None, extra='docker_image = "rollout-farm/absent:none"')
    make_task(suite, "no-build", "true\n", dockerfile=DOCKERFILE + "RUN exit 7\n")
    rows = suite_rows(suite, agent="harbor_oracle")
    got, out = collect(settings, rows, "harbor_oracle", backend, timeout_s=180)
    kinds = {name: (r.status, r.error.kind if r.error else None) for name, r in got.items()}
    assert kinds == {
        "no-reward": ("failed", "verifier"),
        "slow-tests": ("failed", "verifier"),
        "no-image": ("failed", "infrastructure"),
        "no-build": ("failed", "infrastructure"),
    }
    assert all(r.reward is None for r in got.values())
    assert "the checks crashed" in got["no-reward"].error.message
    assert "ran past 2s" in got["slow-tests"].error.message
    assert "2 tries" in got["no-image"].error.message
    assert sandboxes_left(backend, settings.namespace) == []


def test_a_worker_without_a_docker_daemon_says_so_in_one_line_and_exits_3(settings):
    proc = spawn_worker(
        settings, "--agent", "harbor_oracle", FARM_SANDBOX_BACKEND="docker", DOCKER_HOST="unix:///nonexistent.sock"
    )
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        stop(proc)
        raise AssertionError("the worker did not stop on its own without a daemon") from None
    assert proc.returncode == 3, out
    assert "docker" in out and "Traceback" not in out
    lines = [line for line in out.splitlines() if "docker" in line]
    assert len(lines) == 1 and "daemon" in lines[0], out


def test_data_generate_build_names_a_dockerfile_that_does_not_build_in_one_line(backend, tmp_path):
    suite = tmp_path / "suite"
    make_task(suite, "good", "true\n")
    make_task(suite, "bad-build", "true\n", dockerfile=DOCKERFILE + "RUN echo broken && exit 7\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "farm",
            "data",
            "generate",
            "harbor",
            "--tasks",
            str(suite),
            "-o",
            str(tmp_path / "r.jsonl"),
            "--build",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, FARM_SANDBOX_BACKEND=backend),
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    named = [line for line in done.stderr.splitlines() if line.startswith("farm: ")]
    assert len(named) == 2 and "bad-build" in named[0] and "does not build" in named[0], done.stderr
    assert "Traceback" not in done.stderr


def test_a_stopped_worker_removes_the_sandboxes_of_the_rollouts_it_stops(settings, backend, tmp_path):
    """SIGTERM: the worker waits out its grace period, cancels what still runs, and every cancelled
    rollout's sandbox is removed before the worker exits (not left for the sweeper or its lifetime)."""
    suite = tmp_path / "suite"
    for i in range(3):
        make_task(suite, f"long-{i}", "sleep 600\n", agent=300)
    rows = suite_rows(suite, agent="harbor_oracle")
    proc = spawn_worker(settings, "--agent", "harbor_oracle", "--concurrency", "4", FARM_SANDBOX_BACKEND=backend)
    try:

        async def submit():
            async with FarmClient(settings) as client:
                await client.submit([client.task(run_id="long", agent="harbor_oracle", row=r) for r in rows])

        asyncio.run(submit())
        deadline = time.monotonic() + 60
        while len(sandbox_owners(backend, settings.namespace)) < 3:
            assert time.monotonic() < deadline and proc.poll() is None, "the sandboxes never started"
            time.sleep(0.2)
    finally:
        out = stop(proc, timeout=60)
    assert sandboxes_left(backend, settings.namespace) == [], out
    assert "closing" not in out, out
