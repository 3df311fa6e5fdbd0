"""TRL classes through the agent loop (workers/loops/loop.py) in this process: what `reset` returns
reaches the first prompt once (a continuation's prompt keeps it, never twice), a row of a dict of
factories is shown its environment's tools only, and 1,024 rollouts in flight share a pool that
never holds more instances than were in flight.

The model is a scripted stand-in (SmolLM2 rarely writes a tool call right; these tests are about the
loop): its replies are token ids through SmolLM2's real tokenizer and chat template.
"""

from __future__ import annotations

import asyncio
import time

import msgspec
from helpers.policies import ScriptedPolicy, StreamingScript, Versions, hermes

from envs.factory import FactoryEnvironment
from envs.sdk import load_env
from farm import schema
from farm.rows import normalize_row
from farm.schema import Status, Task
from workers.loops.context import AgentContext
from workers.loops.loop import AgentLoop
from workers.policy.tokens import Completion

OBSERVATION = " The counter is at 1."
ROW = {"prompt": [{"role": "user", "content": "Bring the counter to 4."}], "target": 4, "start": 1}
SCRIPT = [hermes("increment", {"by": 1}), hermes("double"), "The counter is at 4."]


def counter_env(factory="helpers.trl_envs:Counter") -> FactoryEnvironment:
    env = load_env("environment_factory", {"factory": factory, "reward_funcs": ["helpers.trl_envs:exact"]})
    assert isinstance(env, FactoryEnvironment)
    return env


def ctx(live: int = 1) -> AgentContext:
    return AgentContext(worker_id="test", settings=None, versions=Versions(live))


def task(row=ROW) -> Task:
    return Task.new(run_id="f", agent="counter", row=normalize_row(row), reply_to="x")


class Recording(ScriptedPolicy):
    """The scripted policy, keeping every prompt it was sent."""

    def __init__(self, tokenizer, turns):
        super().__init__(tokenizer, turns)
        self.prompts: list[list[int]] = []

    async def complete(self, prompt_ids, sampling, session):
        self.prompts.append(list(prompt_ids))
        return await super().complete(prompt_ids, sampling, session)


async def test_the_reset_observation_is_in_the_first_prompt_once_and_the_rollout_earns_its_reward(tokenizer):
    env = counter_env()
    policy = Recording(tokenizer, SCRIPT)
    rollout = await AgentLoop.over_tokens(env, policy, tokenizer).run(task(), ctx())
    assert rollout.status is Status.ok, rollout.error
    first = tokenizer.decode(policy.prompts[0])
    assert first.count(OBSERVATION) == 1 and "Bring the counter to 4." + OBSERVATION in first
    assert policy.prompts[0] == list(rollout.trace.prompt())
    assert all(tokenizer.decode(p).count(OBSERVATION) == 1 for p in policy.prompts)  # later turns extend it
    assert rollout.reward_components == {"exact": 1.0, "Counter": 1.0} and rollout.reward == 2.0
    assert rollout.metrics["tool_calls"] == 2 and rollout.metrics["tool_errors"] == 0
    assert env.pools[None].made == 1 and len(env.pools[None].free) == 1  # the probe served, then went back


async def test_a_continuation_keeps_the_recorded_prompt_and_appends_nothing_again(tokenizer):
    env = counter_env()
    policy = StreamingScript(tokenizer, SCRIPT, pause_at=(1, 3))
    t, c = task(), ctx(3)
    run = asyncio.ensure_future(AgentLoop.over_tokens(env, policy, tokenizer).run(t, c))
    await asyncio.wait_for(policy.paused.wait(), 10)
    c.interrupts.add(t.task_id)
    run.cancel()
    cut = await run
    assert cut.status is Status.interrupted and cut.partial is not None
    again = schema.decode_task(schema.entry(msgspec.structs.replace(t, task_id="cont", resume=cut.partial)), 1 << 20)
    resumed = StreamingScript(tokenizer, SCRIPT, start=(1, 3))
    final = await AgentLoop.over_tokens(env, resumed, tokenizer).run(again, ctx(3))
    assert final.status is Status.ok and final.reward == 2.0, final.error  # the state rebuilt: reset, then the calls
    assert tokenizer.decode(resumed.prompts[0]).count(OBSERVATION) == 1
    assert list(final.trace.prompt()) == list(cut.partial.trace.prompt())


async def test_a_row_of_a_dict_of_factories_sees_only_its_environments_tools(tokenizer):
    env = load_env(
        "environment_factory",
        {
            "factory": {"counter": "helpers.trl_envs:Counter", "echo": "helpers.trl_envs:Echo"},
            "reward_funcs": ["helpers.trl_envs:abstains", "helpers.trl_envs:exact"],
        },
    )
    policy = Recording(tokenizer, [hermes("echo", {"text": "4"}), "4"])
    row = {"prompt": [{"role": "user", "content": "Say 4."}], "environment": "echo", "target": 4}
    rollout = await AgentLoop.over_tokens(env, policy, tokenizer).run(task(row), ctx())
    first = tokenizer.decode(policy.prompts[0])
    assert '"name": "echo"' in first and '"name": "increment"' not in first
    assert rollout.status is Status.ok and rollout.reward_components == {"exact": 1.0}, rollout.error


class Gate:
    """A policy that holds every call until `n` are waiting at once, then answers them all: every
    rollout is in flight together. Each task's turns follow SCRIPT."""

    def __init__(self, tokenizer, n: int):
        self.tok, self.n = tokenizer, n
        self.waiting, self.peak = 0, 0
        self.open = asyncio.Event()
        self.turn: dict[str, int] = {}
        self.replies = [tokenizer.encode(t) + [tokenizer.eos_id] for t in SCRIPT]

    async def max_model_len(self, session):
        return None

    async def complete(self, prompt_ids, sampling, session):
        self.waiting += 1
        self.peak = max(self.peak, self.waiting)
        if self.waiting >= self.n:
            self.open.set()
        await self.open.wait()
        self.waiting -= 1
        turn = self.turn.get(session.key, 0)
        self.turn[session.key] = turn + 1
        ids = self.replies[turn]
        return Completion(ids, [-0.1] * len(ids), "", "stop", "scripted", 0.0)

    async def aclose(self):
        return None


async def test_1024_rollouts_in_flight_share_a_pool_no_larger_than_that(tokenizer):
    env = counter_env()
    for wave, n in enumerate((1024, 256)):  # the second wave draws every instance from the pool
        gate = Gate(tokenizer, n)
        loop = AgentLoop.over_tokens(env, gate, tokenizer)
        started = time.perf_counter()
        got = await asyncio.gather(*(loop.run(task(), ctx()) for _ in range(n)))
        elapsed = time.perf_counter() - started
        assert gate.peak == n, "every rollout was in flight at once"
        assert [r.reward for r in got] == [2.0] * n, {r.error for r in got}
        assert env.pools[None].made == 1024 and len(env.pools[None].free) == 1024  # made in the first wave only
        assert elapsed < 120, f"wave {wave}: {elapsed:.1f}s"
