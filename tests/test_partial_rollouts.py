"""Partial rollouts in the agent loop: an interrupt keeps every token generated so far (the open
turn's streamed ids included), and a continuation goes on from them token-exactly, on a fresh loop
(as on another worker), with the environment's state rebuilt and each token's policy version kept.

The policy is a scripted stand-in that streams its ids one at a time into the loop's sink, as the
tokens client does with `policy_stream` (no process: the model's answers must be tool calls SmolLM2
rarely writes right; tests/test_partial_vllm.py covers the real server)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from helpers.policies import StreamingScript, Versions, hermes

from envs.session_state import SessionState
from farm import schema
from farm.errors import RolloutFailure
from farm.schema import Status, Task
from workers.loops.context import AgentContext
from workers.loops.loop import AgentLoop

ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "Start at 3, add 1 then 2, and report."}]},
    "initial_count": 3,
    "expected_count": 6,
}
SCRIPT = [
    hermes("increment_counter", {"count": 1}),
    hermes("increment_counter", {"count": 2}),
    "The count is 6.",
]


def ctx(live: int) -> AgentContext:
    return AgentContext(worker_id="test", settings=None, versions=Versions(live))


async def interrupted_at(tokenizer, turn: int, ids: int, live: int = 3):
    policy = StreamingScript(tokenizer, SCRIPT, pause_at=(turn, ids))
    agent = AgentLoop.over_tokens(SessionState(), policy, tokenizer)
    task = Task.new(run_id="p", agent="session_state", row=ROW, reply_to="x")
    c = ctx(live)
    run = asyncio.ensure_future(agent.run(task, c))
    await asyncio.wait_for(policy.paused.wait(), 10)
    c.interrupts.add(task.task_id)
    run.cancel()
    return task, await run


async def straight(tokenizer):
    agent = AgentLoop.over_tokens(SessionState(), StreamingScript(tokenizer, SCRIPT), tokenizer)
    task = Task.new(run_id="p", agent="session_state", row=ROW, reply_to="x")
    return await agent.run(task, ctx(3))


def continuation_of(task: Task, rollout) -> Task:
    """What FarmClient.resume submits: the task again, carrying where it stopped (through the wire)."""
    again = msgspec.structs.replace(task, task_id="cont-" + task.task_id, resume=rollout.partial)
    return schema.decode_task(schema.entry(again), 1 << 20)


@pytest.mark.parametrize("turn,ids", [(0, 1), (1, 7), (2, 4)])
async def test_an_interrupt_keeps_every_token_and_a_continuation_ends_as_a_straight_run(tokenizer, turn, ids):
    task, cut = await interrupted_at(tokenizer, turn, ids)
    assert cut.status is Status.interrupted and cut.partial is not None
    p = cut.partial
    assert p.open_turn == ids and p.steps == turn, "the open turn's streamed ids are kept, not dropped"
    assert cut.metrics["generated_tokens"] == sum(p.trace.env_mask)
    assert p.tool_calls == [{"name": "increment_counter", "arguments": {"count": c}} for c in (1, 2)[:turn]]

    resumed_policy = StreamingScript(tokenizer, SCRIPT, start=(turn, ids))
    agent = AgentLoop.over_tokens(SessionState(), resumed_policy, tokenizer)  # a fresh loop: another worker
    final = await agent.run(continuation_of(task, cut), ctx(5))
    reference = await straight(tokenizer)

    assert final.status is Status.ok and final.reward == reference.reward == 1.0
    assert resumed_policy.prompts[0][-ids:] == list(p.trace.completion())[-ids:], "no re-tokenization"
    assert list(final.trace.prompt()) == list(reference.trace.prompt())
    assert list(final.trace.completion()) == list(reference.trace.completion())
    assert final.trace.mask() == reference.trace.mask()
    assert final.trace.turns == reference.trace.turns
    assert final.metrics["tool_calls"] == reference.metrics["tool_calls"] == 2
    versions = list(final.trace.token_versions(final.policy_version))
    before = len(p.trace.completion())
    assert set(versions[:before]) == {3} and set(versions[before:]) == {5}, "each token keeps its version"
    assert reference.trace.versions == b"", "one version throughout: none recorded per token"


async def test_a_tool_that_answers_differently_on_replay_fails_the_continuation(tokenizer):
    task, cut = await interrupted_at(tokenizer, 2, 3)
    changed = msgspec.structs.replace(
        cut.partial,
        output=[
            {**o, "output": "Counter is now 99"} if o.get("type") == "function_call_output" else o
            for o in cut.partial.output
        ],
    )
    agent = AgentLoop.over_tokens(SessionState(), StreamingScript(tokenizer, SCRIPT, start=(2, 3)), tokenizer)
    with pytest.raises(RolloutFailure, match="answered differently"):
        await agent.run(msgspec.structs.replace(task, resume=changed), ctx(3))


async def test_a_cancel_that_is_not_an_interrupt_still_cancels(tokenizer):
    policy = StreamingScript(tokenizer, SCRIPT, pause_at=(0, 2))
    agent = AgentLoop.over_tokens(SessionState(), policy, tokenizer)
    run = asyncio.ensure_future(agent.run(Task.new(run_id="p", agent="a", row=ROW, reply_to="x"), ctx(1)))
    await asyncio.wait_for(policy.paused.wait(), 10)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run


async def test_a_partial_from_another_model_is_refused(tokenizer):
    task, cut = await interrupted_at(tokenizer, 1, 2)
    other = msgspec.structs.replace(cut.partial, model="another-model")
    agent = AgentLoop.over_tokens(SessionState(), StreamingScript(tokenizer, SCRIPT, start=(1, 2)), tokenizer)
    c = AgentContext(worker_id="t", settings=msgspec.structs.replace(_settings(), policy_model="smollm2"))
    with pytest.raises(RolloutFailure, match="sampled by 'another-model'"):
        await agent.run(msgspec.structs.replace(task, resume=other), c)


def _settings():
    from farm.settings import Settings

    return Settings()
