"""Adaptive in-flight limits per policy replica (workers/policy/load.py, rotation.py's slots).

The law is driven directly with Samples (a fake metrics source: arithmetic over readings), the
rotation's slots with counters set by hand; the last test reads a real stub's /metrics in engine
mode through a real PolicyClient and checks the limit it sets.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from workers.policy.config import PolicyConfig
from workers.policy.load import BACKOFF, ESCALATED, Limit, Sample, parse_metrics
from workers.policy.rotation import Rotation, Session

URLS = [f"http://127.0.0.1:{9100 + i}" for i in range(2)]

# What vLLM 0.x's prometheus_client exporter writes (two engines of one replica), beside look-alikes.
VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 99.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 6.0
vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e9
vllm:num_preemptions_total{engine="1",model_name="m"} 1.0
"""


def test_parse_metrics_sums_engines_and_ignores_look_alikes():
    assert parse_metrics(VLLM_TEXT) == Sample(running=5.0, waiting=4.0, kv_usage=0.75, preemptions=7.0)
    assert parse_metrics("vllm:num_requests_running 1\nvllm:num_requests_waiting 2\n") == Sample(1, 2, 0.0, 0.0)


@pytest.mark.parametrize(
    "text", ["", "<html>not found</html>", 'vllm:num_requests_running{a="b"} 1\n', "vllm:num_requests_running x\n"]
)
def test_unreadable_metrics_are_none(text):
    assert parse_metrics(text) is None


def reading(running=8.0, waiting=0.0, kv=0.5, preemptions=0.0) -> Sample:
    return Sample(running, waiting, kv, preemptions)


def test_the_limit_starts_at_the_ceiling_and_is_cut_on_preemption_then_holds_while_draining():
    limit = Limit(floor=2, ceiling=64, kv_high=0.9)
    assert limit.cap is None  # no reading: no limit
    assert limit.observe(reading(running=30, waiting=34, kv=0.99), inflight=64) == "start"
    assert limit.cap == 64
    # 3 preemptions: cut to BACKOFF x the share it runs (64 in flight, 30 of 64 running there).
    assert limit.observe(reading(running=30, waiting=34, kv=0.99, preemptions=3), inflight=64) == "cut"
    assert limit.cap == int(BACKOFF * 30)
    # Still above the limit: the replica's signals are the overload already cut for.
    assert limit.observe(reading(running=28, waiting=30, kv=0.99, preemptions=9), inflight=50) == "hold"
    assert limit.cap == int(BACKOFF * 30)
    # Drained, and it preempts again: the overload outlived the drain, so the cut is harder.
    assert limit.observe(reading(running=20, waiting=0, kv=0.99, preemptions=12), inflight=20) == "cut"
    assert limit.cap == int(ESCALATED * 20)


def test_the_limit_grows_while_the_replica_is_clear_and_the_limit_binds():
    limit = Limit(floor=2, ceiling=64, kv_high=0.9)
    limit.observe(reading(preemptions=5), inflight=40)
    limit.observe(reading(running=40, preemptions=6), inflight=40)  # cut to 30
    limit.observe(reading(running=30, preemptions=6), inflight=30)  # drained: clear, binding
    assert limit.cap is not None and limit.cap > 30
    before = limit.value
    assert limit.observe(reading(running=10, kv=0.2, preemptions=6), inflight=10) == "hold"  # not binding
    assert limit.observe(reading(running=32, kv=0.95, preemptions=6), inflight=32) == "hold"  # KV high
    assert limit.observe(reading(running=32, waiting=1, preemptions=6), inflight=32) == "hold"  # a queue
    assert limit.value == before
    for _ in range(100):
        limit.observe(reading(running=64, kv=0.5, preemptions=6), inflight=64)
    assert limit.cap == 64  # never past the worker's connections


def test_a_queue_at_two_polls_in_a_row_shrinks_the_limit_to_no_less_than_what_runs():
    limit = Limit(floor=2, ceiling=100, kv_high=0.9)
    limit.observe(reading(running=40, waiting=60), inflight=100)
    assert limit.observe(reading(running=40, waiting=60), inflight=100) == "shrink"
    assert limit.cap == 90
    for _ in range(50):
        limit.observe(reading(running=40, waiting=60), inflight=100)
    assert limit.cap == 40  # the share the replica runs


def test_a_restarted_servers_counter_is_no_preemption():
    limit = Limit(floor=2, ceiling=64, kv_high=0.9)
    limit.observe(reading(preemptions=500), inflight=10)
    assert limit.observe(reading(preemptions=0), inflight=10) != "cut"


def rotation(**kw) -> Rotation:
    return Rotation(PolicyConfig(urls=URLS, model="m", **kw), probes=False)


async def test_a_replica_at_its_limit_takes_nothing_and_its_sessions_wait_for_a_slot():
    rot = rotation()
    a, b = rot.replicas
    first = Session(group="g", key="1")
    assert rot.pick(first) is not None
    home = first.replica
    other = b if home is a else a
    home.cap, home.outstanding = 1, 1
    # The group's next sample waits for its home (not crowded), instead of spilling to the idle one.
    second = Session(group="g", key="2")
    assert rot.pick(second) is None and second.wanted is home
    # A new group goes where there is room.
    assert rot.pick(Session(group="h", key="3")) is other
    # The slot opens when the request there ends: the waiter is woken by the answer, not its timer.
    waiter = asyncio.ensure_future(rot.take(second, time.monotonic() + 5))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    started = time.monotonic()
    rot.ok(home)
    home.outstanding -= 1  # the caller frees its slot right after ok(), in the same step
    assert await waiter is home
    assert time.monotonic() - started < 0.1
    # Every replica at its limit: a new group waits for any, and gives up at its deadline.
    other.cap, other.outstanding, home.outstanding = 1, 1, 1
    started = time.monotonic()
    assert await rot.take(Session(group="k", key="4"), time.monotonic() + 0.3) is None
    assert 0.25 < time.monotonic() - started < 1.0


async def test_without_limits_placement_is_unchanged():
    rot = rotation()
    sessions = [Session(group="g", key=str(i)) for i in range(8)]
    assert len({id(rot.pick(s)) for s in sessions}) == 1  # one home, nobody waits
    assert rot.load is None  # adaptive_load off: no poll at all
    assert rotation(adaptive_load=True).load is None  # and none where probes are off (hosted APIs)


@pytest.mark.slow
@pytest.mark.quiet  # a stub starved of a core by the parallel run queues requests: then it is not idle
async def test_a_real_stub_that_preempts_gets_a_lower_limit_and_an_idle_one_keeps_its_own(tmp_path):
    from helpers.policies import stub_processes

    from workers.policy.stub import Script
    from workers.policy.tokens import PolicyClient

    script = Script(token_replies=[[100 + i for i in range(39)] + [2]], model="m")
    engine = {"engine": True, "step_s": 0.005, "step_s_per_seq": 0.0}
    with stub_processes(script, tmp_path, latency_s=0.0) as start:
        tight = start(kv_capacity_tokens=1500, **engine)  # ~10 fit at 140 tokens; 32 sent
        roomy = start(kv_capacity_tokens=1_000_000, **engine)
        for stub in (tight, roomy):
            cfg = PolicyConfig(urls=[stub.url], model="m", max_connections=32, adaptive_load=True, load_poll_s=0.1)
            client = PolicyClient(cfg)
            stop = asyncio.Event()

            async def loop(i: int) -> None:
                k = 0
                while not stop.is_set():
                    session = Session(group=f"{i}-{k}", key=f"{i}-{k}")
                    await client.complete(list(range(1, 101)), {"max_tokens": 64}, session)
                    session.end()
                    k += 1

            tasks = [asyncio.ensure_future(loop(i)) for i in range(32)]
            try:
                await asyncio.sleep(4.0)
                replica, limit = client.replicas[0], client.rotation.load.limits[stub.url]
                cap, cuts = replica.cap, limit.cuts
            finally:
                stop.set()
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await client.aclose()
            if stub is tight:
                assert tight.stats()["engine"]["preemptions"] > 0
                assert cuts >= 1 and cap is not None and cap < 32, (cap, cuts)
            else:
                assert roomy.stats()["engine"]["preemptions"] == 0
                assert cuts == 0 and cap == 32


def test_the_workers_settings_turn_adaptive_load_on_and_bad_values_are_refused():
    from farm.settings import Settings, load_settings
    from workers.policy.config import PolicyConfig

    s = load_settings(env={"FARM_POLICY_ADAPTIVE_LOAD": "1", "FARM_POLICY_LOAD_FLOOR": "2"})
    c = PolicyConfig.from_settings(s)
    assert (c.adaptive_load, c.load_floor, c.load_poll_s, c.load_kv_high) == (True, 2, 0.5, 0.9)
    assert PolicyConfig.from_settings(Settings()).adaptive_load is False
    for bad in ({"policy_load_kv_high": 1.5}, {"policy_load_floor": 0}, {"policy_load_poll_s": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Settings(**bad)
