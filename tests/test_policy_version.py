"""Rollouts record the policy version their generation started on, and the one it ended on when
the trainer announced a weight sync in between (farm/policy_version.py), against a real Redis.

The policy here is scripted and gated, so the test decides exactly when a sync is announced
relative to the model call; test_trainer.py repeats the mid-rollout case with a real vLLM
reloading real weights."""

from __future__ import annotations

import asyncio

import pytest
from helpers.policies import ScriptedPolicy

from envs.single_tool_call import SingleToolCall, generate
from farm.connection import connect
from farm.policy_version import PolicyVersions, announce_live, announce_loading
from farm.schema import Task
from farm.transport import Outage
from workers.loops.context import AgentContext
from workers.loops.loop import AgentLoop


class GatedPolicy(ScriptedPolicy):
    """Answers like ScriptedPolicy, but each call waits until the test opens the gate."""

    def __init__(self, tokenizer, turns):
        super().__init__(tokenizer, turns)
        self.called = asyncio.Event()
        self.gate = asyncio.Event()

    async def complete(self, prompt_ids, sampling, session):
        self.called.set()
        await self.gate.wait()
        return await super().complete(prompt_ids, sampling, session)


async def until(predicate, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.fixture
async def versions(settings):
    r = connect(settings)
    watch = PolicyVersions(r, settings.keys, Outage.for_settings(settings))
    await watch.start()
    yield watch
    await watch.aclose()
    await r.aclose()


async def rollout_with(tokenizer, settings, versions, during=None):
    """One single_tool_call rollout; `during(…)` runs while its model call is held open."""
    env = SingleToolCall()
    row = generate(1, seed=3)[0]
    policy = GatedPolicy(tokenizer, ["It is sunny."])
    agent = AgentLoop.over_tokens(env, policy, tokenizer)
    task = Task.new(run_id="v", agent="single_tool_call", row=row, reply_to="farm:results:v", policy_version=1)
    run = asyncio.create_task(agent.run(task, AgentContext(worker_id="t", settings=settings, versions=versions)))
    await asyncio.wait_for(policy.called.wait(), 10)
    if during is not None:
        await during()
    policy.gate.set()
    return await asyncio.wait_for(run, 30)


async def test_without_announcements_a_rollout_keeps_its_tasks_version(tokenizer, settings, versions):
    got = await rollout_with(tokenizer, settings, versions)
    assert got.policy_version == 1 and got.policy_version_end is None


async def test_a_rollout_records_the_version_it_started_and_ended_on(tokenizer, settings, versions, sync_redis):
    keys = settings.keys
    announce_live(sync_redis, keys, 4)
    await until(lambda: versions.live == 4)

    steady = await rollout_with(tokenizer, settings, versions)
    assert steady.policy_version == 4 and steady.policy_version_end is None  # the served version, not the task's

    async def sync_to_5():
        announce_loading(sync_redis, keys, 5)
        await until(lambda: versions.loading == 5)
        announce_live(sync_redis, keys, 5)
        await until(lambda: versions.live == 5)

    spanning = await rollout_with(tokenizer, settings, versions, sync_to_5)
    assert spanning.policy_version == 4 and spanning.policy_version_end == 5

    async def start_loading_6():
        announce_loading(sync_redis, keys, 6)
        await until(lambda: versions.loading == 6)

    still_loading = await rollout_with(tokenizer, settings, versions, start_loading_6)
    assert still_loading.policy_version == 5 and still_loading.policy_version_end == 6

    # Generation that starts while a sync is loading may have run on either set of weights.
    announce_live(sync_redis, keys, 6)
    await until(lambda: versions.live == 6 and versions.loading is None)
    after = await rollout_with(tokenizer, settings, versions)
    assert after.policy_version == 6 and after.policy_version_end is None
    assert int(sync_redis.get(keys.policy_version())) == 6 and sync_redis.get(keys.policy_next()) is None


async def test_a_watcher_started_mid_sync_reads_the_state_from_redis(settings, sync_redis):
    announce_live(sync_redis, settings.keys, 7)
    announce_loading(sync_redis, settings.keys, 8)
    r = connect(settings)
    watch = PolicyVersions(r, settings.keys, Outage.for_settings(settings))
    try:
        await watch.start()
        assert (watch.live, watch.loading) == (7, 8)
        mark = watch.mark()
        assert watch.span(mark) == (7, 8)  # loading at the start: the end version is the one loading
    finally:
        await watch.aclose()
        await r.aclose()


async def test_the_watcher_resubscribes_after_its_connection_is_killed(settings, sync_redis):
    """A dropped subscription is a gap in which a sync may have happened: the watcher re-reads
    Redis, and a rollout spanning the gap records the version it ended on."""
    import redis.asyncio

    name = f"pv-{settings.namespace}"[:60]
    r = redis.asyncio.Redis.from_url(settings.redis_url, client_name=name)  # names every connection it opens
    watch = PolicyVersions(r, settings.keys, Outage.for_settings(settings))
    try:
        await watch.start()
        mark = watch.mark()
        ours = [c["id"] for c in sync_redis.client_list() if c.get("name") == name and c.get("sub") != "0"]
        assert len(ours) == 1, sync_redis.client_list()
        sync_redis.set(settings.keys.policy_version(), 9)  # changed while the watcher is cut off
        sync_redis.client_kill_filter(_id=ours[0])
        await until(lambda: watch.live == 9, timeout_s=10)
        assert watch.span(mark) == (None, 9)
    finally:
        await watch.aclose()
        await r.aclose()
