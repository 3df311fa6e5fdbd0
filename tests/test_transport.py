"""Delivery through a real Redis with in-process workers (the asyncio Worker, noop agent).

These exercise the stream semantics that fakeredis cannot stand in for: blocking
XREADGROUP with COUNT, XAUTOCLAIM, Lua settle scripts and consumer-group pending lists.
"""

import asyncio
import time

import msgspec
import pytest
from helpers.redis import consumer_with_tasks, make_settings, run_script
from helpers.waiting import async_wait_for
from helpers.workers import in_process_worker as worker

from farm import schema
from farm.client import FarmClient
from farm.connection import connect
from farm.keys import GROUP
from farm.schema import Status
from farm.streams import AgentStream
from farm.transport import Outage
from workers.delivery.runtime import Worker
from workers.loops.noop import NoopAgent


def rows(n, **noop):
    return [{"responses_create_params": {"input": f"q{i}"}, "noop": dict(noop)} for i in range(n)]


async def submit(client, rows_, run_id="run1", agent="noop", **kw):
    tasks = [client.task(run_id=run_id, agent=agent, row=r, **kw) for r in rows_]
    await client.submit(tasks)
    return tasks


async def test_batch_end_to_end_one_rollout_per_task(settings, sync_redis):
    client = FarmClient(settings)
    async with worker(settings, concurrency=16):
        tasks = await submit(client, [dict(r, noop={"reward": i % 2}) for i, r in enumerate(rows(200))])
        seen = []
        got = await client.collect(tasks, timeout_s=30, on_progress=lambda d, t, r: seen.append(d))
    assert set(got) == {t.task_id for t in tasks}
    assert all(r.status is Status.ok for r in got.values())
    assert sum(r.reward for r in got.values()) == 100
    assert seen[-1] == 200 and len(seen) == 200
    stats = sync_redis.hgetall(settings.keys.stats("noop"))
    assert int(stats[b"done"]) == 200
    assert sync_redis.xlen(settings.keys.tasks("noop")) == 0  # settled entries are deleted
    await client.aclose()


async def test_fetching_follows_free_slots(settings, sync_redis):
    client = FarmClient(settings)
    async with worker(settings, concurrency=3) as w:
        tasks = await submit(client, rows(15, sleep_s=0.15))
        peak = 0
        collecting = asyncio.create_task(client.collect(tasks, timeout_s=30))
        while not collecting.done():
            consumers = sync_redis.xinfo_consumers(settings.keys.tasks("noop"), GROUP)
            held = sum(c["pending"] for c in consumers)
            peak = max(peak, held, len(w.inflight))
            await asyncio.sleep(0.01)
        got = collecting.result()
    assert len(got) == 15 and all(r.ok for r in got.values())
    assert 1 <= peak <= 3
    await client.aclose()


async def test_always_failing_task_is_dead_lettered_with_reason(settings, sync_redis):
    client = FarmClient(settings)
    async with worker(settings) as w:
        tasks = await submit(client, rows(1, fail="always"))
        got = await client.collect(tasks, timeout_s=30)
    r = got[tasks[0].task_id]
    assert r.status is Status.failed
    assert r.error.kind == "agent_error"
    assert "failed 3 attempts" in r.error.message and "noop told to fail" in r.error.message
    assert r.attempt == settings.max_attempts
    dead = sync_redis.xrange(settings.keys.dead("noop"))
    assert len(dead) == 1
    letter = dead[0][1]
    assert letter[b"kind"] == b"agent_error" and int(letter[b"attempts"]) == 3
    assert b"noop told to fail" in letter[b"reason"]
    assert schema.decode_task(letter).task_id == tasks[0].task_id  # the original task is kept
    stats = sync_redis.hgetall(settings.keys.stats("noop"))
    assert int(stats[b"retried"]) == 2 and int(stats[b"dead"]) == 1
    assert w.counters["retried"] == 2


async def test_transient_failure_is_retried_then_succeeds(settings):
    client = FarmClient(settings)
    async with worker(settings):
        tasks = await submit(client, rows(5, fail=1, reward=0.5))
        got = await client.collect(tasks, timeout_s=30)
    assert all(r.ok and r.attempt == 2 and r.reward == 0.5 for r in got.values())


async def test_non_retryable_failure_is_a_failed_rollout_without_retry(settings, sync_redis):
    client = FarmClient(settings)
    async with worker(settings):
        tasks = await submit(client, rows(1, fail="fatal"))
        got = await client.collect(tasks, timeout_s=30)
    r = got[tasks[0].task_id]
    assert r.status is Status.failed and r.error.kind == "verifier" and r.attempt == 1
    assert sync_redis.xlen(settings.keys.dead("noop")) == 0


async def test_attempt_timeout_is_retried_and_then_dead_lettered(redis_url, namespace, sync_redis):
    settings = make_settings(redis_url, namespace, task_timeout_s=0.2, max_attempts=2)
    client = FarmClient(settings)
    async with worker(settings):
        tasks = await submit(client, rows(1, sleep_s=5))
        got = await client.collect(tasks, timeout_s=30)
    r = got[tasks[0].task_id]
    assert r.error.kind == "timeout" and "ran past 0.2s" in r.error.message
    assert sync_redis.xlen(settings.keys.dead("noop")) == 1


async def test_malformed_and_unknown_version_entries_are_dead_lettered_and_work_goes_on(settings, sync_redis):
    client = FarmClient(settings)
    stream = settings.keys.tasks("noop")
    async with worker(settings):
        good_before = await submit(client, rows(3))
        await client.collect(good_before, timeout_s=30)
        sync_redis.xadd(stream, {"v": "1", "d": b"\xc1 garbage"})
        sync_redis.xadd(stream, {"something": "else"})
        future = client.task(run_id="run1", agent="noop", row={"q": 1})
        body = msgspec.msgpack.decode(schema.encode(future))
        body["new_field_from_v2"] = True
        sync_redis.xadd(stream, {"v": "2", "d": msgspec.msgpack.encode(body)})
        after = await submit(client, rows(3))
        got = await client.collect(after + [future], timeout_s=30)
    assert all(got[t.task_id].ok for t in after)
    r = got[future.task_id]
    assert r.status is Status.failed and r.error.kind == "schema_version" and "version '2'" in r.error.message
    dead = {e[1][b"kind"]: e[1] for e in sync_redis.xrange(settings.keys.dead("noop"))}
    assert set(dead) == {b"malformed", b"schema_version"} and len(sync_redis.xrange(settings.keys.dead("noop"))) == 3
    assert b"bad task" in [e[1][b"reason"] for e in sync_redis.xrange(settings.keys.dead("noop"))][0]
    assert sync_redis.xpending(stream, GROUP)["pending"] == 0


async def test_duplicate_results_are_dropped(settings, sync_redis):
    client = FarmClient(settings)
    tasks = [client.task(run_id="dup", agent="noop", row={}) for _ in range(3)]
    stream = settings.keys.results("dup")
    for t in tasks + tasks[:2]:
        sync_redis.xadd(stream, schema.entry(schema.Rollout.for_task(t, status=Status.ok, reward=1.0)))
    reader = client.reader("dup")
    got = await client.collect(tasks, timeout_s=5)
    assert len(got) == 3 and reader.duplicates == 2
    # a late copy after delivery is dropped too
    sync_redis.xadd(stream, schema.entry(schema.Rollout.for_task(tasks[0], status=Status.ok, reward=0.0)))
    extra = client.task(run_id="dup", agent="noop", row={})
    sync_redis.xadd(stream, schema.entry(schema.Rollout.for_task(extra, status=Status.ok, reward=1.0)))
    await client.collect([extra], timeout_s=5)
    assert reader.duplicates == 3
    await client.aclose()


async def test_settling_twice_writes_one_rollout(settings, sync_redis):
    """The settle script is idempotent: a replayed or competing settle is a no-op."""
    r, stream, [task], [entry_id] = await consumer_with_tasks(settings)
    op = stream.reply_op(entry_id, schema.Rollout.for_task(task, status=Status.ok, reward=1.0), task.reply_to)
    results = [await run_script(r, op) for _ in range(2)]
    assert results == [1, 0]
    assert sync_redis.xlen(task.reply_to) == 1
    await r.aclose()


async def test_missing_rollouts_become_deadline_failures(settings):
    client = FarmClient(settings)
    tasks = [client.task(run_id="run1", agent="nobody_serves_this", row=r) for r in rows(2)]
    await client.submit(tasks, check_agents=False)  # an agent nothing knows, on purpose
    t0 = time.monotonic()
    got = await client.collect(tasks, timeout_s=0.5)
    assert time.monotonic() - t0 < 3
    assert all(r.status is Status.failed and r.error.kind == "deadline" for r in got.values())
    await client.aclose()


async def test_expired_task_is_failed_not_run(settings):
    client = FarmClient(settings)
    tasks = await submit(client, rows(1), timeout_s=0.05)
    await asyncio.sleep(0.2)
    async with worker(settings):
        got = await client.collect(tasks, timeout_s=10)
    assert got[tasks[0].task_id].error.kind == "deadline"


async def test_long_rollout_keeps_its_lease(settings):
    """A task running 3x the visibility timeout is renewed, so a second worker never steals it."""
    client = FarmClient(settings)
    async with worker(settings, concurrency=2) as a, worker(settings, concurrency=2) as b:
        tasks = await submit(client, rows(2, sleep_s=settings.visibility_timeout_s * 3))
        got = await client.collect(tasks, timeout_s=30)
    assert all(r.ok and r.attempt == 1 for r in got.values())
    assert a.counters["reclaimed"] + b.counters["reclaimed"] == 0
    assert a.counters["duplicate"] + b.counters["duplicate"] == 0


async def test_abandoned_tasks_are_reclaimed_and_attempts_counted(redis_url, namespace, sync_redis):
    settings = make_settings(redis_url, namespace, max_attempts=2)
    client = FarmClient(settings)
    r = connect(settings)
    ghost = AgentStream(
        r, settings.keys, "noop", "ghost", Outage.for_settings(settings)
    )  # a consumer that reads and dies
    await ghost.setup()
    tasks = await submit(client, rows(4))
    taken = await ghost.read(4, 100)
    assert len(taken) == 4
    # make one of them look like it was already delivered max_attempts times
    await r.execute_command("XCLAIM", settings.keys.tasks("noop"), GROUP, "ghost", 0, taken[0][0], "RETRYCOUNT", 2)
    t0 = time.monotonic()
    async with worker(settings) as w:
        got = await client.collect(tasks, timeout_s=30)
    assert time.monotonic() - t0 >= settings.visibility_timeout_s * 0.5
    assert w.counters["reclaimed"] == 4
    by_entry = {schema.decode_task(f).task_id: i for i, f in taken}
    first = schema.decode_task(taken[0][1]).task_id
    assert got[first].error.kind == "max_attempts"
    assert all(got[t].ok and got[t].attempt == 2 for t in by_entry if t != first)
    await r.aclose()


async def test_stop_drains_in_flight_and_hands_back_the_rest(redis_url, namespace, sync_redis):
    settings = make_settings(redis_url, namespace, grace_period_s=0.5, visibility_timeout_s=30, lease_renew_s=5)
    client = FarmClient(settings)
    quick = await submit(client, rows(2, sleep_s=0.1))
    w = Worker(settings, "noop", NoopAgent(), concurrency=4)
    run = asyncio.create_task(w.run())
    await async_wait_for(lambda: len(w.inflight) == 2, what="quick tasks in flight")
    await submit(client, rows(2, sleep_s=60))
    await async_wait_for(lambda: len(w.inflight) == 4, what="slow tasks in flight")
    w.request_stop()
    await asyncio.wait_for(run, 10)
    got = await client.collect(quick, timeout_s=5)
    assert all(r.ok for r in got.values())
    # the slow ones were handed back with their idle time past the visibility timeout ...
    pending = sync_redis.xpending_range(settings.keys.tasks("noop"), GROUP, "-", "+", 10)
    assert len(pending) == 2 and all(p["time_since_delivered"] >= 30_000 for p in pending)
    # ... so a new worker takes them at once rather than after 30 s
    fast = make_settings(redis_url, namespace, visibility_timeout_s=30, lease_renew_s=5)
    async with worker(fast) as w2:
        await async_wait_for(lambda: w2.counters["reclaimed"] == 2, timeout=5, what="immediate reclaim")
        for task in list(w2.inflight.values()):
            task.cancel()
    await client.aclose()


async def test_retry_waits_in_the_delayed_set_and_comes_back(settings, sync_redis):
    r, stream, [task], [entry_id] = await consumer_with_tasks(settings)
    op = stream.retry_op(entry_id, msgspec.structs.replace(task, attempt=2), time.time() + 0.3, "timeout")
    assert await run_script(r, op) == 1
    assert sync_redis.zcard(settings.keys.delayed("noop")) == 1
    assert await stream.promote() == 0  # not due yet
    await asyncio.sleep(0.35)
    assert await stream.promote() == 1
    [(_, fields)] = await stream.read(1, 100)
    assert schema.decode_task(fields).attempt == 2
    await r.aclose()


@pytest.mark.slow
async def test_password_protected_redis(tmp_path):
    from farm.embedded import EmbeddedRedis

    with EmbeddedRedis(tmp_path, password="s3cret") as server:
        settings = make_settings(server.url, "pw")
        assert "s3cret@" in settings.redis_url
        client = FarmClient(settings)
        async with worker(settings):
            tasks = await submit(client, rows(5))
            got = await client.collect(tasks, timeout_s=20)
        assert all(r.ok for r in got.values())
        await client.aclose()
        bad = connect(make_settings(server.url.replace("s3cret", "wrong"), "pw"))
        with pytest.raises(Exception, match="(?i)invalid|WRONGPASS|auth"):
            await bad.ping()
        await bad.aclose()


def test_tls_urls_use_tls_connections():
    settings = make_settings("rediss://user:pw@cache.example:6380/0?ssl_cert_reqs=required", "tls")
    client = connect(settings)
    pool = client.connection_pool
    assert pool.connection_class.__name__ == "SSLConnection"
    assert pool.connection_kwargs["username"] == "user" and pool.connection_kwargs["password"] == "pw"


async def test_renew_reports_only_tasks_taken_by_another_consumer(settings):
    r, mine, tasks, (a, b) = await consumer_with_tasks(settings, 2, consumer="mine")
    assert await mine.renew([a, b]) == []
    await r.execute_command("XCLAIM", settings.keys.tasks("noop"), GROUP, "thief", 0, b)
    assert await mine.renew([a, b]) == [b]
    op = mine.reply_op(a, schema.Rollout.for_task(tasks[0], status=Status.ok, reward=1.0), tasks[0].reply_to)
    assert await run_script(r, op) == 1
    assert await mine.renew([a]) == []  # settled meanwhile: not "lost"
    await r.aclose()
