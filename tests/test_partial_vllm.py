"""Partial rollouts against the real vLLM: a greedy generation interrupted mid-turn (its streamed ids
kept) and continued by a fresh loop and client, as on another worker, ends with exactly the token
ids a straight run produces; the per-token versions say which tokens came before the interrupt."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from helpers.policies import Versions

from envs.sdk import AgentSettings
from envs.session_state import SessionState
from farm.schema import Sampling, Status, Task
from workers.loops.context import AgentContext
from workers.loops.loop import AgentLoop
from workers.policy.tokens import PolicyClient, PolicyConfig

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "Tell me a short story about a lighthouse."}]},
    "initial_count": 0,
    "expected_count": 1,
}


class Watched(PolicyClient):
    """The tokens client, keeping the sink of its current request where the test can watch it."""

    sink = None

    async def complete(self, prompt_ids, sampling, session, sink=None):
        self.sink = sink
        return await super().complete(prompt_ids, sampling, session, sink=sink)


def loop(vllm, tokenizer):
    client = Watched(PolicyConfig(urls=[vllm.url], model=vllm.served_model_name, stream=True))
    agent = AgentLoop.over_tokens(SessionState(), client, tokenizer, AgentSettings(loop="single_turn"))
    return agent, client


def ctx(live):
    return AgentContext(worker_id="t", settings=None, versions=Versions(live))


async def test_a_greedy_turn_interrupted_and_continued_elsewhere_matches_a_straight_run(vllm, tokenizer):
    task = Task.new(run_id="pv", agent="s", row=ROW, reply_to="x", sampling=Sampling(temperature=0.0, max_tokens=48))
    agent, _ = loop(vllm, tokenizer)
    straight = await agent.run(task, ctx(1))
    await agent.aclose()
    want = list(straight.trace.completion())
    assert len(want) > 16, "a turn long enough to interrupt in the middle"

    agent, client = loop(vllm, tokenizer)
    c = ctx(1)
    run = asyncio.ensure_future(agent.run(task, c))
    while client.sink is None or len(client.sink.ids) < 8:
        await asyncio.sleep(0.002)
        assert not run.done(), "the turn ended before it could be interrupted"
    c.interrupts.add(task.task_id)
    run.cancel()
    cut = await run
    await agent.aclose()
    assert cut.status is Status.interrupted
    kept = list(cut.partial.trace.completion())
    assert 8 <= len(kept) < len(want) and cut.partial.open_turn == len(kept)
    assert kept == want[: len(kept)], "the streamed ids are the ones the straight run sampled"

    agent, client = loop(vllm, tokenizer)  # another worker: a fresh loop and client
    again = msgspec.structs.replace(task, task_id="cont", resume=cut.partial)
    final = await agent.run(again, ctx(2))
    await agent.aclose()
    assert list(final.trace.completion()) == want
    assert list(final.trace.prompt()) == list(straight.trace.prompt())
    versions = list(final.trace.token_versions(0))
    assert versions == [1] * len(kept) + [2] * (len(want) - len(kept))
