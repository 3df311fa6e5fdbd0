"""Chaos with cancels: a cancel never loses or duplicates another task.

Two real `farm worker --agent noop` processes serve 3,000 short tasks of three runs, submitted
over several seconds; meanwhile random subsets of the submitted tasks are cancelled, one whole
run is cancelled halfway through its submission (its later tasks too, which the run's cancel
covers), and one worker is SIGKILLed and restarted (its in-flight tasks are reclaimed, and the
new process reads the cancels it missed from Redis).

At the end every task has exactly one rollout: a task never cancelled ended `ok`; one
cancelled while open ended `cancelled`, or `ok` when it was finishing as the cancel came; the
cancelled run's tasks all ended `cancelled` but those settled before its cancel. The stats hash
counts each task once, nothing is pending or dead-lettered, no open-task record is left.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter

import pytest
from helpers.processes import stop
from helpers.workers import spawn_worker

from farm.client import FarmClient
from farm.keys import GROUP
from farm.schema import ErrorKind, Status
from farm.state import live_workers_async

pytestmark = pytest.mark.slow

RUNS = ("r0", "r1", "r2")
CANCELLED_RUN = "r1"
PER_RUN = 1000
CHUNK = 150  # tasks per submission, one every PAUSE_S
PAUSE_S = 0.5
SLACK_S = 1.0  # a rollout stamped this soon after its run's cancel was already finishing


def test_cancels_mixed_into_chaos_never_lose_or_duplicate_a_task(settings, sync_redis):
    rnd = random.Random(11)

    def start():
        return spawn_worker(settings, "--agent", "noop", "--concurrency", "16")

    workers = [start(), start()]
    events: Counter = Counter()

    async def main():
        client = FarmClient(settings)
        tasks = [
            client.task(run_id=run, agent="noop", row={"noop": {"sleep_s": rnd.uniform(0, 0.3)}, "i": i})
            for i in range(PER_RUN)
            for run in RUNS
        ]
        deadline = time.monotonic() + 60
        while len(await live_workers_async(client.r, settings.keys)) < 2:
            assert time.monotonic() < deadline, "the workers did not start"
            await asyncio.sleep(0.1)

        submitted: list = []
        cancelled_open: set[str] = set()  # open when cancelled: `cancelled`, or `ok` in a race
        cancelled_settled: set[str] = set()  # already settled when cancelled: `ok`
        run_cancelled_at, late = 0.0, set()
        for n, i in enumerate(range(0, len(tasks), CHUNK)):
            await client.submit(tasks[i : i + CHUNK])
            submitted += tasks[i : i + CHUNK]
            await asyncio.sleep(PAUSE_S)
            report = await client.cancel(rnd.sample(submitted, 40))
            cancelled_open.update(report.open)
            cancelled_settled.update(set(report.not_open) - cancelled_open)  # not a second cancel of one
            events["task cancels"] += 1
            if n == 5:
                victim = rnd.randrange(len(workers))
                workers[victim].kill()
                workers[victim].communicate()
                workers[victim] = start()
                events["worker SIGKILL + restart"] += 1
            if n == 10:
                run_cancelled_at = time.time()
                report = await client.cancel_run(CANCELLED_RUN)
                late = {t.task_id for t in tasks[i + CHUNK :] if t.run_id == CANCELLED_RUN}
                assert report.run_known and report.open_count > 0
                events["run cancels"] += 1
        got = await client.collect(tasks, timeout_s=60)
        await asyncio.sleep(0.5)  # a second copy of any rollout would have arrived by now
        duplicates = 0
        for run in RUNS:
            reader = client.reader(run)
            await reader.pull(100)
            assert not reader.buffer, f"{len(reader.buffer)} rollouts of {run} nobody waited for"
            duplicates += reader.duplicates
        await client.aclose()
        return tasks, got, duplicates, cancelled_open, cancelled_settled, run_cancelled_at, late

    try:
        tasks, got, duplicates, cancelled_open, cancelled_settled, run_cancelled_at, late = asyncio.run(main())
    finally:
        outs = [stop(proc, timeout=30) for proc in workers]
    assert all(proc.returncode == 0 for proc in workers), outs

    statuses = Counter(r.status for r in got.values())
    stopped = sum(r.status is Status.cancelled and r.error.message.startswith("cancelled after") for r in got.values())
    reclaimed = sum(r.attempt > 1 for r in got.values())
    print(
        f"\ncancel chaos: {len(tasks)} tasks, {dict(statuses)} ({stopped} cancelled in flight), "
        f"{reclaimed} rerun after the SIGKILL, {duplicates} duplicates; {dict(events)}"
    )
    assert stopped and reclaimed, "the cancels or the SIGKILL missed the running tasks"
    assert len(got) == len(tasks) and duplicates == 0
    assert set(statuses) <= {Status.ok, Status.cancelled}, statuses  # no deadline: nothing lost
    for t in tasks:
        r = got[t.task_id]
        if r.status is Status.cancelled:
            assert r.error.kind is ErrorKind.cancelled
        if t.task_id in late:  # submitted after its run's cancel: never ran
            assert r.status is Status.cancelled and r.error.message == "cancelled before it started", r
        elif t.run_id == CANCELLED_RUN:
            assert r.status is Status.cancelled or r.finished_at < run_cancelled_at + SLACK_S, r
        elif t.task_id in cancelled_settled:
            assert r.status is Status.ok, r
        elif t.task_id not in cancelled_open:
            assert r.status is Status.ok, f"never cancelled, yet {r.status}: {r.error}"
    others_cancelled = {
        t.task_id for t in tasks if t.run_id != CANCELLED_RUN and got[t.task_id].status is Status.cancelled
    }
    assert others_cancelled and others_cancelled <= cancelled_open

    keys = settings.keys
    assert sync_redis.xpending(keys.tasks("noop"), GROUP)["pending"] == 0
    assert sync_redis.xlen(keys.dead("noop")) == 0
    assert sync_redis.zcard(keys.open_tasks()) == 0 and sync_redis.hlen(keys.open_runs()) == 0
    stats = {k.decode(): int(v) for k, v in sync_redis.hgetall(keys.stats("noop")).items()}
    assert stats.get("done", 0) == statuses[Status.ok], stats
    assert stats.get("cancelled", 0) == statuses[Status.cancelled], stats
    assert stats.get("done", 0) + stats.get("cancelled", 0) == len(tasks), stats
