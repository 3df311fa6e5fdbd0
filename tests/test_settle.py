"""A worker counts a settle once Redis has answered it, as what Redis answered.

The settle scripts do nothing for a task that is no longer pending (settled by another worker that
reclaimed it, or by a replay), so a worker's counters must follow the script's answer, not the
outcome the worker decided: a settle that turns out to be a no-op is a duplicate, never a second
`done`. Against a real Redis, since the answer comes from the Lua script.
"""

import time
from collections import Counter

import pytest
from helpers.redis import consumer_with_tasks, run_script
from helpers.waiting import async_wait_for
from helpers.workers import in_process_worker as worker

from farm import schema
from farm.client import FarmClient
from farm.connection import connect
from farm.errors import TransportError
from farm.schema import ErrorKind, Status
from farm.scripts import NOT_PENDING, SETTLED
from farm.settler import Settler
from farm.streams import AgentStream
from farm.transport import Outage


async def test_a_task_settled_elsewhere_counts_as_a_duplicate_not_as_done(settings):
    """Another worker settles the task while this one runs it (a stolen lease): this worker's
    settle is the script's no-op, so it counts one duplicate and no `done`."""
    client = FarmClient(settings)
    r = connect(settings)
    async with worker(settings, concurrency=2) as w:
        [slow] = [client.task(run_id="run1", agent="noop", row={"noop": {"sleep_s": 1.0}})]
        await client.submit([slow])
        await async_wait_for(lambda: len(w.inflight) == 1, timeout=5, what="the slow task in flight")
        [entry_id] = list(w.inflight)
        thief = AgentStream(r, settings.keys, "noop", "thief", Outage.for_settings(settings))
        theirs = schema.Rollout.for_task(slow, status=Status.ok, reward=0.5)
        assert await run_script(r, thief.reply_op(entry_id, theirs, slow.reply_to)) == 1
        quick = client.task(run_id="run1", agent="noop", row={})
        await client.submit([quick])
        got = await client.collect([slow, quick], timeout_s=10)
        await async_wait_for(lambda: not w.inflight, timeout=5, what="the slow task's own settle")
    assert got[slow.task_id].reward == 0.5, "the first settle wins"
    assert (w.counters["done"], w.counters["duplicate"]) == (1, 1), dict(w.counters)
    await r.aclose()
    await client.aclose()


async def test_the_settler_counts_each_settle_by_the_scripts_answer(settings, sync_redis):
    """Settled: its outcome; a replay: a duplicate only; a refused reply stream: nothing (its
    dead letter counts); a retry: `retried`. The ops say what they stand for by name."""
    r, stream, tasks, ids = await consumer_with_tasks(settings, 3)
    settler = Settler(r, Outage.for_settings(settings))
    settler.start()
    done = stream.reply_op(ids[0], schema.Rollout.for_task(tasks[0], status=Status.ok, reward=1.0), tasks[0].reply_to)
    assert (done.script, done.entry_id, done.agent, done.outcome, done.kind) == ("settle", ids[0], "noop", "done", "")
    assert [await settler.run(done) for _ in range(2)] == [SETTLED, NOT_PENDING]
    assert settler.counters == Counter(done=1, duplicate=1)

    typed = settings.keys.results("typed")
    sync_redis.hset(typed, "a", "b")
    refused = stream.reply_op(ids[1], schema.Rollout.for_task(tasks[1], status=Status.ok), typed)
    assert await settler.run(refused) == -2
    assert settler.counters == Counter(done=1, duplicate=1), "nothing was settled"
    letter = stream.dead_op(ids[1], {}, ErrorKind.bad_reply_to, "reply_to holds a hash", 1)
    assert (letter.outcome, letter.kind) == ("dead", "bad_reply_to")
    assert await settler.run(letter) == SETTLED

    retry = stream.retry_op(ids[2], tasks[2], time.time() + 60, ErrorKind.timeout)
    assert (retry.script, retry.outcome, retry.kind) == ("retry", "retried", "timeout")
    assert [await settler.run(retry) for _ in range(2)] == [SETTLED, NOT_PENDING]
    assert settler.counters == Counter(done=1, dead=1, retried=1, duplicate=2)
    stats = {k.decode(): int(v) for k, v in sync_redis.hgetall(settings.keys.stats("noop")).items()}
    assert stats == {"done": 1, "dead": 1, "retried": 1}, "the stats hash agrees with the counters"
    await settler.close()
    await r.aclose()


async def test_a_settle_that_fails_in_redis_counts_as_unsettled(settings, sync_redis):
    """A script error (the tasks stream is not a stream any more) fails only its own settle, mapped
    to the farm's error, and counts it as `unsettled`, not as its outcome."""
    r, stream, [task], [entry_id] = await consumer_with_tasks(settings)
    op = stream.reply_op(entry_id, schema.Rollout.for_task(task, status=Status.ok, reward=1.0), task.reply_to)
    sync_redis.delete(settings.keys.tasks("noop"))
    sync_redis.set(settings.keys.tasks("noop"), "not a stream")
    settler = Settler(r, Outage.for_settings(settings))
    settler.start()
    with pytest.raises(TransportError):
        await settler.run(op)
    assert settler.counters == Counter(unsettled=1)
    await settler.close()
    await r.aclose()
