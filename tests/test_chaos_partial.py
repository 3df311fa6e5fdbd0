"""Chaos with interrupts and resumes: every chain of continuations ends in one finished rollout,
and no partial trace is lost, through a worker SIGKILL and a Redis SIGKILL + restart (AOF).

Two real `farm worker --agent noop` processes serve tasks whose tokens are generated one by one
(the noop agent with `tokens` and `sleep_s` keeps what it generated when interrupted). The client
interrupts random open tasks again and again and resumes every interrupted rollout it reads;
meanwhile one worker is SIGKILLed and restarted, and Redis is SIGKILLed and restarted on its AOF.

At the end: each original task's chain ends in exactly one `ok` rollout with all its tokens; each
interrupted rollout was answered exactly once (no duplicate reached the reader); a continuation
carries exactly the tokens its interrupted rollout had (none lost in the queue); nothing is pending,
dead-lettered or left open.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter

import pytest
import redis
from helpers.processes import stop
from helpers.redis import make_settings
from helpers.workers import spawn_worker

from farm.client import FarmClient
from farm.embedded import EmbeddedRedis
from farm.keys import GROUP
from farm.schema import Status
from farm.state import live_workers_async

pytestmark = pytest.mark.slow

TASKS = 400
TOKENS = 20
ENV = dict(FARM_REDIS_DOWN_MAX_S="60", FARM_VISIBILITY_TIMEOUT_S="3.0", FARM_MAX_ATTEMPTS="5")


def test_interrupts_and_resumes_mixed_into_chaos_lose_no_partial_trace(tmp_path):
    rnd = random.Random(5)
    server = EmbeddedRedis(tmp_path / "redis", appendfsync="always").start()
    port = server.port
    settings = make_settings(
        server.url, "pchaos", redis_down_max_s=60.0, visibility_timeout_s=3.0, lease_renew_s=0.5, max_attempts=5
    )

    def start():
        return spawn_worker(settings, "--agent", "noop", "--concurrency", "64", **ENV)

    workers = [start(), start()]
    events: Counter = Counter()

    async def main():
        nonlocal server
        client = FarmClient(settings)
        rows = [{"noop": {"sleep_s": rnd.uniform(0.5, 2.0), "tokens": TOKENS}, "i": i} for i in range(TASKS)]
        originals = [client.task(run_id="pc", agent="noop", row=r) for r in rows]
        deadline = time.monotonic() + 60
        while len(await live_workers_async(client.r, settings.keys)) < 2:
            assert time.monotonic() < deadline, "the workers did not start"
            await asyncio.sleep(0.1)
        await client.submit(originals)
        origin_of = {t.task_id: t.task_id for t in originals}
        carried_in: dict[str, int] = {}  # continuation id -> tokens its task carries
        open_tasks = {t.task_id: t for t in originals}
        finished: dict[str, object] = {}  # origin -> its ok rollout
        answered: Counter = Counter()
        reader = client.reader("pc")
        start_t = time.monotonic()
        while len(finished) < TASKS:
            assert time.monotonic() - start_t < 150, f"{len(finished)} of {TASKS} chains finished"
            now = time.monotonic() - start_t
            if open_tasks and rnd.random() < 0.5 and now < 20:
                await client.interrupt(rnd.sample(list(open_tasks.values()), min(30, len(open_tasks))))
                events["interrupts"] += 1
            if now > 4 and not events["worker SIGKILL + restart"]:
                workers[0].kill()
                workers[0].communicate()
                workers[0] = start()
                events["worker SIGKILL + restart"] += 1
            if now > 8 and not events["redis SIGKILL + restart"]:
                server.proc.kill()
                server.proc.wait()
                await asyncio.sleep(1.0)
                server = EmbeddedRedis(tmp_path / "redis", port=port, appendfsync="always").start()
                events["redis SIGKILL + restart"] += 1
            await client.outage.call(lambda: reader.pull(200), "reading rollouts")
            resume = []
            for tid in list(open_tasks):
                r = reader.take(tid)
                if r is None:
                    continue
                answered[tid] += 1
                del open_tasks[tid]
                origin = origin_of[tid]
                if r.status is Status.interrupted:
                    got = len(r.partial.trace.completion())
                    assert got >= carried_in.get(tid, 0), "an interrupt lost tokens the task carried"
                    resume.append(r)
                else:
                    assert r.status is Status.ok, (r.status, r.error)
                    assert origin not in finished, "a chain finished twice"
                    finished[origin] = r
            if resume:
                for r, cont in zip(resume, await client.resume(resume)):
                    origin_of[cont.task_id] = origin_of[r.task_id]
                    carried_in[cont.task_id] = len(cont.resume.trace.completion()) if cont.resume else 0
                    open_tasks[cont.task_id] = cont
                events["resumed"] += len(resume)
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        await reader.pull(100)
        duplicates = reader.duplicates
        await client.aclose()
        return finished, answered, duplicates

    try:
        finished, answered, duplicates = asyncio.run(main())
    finally:
        outs = [stop(proc, timeout=30) for proc in workers]
    print(f"\npartial chaos: {TASKS} chains, {dict(events)}, {duplicates} duplicates dropped by the reader")
    assert events["resumed"] >= 100, "the interrupts missed the running tasks"
    assert duplicates == 0, "no task answered twice (not even a copy the reader dropped)"
    assert sum(answered.values()) == TASKS + events["resumed"], "every task of every chain answered"
    assert len(finished) == TASKS
    for r in finished.values():
        assert len(r.trace.completion()) == TOKENS, "the final rollout holds every token of its chain"
    keys = settings.keys
    r = redis.Redis.from_url(server.url)
    assert r.xpending(keys.tasks("noop"), GROUP)["pending"] == 0
    assert r.xlen(keys.dead("noop")) == 0
    assert r.zcard(keys.open_tasks()) == 0
    r.close()
    server.stop()
    assert all(proc.returncode == 0 for proc in workers), outs
