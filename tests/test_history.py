"""The per-minute history, sample streams and capped dead letters that workers record in the settle.

Built with a real Redis and the real worker runtime (noop agent): every bucket is compared with
what the rollouts the test collected say, so a number the dashboard shows is the number the
rollouts hold.
"""

from __future__ import annotations

import asyncio
import math
import random

import pytest
import redis
from helpers.redis import consumer_with_tasks, make_settings, run_script
from helpers.workers import in_process_worker

from farm import history
from farm.client import FarmClient
from farm.history import LATENCY_EDGES_S, decode_bucket, latency_bin, merge, quantile, summary
from farm.schema import Rollout, Status, Task, Timings
from farm.settler import Settler
from farm.transport import Outage


def rollout(reward=1.0, total_s=0.3, ok=True, tokens=None, run="r") -> Rollout:
    task = Task.new(run_id=run, agent="a", row={}, reply_to=f"farm:results:{run}")
    if ok:
        r = Rollout.for_task(task, status=Status.ok, reward=reward, timings=Timings(total_s=total_s))
    else:
        r = Rollout.failure(task, "verifier", "boom")
        r = r.__class__(**{**{f: getattr(r, f) for f in r.__struct_fields__}, "timings": Timings(total_s=total_s)})
    if tokens:
        r.metrics["completion_tokens"] = tokens
    return r


def test_increments_say_what_one_rollout_adds():
    assert history.increments(rollout(1.0, 0.3, tokens=50)) == {
        "done": 1,
        "run:r:done": 1,
        "reward_sum": 1.0,
        "reward_n": 1,
        "passed": 1,
        f"lt:{latency_bin(0.3)}": 1,
        "lat_sum": 0.3,
        "tokens": 50.0,
        "runpv:r:0:n": 1,
        "runpv:r:0:reward": 1.0,
        "runpv:r:0:passed": 1,
    }
    assert history.increments(rollout(0.5), pass_threshold=0.5)["passed"] == 1
    assert "passed" not in history.increments(rollout(0.4), pass_threshold=0.5)
    failed = history.increments(rollout(ok=False, total_s=2.0))
    assert failed["failed"] == 1 and failed["fail:verifier"] == 1 and "reward_n" not in failed
    assert failed["run:r:failed"] == 1 and "run:r:done" not in failed
    assert failed["runfail:r:verifier"] == 1 and not any(k.startswith("runpv:") for k in failed)


def test_each_run_is_counted_under_its_own_fields_and_the_agents_figures_are_unchanged():
    """Two runs' rollouts in one bucket: run_counts/run_rates give each run its own, the agent's
    summary and percentiles read the same as without the run fields, and fields that are not
    `run:<run_id>:<outcome>` are not read as a run."""
    rollouts = [rollout(run="a")] * 6 + [rollout(ok=False, run="a")] + [rollout(run="b.2-x")] * 3
    bucket = merge(history.increments(x) for x in rollouts)
    assert history.run_counts(bucket) == {
        "a": {"done": 6.0, "failed": 1.0, "cancelled": 0.0},
        "b.2-x": {"done": 3.0, "failed": 0.0, "cancelled": 0.0},
    }
    rates = history.run_rates(bucket, minutes=2.0)
    assert rates["a"]["done_per_min"] == 3.0 and rates["a"]["failed_per_min"] == 0.5
    assert rates["b.2-x"]["done_per_min"] == 1.5
    plain = {k: v for k, v in bucket.items() if not k.startswith("run:")}
    assert summary(bucket, 2.0) == summary(plain, 2.0) and summary(bucket, 2.0)["done_per_min"] == 4.5
    odd = {**bucket, "run:": 4.0, "run:c": 1.0, "run:c:lat_sum": 2.0, "run::done": 5.0, "depth": 3.0}
    assert history.run_counts(odd) == history.run_counts(bucket)


def test_a_runs_failures_by_kind_and_reward_by_policy_version_are_its_own_fields():
    """What a run page needs (failures by kind; per policy version the rollouts with a reward, their
    reward sum and passes) is counted per run in fields the agent's readers do not read: the
    agent's summary and the runs' counts are what they are without them."""

    def versioned(version: int, reward: float, run: str = "a") -> Rollout:
        x = rollout(reward, run=run)
        return x.__class__(**{**{f: getattr(x, f) for f in x.__struct_fields__}, "policy_version": version})

    rollouts = [versioned(0, 0.0), versioned(0, 1.0), versioned(1, 1.0), versioned(1, 0.5), versioned(1, 1.0)]
    rollouts += [versioned(2, 0.25, run="b"), rollout(ok=False, run="a"), rollout(ok=False, run="b")]
    bucket = merge(history.increments(x, pass_threshold=1.0) for x in rollouts)
    assert history.run_versions(bucket) == {
        "a": {0: {"n": 2.0, "reward": 1.0, "passed": 1.0}, 1: {"n": 3.0, "reward": 2.5, "passed": 2.0}},
        "b": {2: {"n": 1.0, "reward": 0.25, "passed": 0.0}},
    }
    assert history.run_failures(bucket) == {"a": {"verifier": 1.0}, "b": {"verifier": 1.0}}
    plain = {k: v for k, v in bucket.items() if not k.startswith(("runfail:", "runpv:"))}
    assert len(plain) < len(bucket)
    assert summary(bucket, 2.0) == summary(plain, 2.0) and history.run_counts(bucket) == history.run_counts(plain)
    assert summary(bucket, 2.0)["failures_by_kind"] == {"verifier": 2}
    odd = {
        **bucket,
        "runpv:a:x:n": 9.0,
        "runpv:a:1:bogus": 9.0,
        "runpv::1:n": 9.0,
        "runpv:a:1": 9.0,
        "runfail:a:": 9.0,
        "runfail:": 9.0,
    }
    assert history.run_versions(odd) == history.run_versions(bucket)
    assert history.run_failures(odd) == history.run_failures(bucket)
    # a run id is the field's middle, read from the right: one holding ':' (written by hand) stays whole
    assert history.run_versions({"runpv:x:y:4:n": 2.0}) == {"x:y": {4: {"n": 2.0, "reward": 0.0, "passed": 0.0}}}


def test_percentiles_are_estimates_within_a_bin_of_the_truth():
    """Read as bin edges, a noop p50 of 1.09 s showed 2.5 s and p50 = p99; interpolated in finer bins
    they land within 25% of the true quantile (here within a few percent) from milliseconds to minutes."""
    assert latency_bin(0.0) == 0 and latency_bin(0.001) == 0 and latency_bin(0.0011) == 1
    assert latency_bin(10_000.0) == len(LATENCY_EDGES_S)
    rng = random.Random(1)
    for median, sigma in ((1.09, 0.5), (0.3, 0.1), (37.6, 0.8), (0.004, 0.3)):
        values = sorted(rng.lognormvariate(math.log(median), sigma) for _ in range(500))
        bucket = merge(history.increments(rollout(total_s=x)) for x in values)
        for q in (0.5, 0.99):
            true = values[math.ceil(q * len(values)) - 1]
            assert quantile(bucket, q) == pytest.approx(true, rel=0.25), (median, q)
    assert quantile({}, 0.5) is None
    long = merge(history.increments(rollout(total_s=t)) for t in [10_000.0] * 3)
    assert quantile(long, 0.5) == LATENCY_EDGES_S[-1]
    b = merge(history.increments(rollout(total_s=t)) for t in [0.02] * 50 + [0.3] * 49 + [30.0])
    s = summary(merge([b, history.increments(rollout(ok=False))]), minutes=2.0)
    assert s["done_per_min"] == 50 and s["failed_per_min"] == 0.5 and s["failure_rate"] == pytest.approx(1 / 101)
    assert s["failures_by_kind"] == {"verifier": 1} and s["mean_reward"] == 1.0 and s["pass_rate"] == 1.0


def test_the_window_counts_the_current_minute_as_far_as_it_went():
    minutes, span = history.window(now=600 * 60 + 30, minutes=5)
    assert minutes == [596, 597, 598, 599, 600] and span == pytest.approx(4.5)


async def test_buckets_hold_what_the_settled_rollouts_say(redis_url, namespace):
    settings = make_settings(redis_url, namespace, max_attempts=1, sample_every=1, sample_keep=7)
    client = FarmClient(settings)
    rows = (
        [{"noop": {"reward": 1.0, "tokens": 8}}] * 12
        + [{"noop": {"reward": 0.25, "sleep_s": 0.05}}] * 6
        + [{"noop": {"fail": "fatal"}}] * 4
        + [{"noop": {"fail": "always"}}] * 3
    )
    tasks = [client.task(run_id="hist", agent="noop", row=r) for r in rows]
    async with in_process_worker(settings, concurrency=8):
        await client.submit(tasks)
        got = await client.collect(tasks, timeout_s=60)
    await client.aclose()
    r = redis.Redis.from_url(redis_url)
    keys = list(r.scan_iter(match=f"{namespace}:hist:noop:*"))
    assert keys and all(0 < r.ttl(k) <= settings.history_ttl_s for k in keys)
    bucket = merge(decode_bucket(r.hgetall(k)) for k in keys)
    rollouts = list(got.values())
    expected = merge(history.increments(x) for x in rollouts)
    for field in ("done", "failed", "reward_n", "passed", "tokens", "fail:verifier", "fail:agent_error"):
        assert bucket.get(field) == expected.get(field), field
    assert bucket["done"] == 18 and bucket["failed"] == 7 and bucket["tokens"] == 12 * 8
    assert history.run_counts(bucket) == {"hist": {"done": 18.0, "failed": 7.0, "cancelled": 0.0}}
    assert bucket["reward_sum"] == pytest.approx(12 * 1.0 + 6 * 0.25)
    lat_fields = {k for k in bucket if k.startswith("lt:")}
    for k in lat_fields - {"lat_sum"}:
        assert bucket[k] == expected[k], k
    assert r.xlen(settings.keys.samples("noop")) == 7, "the sample stream keeps sample_keep rollouts"
    r.close()


async def test_a_settle_replayed_or_done_elsewhere_is_counted_once(settings, sync_redis):
    r, stream, tasks, ids = await consumer_with_tasks(settings, 2)
    settler = Settler(r, Outage.for_settings(settings))
    settler.start()
    done = Rollout.for_task(tasks[0], status=Status.ok, reward=1.0, timings=Timings(total_s=0.2))
    op = stream.reply_op(ids[0], done, tasks[0].reply_to)
    assert await settler.run(op) == 1
    assert await settler.run(op) == 0, "the entry is no longer pending: not counted again"
    other = stream.reply_op(ids[1], Rollout.for_task(tasks[1], status=Status.ok, reward=0.5), tasks[1].reply_to)
    assert await run_script(r, other) == 1  # settled by "another worker", which counts it itself
    assert await settler.run(other) == 0
    await settler.close()  # writes the counts it still holds
    await r.aclose()
    assert op.history is not None
    bucket = decode_bucket(sync_redis.hgetall(op.history.bucket))
    assert bucket["done"] == 1.0 and bucket["reward_n"] == 1.0 and bucket["reward_sum"] == 1.0
    assert bucket["depth"] == 1.0, "the second task still waited when the first one's count was written"
    assert 0 < sync_redis.ttl(op.history.bucket) <= settings.history_ttl_s


async def test_dead_letters_are_capped_and_the_dropped_ones_counted(redis_url, namespace):
    settings = make_settings(redis_url, namespace, max_attempts=1, dead_maxlen=3)
    client = FarmClient(settings)
    tasks = [client.task(run_id="dead", agent="noop", row={"noop": {"fail": "always"}}) for _ in range(5)]
    async with in_process_worker(settings, concurrency=1):
        await client.submit(tasks)
        got = await client.collect(tasks, timeout_s=60)
    await client.aclose()
    assert all(x.error.kind == "agent_error" for x in got.values())
    r = redis.Redis.from_url(redis_url)
    assert r.xlen(settings.keys.dead("noop")) == 3
    stats = {k.decode(): int(v) for k, v in r.hgetall(settings.keys.stats("noop")).items()}
    assert stats["dead"] == 5 and stats["dead_dropped"] == 2
    r.close()


async def test_history_off_records_nothing_but_the_settle(redis_url, namespace):
    settings = make_settings(redis_url, namespace, history=False, sample_every=0)
    client = FarmClient(settings)
    tasks = [client.task(run_id="off", agent="noop", row={}) for _ in range(5)]
    async with in_process_worker(settings):
        await client.submit(tasks)
        await client.collect(tasks, timeout_s=60)
    await client.aclose()
    r = redis.Redis.from_url(redis_url)
    assert not list(r.scan_iter(match=f"{namespace}:hist:*")) and not r.exists(settings.keys.samples("noop"))
    r.close()


async def test_tasks_cancelled_while_queued_are_counted_as_a_running_tasks_cancel_is(settings, sync_redis):
    """A run's cancel answers its queued tasks at once (DRAIN, no worker settles them) and stops
    its running ones (the worker settles them): both are `cancelled` rollouts, and the minute's
    buckets count every one of them, for the agent and for the run."""
    client = FarmClient(settings)
    slow = [client.task(run_id="busy", agent="noop", row={"noop": {"sleep_s": 60}, "i": i}) for i in range(4)]
    queued = [client.task(run_id="waiting", agent="noop", row={"noop": {}, "i": i}) for i in range(6)]
    async with in_process_worker(settings, concurrency=4) as w:
        await client.submit(slow)
        while len(w.inflight) < 4:
            await asyncio.sleep(0.05)
        await client.submit(queued)  # no free slot: they stay in the run's queue
        drained = await client.cancel_run("waiting")
        running = await client.cancel_run("busy")
        got = await client.collect(slow + queued, timeout_s=20)
    await client.aclose()
    # The submit moved one task into the stream to wake a worker (its worker settles it): five drained.
    assert drained.drained == 5 and running.open_count == 4 and not running.drained
    assert {x.status for x in got.values()} == {Status.cancelled}
    keys = list(sync_redis.scan_iter(match=f"{settings.namespace}:hist:noop:*"))
    assert keys and all(0 < sync_redis.ttl(k) <= settings.history_ttl_s for k in keys)
    bucket = merge(decode_bucket(sync_redis.hgetall(k)) for k in keys)
    assert bucket["cancelled"] == 10, bucket
    runs = history.run_counts(bucket)
    assert runs["waiting"]["cancelled"] == 6 and runs["busy"]["cancelled"] == 4
    assert sum(bucket.get(f, 0) for f in history.LATENCY_FIELDS) == 10, "each one is in a latency bin"
    assert bucket.get("done", 0) == 0 and bucket.get("failed", 0) == 0
