"""The policy path at scale and under model faults, with real worker processes and real Redis.

The policy is workers/policy/stub: an OpenAI-compatible server answering the
single_tool_call environment's two turns (a Hermes tool call, then an answer) with token ids
after a fixed latency, in a process of its own. Stopping that process is a full outage of
the replica (every connection drops, new ones are refused); starting it again on the same
port is its recovery. These check liveness and that nothing is lost or falsely failed; they
assert no speed (bench/concurrency.py measures that).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest
import redis
from helpers import ROOT
from helpers.processes import error_line, stop
from helpers.workers import spawn_worker, worker_env

from farm.client import FarmClient
from farm.keys import GROUP
from workers.policy.stub import StubProcess
from workers.policy.stub import weather_rows as rows
from workers.policy.stub import weather_script as script_for
from workers.supervise.stack import policy_env

pytestmark = pytest.mark.slow
AGENT = "single_tool_call"


@pytest.fixture
def stub(tokenizer, tmp_path):
    server = StubProcess(script_for(tokenizer), latency_s=0.5, workdir=tmp_path).start()
    yield server
    server.stop()


def worker(settings, stub, model_dir, concurrency: int, **env: str):
    return spawn_worker(
        settings,
        "--agent",
        AGENT,
        "--concurrency",
        str(concurrency),
        **policy_env(stub.url, "stub", model_dir),
        **env,
    )


def drive(proc, main) -> tuple:
    """Run the test's client coroutine against a worker process, then stop it: (result, worker output)."""
    try:
        result = asyncio.run(main())
    finally:
        out = stop(proc, timeout=60)
    assert proc.returncode == 0, out[-3000:]
    return result, out


def group_info(settings) -> dict:
    r = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    try:
        for g in r.xinfo_groups(settings.keys.tasks(AGENT)):
            if g["name"] == GROUP:
                return g
    finally:
        r.close()
    return {}


def not_taken(settings) -> int:
    """Tasks no worker has taken: queued per run (farm.fairness) or unread in the stream."""
    r = redis.Redis.from_url(settings.redis_url)
    try:
        return int(r.llen(settings.keys.backlog(AGENT))) + int(group_info(settings).get("lag") or 0)
    finally:
        r.close()


def test_one_worker_with_1024_loops_completes_every_task(settings, stub, model_dir):
    """Would have caught the livelock: the httpx pool spent all CPU assigning connections."""
    proc = worker(settings, stub, model_dir, 1024)
    n = 3 * 1024

    async def main():
        client = FarmClient(settings)
        tasks = [client.task(run_id="live", agent=AGENT, row=r) for r in rows(n)]
        try:
            return await client.run_batch(tasks, timeout_s=600)  # ideal: ~3 s; a liveness check, not a timing one
        finally:
            await client.aclose()

    got, _ = drive(proc, main)
    assert len(got) == n
    failed = [r.error for r in got.values() if not r.ok]
    assert not failed, failed[:3]
    assert all(r.reward == 1.0 and r.metrics["tool_calls"] == 1 for r in got.values())


def test_a_60s_outage_of_every_replica_loses_and_fails_nothing(settings, stub, model_dir):
    proc = worker(settings, stub, model_dir, 64)
    n = 600

    async def main():
        client = FarmClient(settings)
        tasks = [client.task(run_id="outage", agent=AGENT, row=r) for r in rows(n)]
        await client.submit(tasks)
        got = await client.collect(tasks[:100], timeout_s=120)
        stub.stop()
        await asyncio.sleep(5)
        read_early = group_info(settings)["entries-read"]
        await asyncio.sleep(55)
        during = {**group_info(settings), "not_taken": not_taken(settings)}
        stub.start()
        got |= await client.collect(tasks[100:], timeout_s=300)
        await client.aclose()
        return tasks, got, read_early, during

    (tasks, got, read_early, during), out = drive(proc, main)
    assert during["entries-read"] == read_early, "the worker kept fetching tasks while no replica answered"
    assert during["pending"] <= 64 and during["not_taken"] > 0
    assert "out of rotation" in out and "back in rotation" in out
    assert sorted(got) == sorted(t.task_id for t in tasks)
    failed = [r.error for r in got.values() if not r.ok]
    assert not failed, failed[:3]
    assert all(r.attempt == 1 for r in got.values()), "the outage cost no task attempt"


def test_a_permanent_outage_ends_in_policy_failures_and_fetching_pauses(settings, stub, model_dir):
    stub.stop()
    proc = worker(settings, stub, model_dir, 8, FARM_POLICY_RETRY_BUDGET_S="4")

    async def main():
        client = FarmClient(settings)
        first = [client.task(run_id="down", agent=AGENT, row=r) for r in rows(8)]
        await client.submit(first)
        start = time.monotonic()
        failed = await client.collect(first, timeout_s=120)
        took = time.monotonic() - start
        # No replica can take work now: new tasks stay queued instead of failing.
        later = [client.task(run_id="down", agent=AGENT, row=r) for r in rows(8)]
        await client.submit(later)
        await asyncio.sleep(3)
        waiting = {**group_info(settings), "not_taken": not_taken(settings)}
        stub.start()
        done = await client.collect(later, timeout_s=120)
        await client.aclose()
        return failed, took, waiting, done

    (failed, took, waiting, done), _ = drive(proc, main)
    assert len(failed) == 8 and all(not r.ok for r in failed.values())
    assert {r.error.kind for r in failed.values()} == {"policy"}
    assert all("4s retry budget" in r.error.message for r in failed.values()), failed
    assert took < 60
    assert waiting["not_taken"] == 8 and waiting["pending"] == 0, waiting
    assert len(done) == 8 and all(r.ok for r in done.values()), [r.error for r in done.values()]


def test_a_concurrency_the_open_file_limit_cannot_carry_is_refused(settings, model_dir, tmp_path):
    env = worker_env(
        settings, FARM_POLICY_URLS="http://127.0.0.1:9", FARM_POLICY_MODEL="stub", FARM_POLICY_TOKENIZER=str(model_dir)
    )
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (512, 2048)); "
        "from farm.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, "worker", "--agent", AGENT, "--concurrency", "4096"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    line = error_line(out.stderr)
    assert "4352 open files" in line and "2048" in line, out.stderr
    assert "Traceback" not in out.stderr


def test_the_soft_open_file_limit_is_raised_to_the_hard_one():
    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (512, 4096)); "
        "from workers.delivery.chores import raise_open_files; print(raise_open_files(1024), "
        "resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["4096", "4096"]


def test_worker_heartbeat_reports_fetch_pauses(settings, stub, model_dir):
    stub.stop()
    proc = worker(settings, stub, model_dir, 4, FARM_POLICY_RETRY_BUDGET_S="2")
    try:

        async def main():
            client = FarmClient(settings)
            tasks = [client.task(run_id="hb", agent=AGENT, row=r) for r in rows(4)]
            await client.submit(tasks)
            await client.collect(tasks, timeout_s=60)
            await client.aclose()

        asyncio.run(main())
        r = redis.Redis.from_url(settings.redis_url)
        deadline = time.monotonic() + 20
        beat: dict = {}
        while time.monotonic() < deadline and not beat.get("fetch_paused"):
            keys = list(r.scan_iter(match=settings.keys.worker_pattern()))
            beat = json.loads(r.get(keys[0])) if keys else {}
            time.sleep(0.2)
        r.close()
    finally:
        stop(proc, timeout=60)
    assert beat.get("fetch_paused", 0) >= 1, beat
