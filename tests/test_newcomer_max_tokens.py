"""An environment's own max_tokens under the task's is recorded, not silent: the rollout's metrics
say `max_tokens` and `max_tokens_capped_by: "environment"`, and a rollout truncated by a turn that
reached the limit says `stop_reason: "length"`. The model is a stand-in in this process that cuts
its reply at max_tokens as vLLM does (finish_reason `length`): the test is about what the loop
records, and it needs no model."""

from __future__ import annotations

import asyncio

from envs.sdk import AgentSettings, Environment, Row, Transcript, Verdict
from farm.client import FarmClient
from farm.schema import Sampling, Status
from workers.delivery.runtime import Worker
from workers.loops.loop import AgentLoop
from workers.policy.tokens import Completion


class Capped(Environment):
    name = "capped"
    agent = AgentSettings(loop="single_turn", max_steps=1, sampling={"max_tokens": 3})
    row_type = Row

    async def verify(self, row: Row, state: None, transcript: Transcript) -> Verdict:
        return Verdict(reward=1.0)


class Cutting:
    """Answers eight ids (the last the EOS), cut at max_tokens with finish_reason `length`."""

    def __init__(self, eos: int):
        self.eos = eos
        self.asked: list[int] = []

    async def max_model_len(self, session):
        return None

    async def complete(self, prompt_ids, sampling, session):
        ids = [5] * 7 + [self.eos]
        limit = sampling.get("max_tokens")
        self.asked.append(limit)
        finish = "stop"
        if limit is not None and limit < len(ids):
            ids, finish = ids[:limit], "length"
        return Completion(ids, [-0.1] * len(ids), "", finish, "stand-in", 0.0)

    async def aclose(self):
        return None


async def rollouts(settings, tokenizer, max_tokens: list[int | None]) -> tuple[list, list]:
    model = Cutting(tokenizer.eos_id)
    worker = Worker(settings, "capped", AgentLoop.over_tokens(Capped(), model, tokenizer), concurrency=1)
    run = asyncio.create_task(worker.run())
    try:
        async with FarmClient(settings) as client:
            row = {"responses_create_params": {"input": "hi"}}
            tasks = [
                client.task(run_id="cap", agent="capped", row=row, sampling=Sampling(max_tokens=m)) for m in max_tokens
            ]
            await client.submit(tasks, check_agents=False)
            got = await client.collect(tasks, timeout_s=60)
    finally:
        worker.request_stop()
        await asyncio.wait_for(run, 30)
    return [got[t.task_id] for t in tasks], model.asked


async def test_the_environments_cap_and_the_stop_reason_are_recorded(settings, tokenizer):
    (capped, task_lower, unset), asked = await rollouts(settings, tokenizer, [128, 2, None])
    assert sorted(asked) == [2, 3, 3]
    assert capped.status is Status.truncated, capped.error
    assert capped.metrics["max_tokens"] == 3 and capped.metrics["max_tokens_capped_by"] == "environment"
    assert capped.metrics["stop_reason"] == "length"
    assert unset.metrics["max_tokens_capped_by"] == "environment", "the task set none: the environment's is the cap"
    # The negative control: the task's own lower max_tokens is no surprise, and is not flagged.
    assert task_lower.status is Status.truncated and task_lower.metrics["stop_reason"] == "length"
    assert "max_tokens_capped_by" not in task_lower.metrics and "max_tokens" not in task_lower.metrics
