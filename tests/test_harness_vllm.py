"""Token exactness through the gateway, against the real embedded vLLM serving SmolLM2.

The same single_tool_call rows go through the farm's own agent loop and through the plain-SDK
harness (examples/harnesses/plain_sdk.py) at batch size 1 with greedy sampling: the two traces
must be the same ids (prompt, completion, env_mask) with logprobs within 1e-4, which holds only
if the gateway's prompts are the native loop's (the bridge never re-renders what the model said).
SmolLM2 answers these rows without calling the tool, so a second comparison gives the rows
follow-up user turns (the native `multi_turn` loop, and the same SDK loop sending them): every
later prompt there is built by the bridge. Sampled rollouts then check that every sampled id in a
harness trace is what vLLM returned.
"""

from __future__ import annotations

import asyncio

import pytest
from helpers.redis import make_settings

from envs.single_tool_call import generate
from farm.agent_config import AgentConfig
from farm.schema import Sampling, Task
from workers.loops.agent import load_agent
from workers.loops.context import AgentContext

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def agent_settings(vllm, model_dir):
    return make_settings(
        "redis://127.0.0.1:6379",
        "exact",
        policy_urls=[vllm.url],
        policy_model=vllm.served_model_name,
        policy_tokenizer=str(model_dir),
        agents={
            "via_sdk": AgentConfig(env="single_tool_call", harness="examples.harnesses.plain_sdk:run"),
            "native_turns": AgentConfig(env="single_tool_call", loop="multi_turn"),
            "sdk_turns": AgentConfig(env="single_tool_call", harness="examples.harnesses.follow_ups:run"),
        },
    )


async def rollouts(agent, rows, sampling, concurrency=1):
    ctx = AgentContext("exact", agent.farm if hasattr(agent, "farm") else None)
    gate = asyncio.Semaphore(concurrency)

    async def one(i, row):
        async with gate:
            task = Task.new(run_id="r", agent="a", row=row, reply_to="farm:results:r", sampling=sampling(i))
            return await agent.run(task, ctx)

    if hasattr(agent, "setup"):
        await agent.setup()
    try:
        return await asyncio.gather(*(one(i, r) for i, r in enumerate(rows)))
    finally:
        await agent.aclose()


def compare(native, harness):
    """Identical traces, rollout by rollout; the number of model turns compared."""
    compared_turns = 0
    for n, h in zip(native, harness):
        assert n.ok and h.ok, (n.error, h.error)
        assert h.segments == [] and h.metrics["retokenized_tokens"] == 0
        assert list(h.trace.prompt()) == list(n.trace.prompt())
        assert list(h.trace.completion()) == list(n.trace.completion())
        assert h.trace.mask() == n.trace.mask()
        worst = max(abs(a - b) for a, b in zip(h.trace.completion_logprobs(), n.trace.completion_logprobs()))
        assert worst <= 1e-4
        assert h.reward == n.reward
        compared_turns += len(h.trace.turns)
    return compared_turns


def test_greedy_rollouts_are_token_identical_to_the_native_loop(vllm, model_dir):
    settings = agent_settings(vllm, model_dir)
    rows = generate(4, seed=3)
    greedy = lambda i: Sampling(temperature=0.0, max_tokens=48)  # noqa: E731
    native = asyncio.run(rollouts(load_agent("single_tool_call", settings), rows, greedy))
    harness = asyncio.run(rollouts(load_agent("via_sdk", settings), rows, greedy))
    assert compare(native, harness) == len(rows)
    # Later turns: each row's follow-ups, so the bridge builds every prompt after the first.
    turns = [{**r, "follow_up_messages": ["Thanks. And tomorrow?", "Say it in one word."]} for r in rows]
    greedy = lambda i: Sampling(temperature=0.0, max_tokens=24)  # noqa: E731
    native = asyncio.run(rollouts(load_agent("native_turns", settings), turns, greedy))
    harness = asyncio.run(rollouts(load_agent("sdk_turns", settings), turns, greedy))
    assert compare(native, harness) > len(rows)


def test_sampled_harness_rollouts_keep_every_sampled_id(vllm, model_dir):
    settings = agent_settings(vllm, model_dir)
    rows = generate(24, seed=5)
    got = asyncio.run(
        rollouts(load_agent("via_sdk", settings), rows, lambda i: Sampling(max_tokens=48, seed=i), concurrency=8)
    )
    assert all(r.ok for r in got), [r.error for r in got if not r.ok]
    assert sum(r.metrics["retokenized_tokens"] for r in got) == 0
    assert sum(r.metrics["completion_tokens"] for r in got) > 0
