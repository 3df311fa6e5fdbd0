"""Cancellation end to end (farm/cancel.py): a queued task never runs, a running one stops at once,
each ends in exactly one `cancelled` rollout, against a real Redis and real worker processes.

What is checked beyond the rollouts: the agent's stats hash (cancelled counted per agent),
nothing left pending in the consumer group, no dead letters, no open-task records left, and the
worker still serving new work afterwards.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time

import pytest
import redis
from helpers import ROOT
from helpers.processes import stop
from helpers.redis import make_settings
from helpers.waiting import async_wait_for, wait_for
from helpers.workers import in_process_worker, spawn_worker, worker_env

from farm.client import FarmClient
from farm.errors import ConfigError
from farm.keys import GROUP
from farm.schema import ErrorKind, Status
from workers.policy.stub import StubProcess
from workers.policy.stub import weather_rows as stub_rows
from workers.policy.stub import weather_script as script_for
from workers.supervise import stack


def noop_row(i: int, sleep_s: float = 0.0) -> dict:
    return {"noop": {"sleep_s": sleep_s, "reward": 1.0}, "i": i}


def settled_cleanly(r: redis.Redis, settings, agent: str) -> dict:
    """The agent's stats, once nothing is pending, nothing dead-lettered and no open record is left."""
    keys = settings.keys
    assert r.xpending(keys.tasks(agent), GROUP)["pending"] == 0
    assert r.xlen(keys.dead(agent)) == 0
    assert r.zcard(keys.open_tasks()) == 0, r.zrange(keys.open_tasks(), 0, 5)
    assert r.hlen(keys.open_runs()) == 0, r.hgetall(keys.open_runs())
    return {k.decode(): int(v) for k, v in r.hgetall(keys.stats(agent)).items()}


async def test_a_task_cancelled_while_queued_never_runs_and_ends_cancelled(settings, sync_redis):
    """Cancelled before any worker was up (so the worker reads the cancel from Redis, not from
    the channel): the cancelled tasks would sleep 60 s if they ran; they all end at once."""
    client = FarmClient(settings)
    slow = [client.task(run_id="r1", agent="noop", row=noop_row(i, sleep_s=60)) for i in range(10)]
    quick = [client.task(run_id="r1", agent="noop", row=noop_row(i)) for i in range(10)]
    await client.submit(slow + quick)
    report = await client.cancel(slow)
    assert sorted(report.open) == sorted(t.task_id for t in slow) and report.not_open == []
    assert report.line() == "cancelled 10 queued or running tasks"
    t0 = time.monotonic()
    async with in_process_worker(settings, concurrency=8) as w:
        got = await client.collect(slow + quick, timeout_s=20)
    took = time.monotonic() - t0
    await client.aclose()
    assert took < 10, f"{took:.1f}s: a cancelled task ran"
    for t in slow:
        r = got[t.task_id]
        assert r.status is Status.cancelled and r.error.kind is ErrorKind.cancelled, r
        assert r.error.message == "cancelled before it started"
        assert not r.ok
    assert all(got[t.task_id].status is Status.ok for t in quick)
    assert w.counters["cancelled"] == 10 and w.counters["done"] == 10
    stats = settled_cleanly(sync_redis, settings, "noop")
    assert stats["cancelled"] == 10 and stats["done"] == 10 and "retried" not in stats


async def test_tasks_cancelled_in_flight_stop_at_once_and_the_worker_goes_on(settings, sync_redis):
    """A run's 16 tasks all running (each would take 60 s): cancel_run ends every one as
    `cancelled` within a second or two; the worker then serves another run's tasks."""
    client = FarmClient(settings)
    tasks = [client.task(run_id="big", agent="noop", row=noop_row(i, sleep_s=60)) for i in range(16)]
    async with in_process_worker(settings, concurrency=16) as w:
        await client.submit(tasks)
        await async_wait_for(lambda: len(w.inflight) == 16, what="16 tasks in flight")
        t0 = time.monotonic()
        report = await client.cancel_run("big")
        assert report.open_count == 16 and report.run_known
        got = await client.collect(tasks, timeout_s=10)
        took = time.monotonic() - t0
        assert took < 2.0, f"cancelled rollouts took {took:.2f}s"
        assert {r.status for r in got.values()} == {Status.cancelled}
        assert all(r.error.message.startswith("cancelled after ") for r in got.values())
        assert w.outcomes.stopped == 16 and not w.outcomes.running
        after = [client.task(run_id="next", agent="noop", row=noop_row(i)) for i in range(5)]
        again = await client.run_batch(after, timeout_s=10)
        assert {r.status for r in again.values()} == {Status.ok}
    await client.aclose()
    stats = settled_cleanly(sync_redis, settings, "noop")
    assert stats["cancelled"] == 16 and stats["done"] == 5


async def test_a_task_submitted_to_a_cancelled_run_is_cancelled_too(settings, sync_redis):
    """A run's cancel holds for cancel_ttl_s: a task submitted to it afterwards (a producer that
    had not heard yet) ends `cancelled` without running."""
    client = FarmClient(settings)
    first = [client.task(run_id="gone", agent="noop", row=noop_row(0))]
    await client.submit(first)
    assert (await client.cancel_run("gone")).open_count == 1
    late = [client.task(run_id="gone", agent="noop", row=noop_row(1, sleep_s=60))]
    await client.submit(late)
    async with in_process_worker(settings, concurrency=4):
        got = await client.collect(first + late, timeout_s=10)
    await client.aclose()
    assert {r.status for r in got.values()} == {Status.cancelled}


async def test_cancelling_unknown_or_finished_tasks_is_a_noop_that_says_so(settings, sync_redis):
    client = FarmClient(settings)
    tasks = [client.task(run_id="done-run", agent="noop", row=noop_row(i)) for i in range(3)]
    async with in_process_worker(settings, concurrency=4):
        got = await client.run_batch(tasks, timeout_s=10)
    assert {r.status for r in got.values()} == {Status.ok}
    report = await client.cancel([*tasks, "0" * 32])
    assert report.open == [] and report.not_open == [*[t.task_id for t in tasks], "0" * 32]
    assert report.line() == f"4 unknown or already finished (nothing to cancel; e.g. {tasks[0].task_id})"
    finished = await client.cancel_run("done-run")
    assert finished.run_known and finished.open_count == 0
    assert "has no queued or running tasks" in finished.line()
    never = await client.cancel_run("no-such-run")
    assert not never.run_known and "does not exist" in never.line()
    assert sync_redis.zscore(settings.keys.cancel_runs(), "no-such-run") is None, "an unknown run is not recorded"
    for bad in (["has space"], [""], ["x" * 300]):
        try:
            await client.cancel(bad)
        except ConfigError as exc:
            assert "is not a task id" in str(exc)
        else:
            raise AssertionError(f"{bad!r} accepted")
    await client.aclose()
    stats = settled_cleanly(sync_redis, settings, "noop")
    assert stats == {"done": 3}


async def test_a_second_cancel_says_already_cancelled_not_unknown(settings, sync_redis):
    """Cancelling a cancelled task again (before or after it settled) reports it as already
    cancelled, not as unknown or finished; the same for a run."""
    client = FarmClient(settings)
    tasks = [client.task(run_id="twice", agent="noop", row=noop_row(i, sleep_s=60)) for i in range(2)]
    await client.submit(tasks)
    first = await client.cancel(tasks[:1])
    assert first.open == [tasks[0].task_id] and first.already_cancelled == []
    queued = await client.cancel([tasks[0], "e" * 32])  # not settled yet: no worker
    assert queued.open == [] and queued.already_cancelled == [tasks[0].task_id] and queued.not_open == ["e" * 32]
    assert queued.line() == (
        f"1 already cancelled (a cancel was sent before; e.g. {tasks[0].task_id}); "
        f"1 unknown or already finished (nothing to cancel; e.g. {'e' * 32})"
    )
    async with in_process_worker(settings, concurrency=4):
        got = await client.collect(tasks[:1], timeout_s=10)
        assert got[tasks[0].task_id].status is Status.cancelled
        settled = await client.cancel(tasks[:1])
        assert settled.already_cancelled == [tasks[0].task_id] and settled.not_open == []
        assert (await client.cancel_run("twice")).open_count == 1
        await client.collect(tasks[1:], timeout_s=10)
    again = await client.cancel_run("twice")
    assert again.run_known and again.run_already_cancelled and again.open_count == 0
    assert again.line() == "run twice was already cancelled: nothing more to cancel"
    await client.aclose()


async def test_a_cancel_racing_the_settle_yields_exactly_one_rollout(settings, sync_redis):
    """400 short tasks, each cancelled at a random moment around its end: every task gets one
    rollout, `ok` or `cancelled`, never both, and the stats count each once."""
    rnd = random.Random(3)
    client = FarmClient(settings)
    tasks = [
        client.task(run_id="race", agent="noop", row=noop_row(i, sleep_s=rnd.uniform(0, 0.05))) for i in range(400)
    ]
    async with in_process_worker(settings, concurrency=64):
        await client.submit(tasks)
        order = list(tasks)
        rnd.shuffle(order)
        for i in range(0, len(order), 20):
            await asyncio.sleep(rnd.uniform(0, 0.02))
            await client.cancel(order[i : i + 20])
        got = await client.collect(tasks, timeout_s=20)
        await asyncio.sleep(0.5)  # any second copy would have arrived by now
        reader = client.reader("race")
        await reader.pull(100)
    await client.aclose()
    statuses = [got[t.task_id].status for t in tasks]
    assert set(statuses) <= {Status.ok, Status.cancelled} and Status.cancelled in statuses
    assert reader.duplicates == 0 and not reader.buffer
    stats = settled_cleanly(sync_redis, settings, "noop")
    assert stats.get("done", 0) == statuses.count(Status.ok)
    assert stats.get("cancelled", 0) == statuses.count(Status.cancelled)


@pytest.mark.slow
def test_a_run_against_a_slow_model_cancels_within_seconds_and_closes_its_requests(
    redis_url, namespace, sync_redis, tmp_path, tokenizer, model_dir
):
    """128 tasks of one run against a 60 s model, 64 in flight in a real `farm worker` and 64
    queued, all cancelled: 128 `cancelled` rollouts within 3 s, the model server saw its open
    requests closed (so a vLLM would abort them), nothing pending or dead, and the worker still
    serves new tasks."""
    settings = make_settings(redis_url, namespace)
    stub = StubProcess(script_for(tokenizer), latency_s=60, workdir=tmp_path).start()
    env = stack.policy_env(stub.url, "stub", model_dir)
    proc = spawn_worker(settings, "--agent", "single_tool_call", "--concurrency", "64", **env)
    try:

        async def main():
            client = FarmClient(settings)
            tasks = [client.task(run_id="slow", agent="single_tool_call", row=r) for r in stub_rows(128)]
            await client.submit(tasks)
            await async_wait_for(lambda: stub.stats().get("pending", 0) >= 64, timeout=60, what="64 model calls")
            t0 = time.monotonic()
            report = await client.cancel_run("slow")
            got = await client.collect(tasks, timeout_s=10)
            took = time.monotonic() - t0
            stub.control(latency_s=0.05)
            fresh = [client.task(run_id="after", agent="single_tool_call", row=r) for r in stub_rows(4)]
            after = await client.run_batch(fresh, timeout_s=60)
            await client.aclose()
            return report, got, took, after

        report, got, took, after = asyncio.run(main())
        assert report.open_count == 128
        assert {r.status for r in got.values()} == {Status.cancelled}, {r.status for r in got.values()}
        assert took < 3.0, f"128 cancelled rollouts took {took:.2f}s"
        assert sum(r.error.message.startswith("cancelled after") for r in got.values()) == 64
        aborted = wait_for(lambda: stub.stats()["aborted"] >= 60 and stub.stats()["aborted"], what="closed requests")
        assert aborted >= 60, aborted
        assert {r.status for r in after.values()} == {Status.ok}, [r.error for r in after.values()]
        stats = settled_cleanly(sync_redis, settings, "single_tool_call")
        assert stats["cancelled"] == 128 and stats["done"] == 4
    finally:
        out = stop(proc, timeout=30)
        stub.stop()
    assert proc.returncode == 0, out


@pytest.mark.slow
def test_farm_cancel_says_what_it_did_in_one_line_with_the_right_exit_code(redis_url, namespace, sync_redis):
    settings = make_settings(redis_url, namespace)
    env = worker_env(settings)

    def farm(*args: str, **extra: str):
        proc = subprocess.run(
            [sys.executable, "-m", "farm", "cancel", *args],
            env={**env, **extra},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "Traceback" not in proc.stdout + proc.stderr
        return proc.returncode, (proc.stdout + proc.stderr).strip()

    async def submit():
        client = FarmClient(settings)
        tasks = [client.task(run_id="cli-run", agent="noop", row=noop_row(i)) for i in range(3)]
        await client.submit(tasks)
        await client.aclose()
        return tasks

    tasks = asyncio.run(submit())
    code, out = farm(tasks[0].task_id, "f" * 32)
    assert (
        code == 0
        and out
        == f"cancelled 1 queued or running tasks; 1 unknown or already finished (nothing to cancel; e.g. {'f' * 32})"
    )
    assert sync_redis.zscore(settings.keys.cancel_tasks(), tasks[0].task_id) is not None
    code, out = farm("--run", "cli-run")
    # The submit moved one task into the stream to wake a worker; the two still queued are answered at once.
    assert (code, out) == (
        0,
        "cancelled run cli-run: 3 queued or running tasks end as `cancelled` (2 still queued, answered at once)",
    )
    code, out = farm(tasks[0].task_id)
    assert (code, out) == (0, f"1 already cancelled (a cancel was sent before; e.g. {tasks[0].task_id})")
    code, out = farm("--run", "cli-run")
    # The task in the stream waits for a worker (none here) to settle it.
    assert (code, out) == (0, "run cli-run was already cancelled: 1 queued or running tasks still end as `cancelled`")
    code, out = farm("--run", "nope")
    assert code == 6 and out.startswith("farm: run nope does not exist here") and out.count("\n") == 0, out
    code, out = farm("--run", "bad id!")
    assert code == 2 and "run id" in out, out
    code, out = farm("has space")
    assert code == 2 and "is not a task id" in out, out
    code, out = farm()
    assert code == 2 and "give task ids or --run" in out, out
    t0 = time.monotonic()
    code, out = farm("--run", "x", FARM_REDIS_URL="redis://127.0.0.1:1/0", FARM_REDIS_DOWN_MAX_S="1")
    # The one retry layer warns once while it waits out redis_down_max_s, then the one error line.
    assert code == 3 and out.splitlines()[-1].startswith("farm: Redis at redis://127.0.0.1:1/0 unreachable"), out
    assert time.monotonic() - t0 < 15
