"""A sampling value the model server refuses (vLLM's 400, e.g. top_p 1.5) is a `policy` failure at
once, naming the parameter: every retry would be refused the same way, so it is not retried and
not dead-lettered as a crash. Against the policy stub, which answers such values as vLLM does."""

from __future__ import annotations

import asyncio

import pytest
from helpers.policies import stub_processes

from envs.sdk import AgentSettings, Environment, Row, Transcript, Verdict
from farm.client import FarmClient
from farm.schema import ErrorKind, Status
from workers.delivery.runtime import Worker
from workers.loops.loop import AgentLoop
from workers.policy.stub import Script
from workers.policy.tokens import PolicyClient, PolicyConfig, PolicyRejected, Session


class Echo(Environment):
    """Any answer scores 1: the test is about the request, not the grade."""

    name = "echo"
    agent = AgentSettings(loop="single_turn", max_steps=1, sampling={"top_p": 1.5})
    row_type = Row

    async def verify(self, row: Row, state: None, transcript: Transcript) -> Verdict:
        return Verdict(reward=1.0)


@pytest.mark.slow
async def test_a_refused_sampling_value_fails_once_as_policy_naming_it(settings, tokenizer, tmp_path, sync_redis):
    with stub_processes(Script(token_replies=[[5, 6, tokenizer.eos_id]], model="m"), tmp_path) as start:
        stub = start(latency_s=0.01)
        client = PolicyClient(PolicyConfig(urls=[stub.url], model="m"))
        with pytest.raises(PolicyRejected) as direct:
            await client.complete([1, 2], {"temperature": -1.0}, Session())
        assert "`temperature`" in direct.value.message and "must be non-negative" in direct.value.message
        assert not direct.value.retryable
        worker = Worker(settings, "echo", AgentLoop.over_tokens(Echo(), client, tokenizer), concurrency=2)
        run = asyncio.create_task(worker.run())
        try:
            async with FarmClient(settings) as farm:
                task = farm.task(run_id="refused", agent="echo", row={"responses_create_params": {"input": "hi"}})
                await farm.submit([task], check_agents=False)
                rollout = (await farm.collect([task], timeout_s=60))[task.task_id]
        finally:
            worker.request_stop()
            await asyncio.wait_for(run, 30)
        assert stub.stats()["status 400"] == 2, "one request each: the refusal was not retried"
    assert rollout.status is Status.failed and rollout.error.kind is ErrorKind.policy
    assert rollout.attempt == 1 and not rollout.history
    message = rollout.error.message
    assert "parameter `top_p`" in message and "top_p must be in (0, 1], got 1.5" in message, message
    assert sync_redis.xlen(settings.keys.dead("echo")) == 0, "no dead letter"


def test_an_older_vllm_body_without_param_is_named_from_its_message():
    """vLLM before its `error` envelope answered `{"object": "error", "message": ..., "param": null}`:
    the parameter is the request key its message names."""
    from workers.policy.tokens import _refusal

    raw = b'{"object":"error","message":"top_p must be in (0, 1], got 1.5.","type":"BadRequestError","param":null}'
    request = b'{"model":"m","prompt":[1],"top_p":1.5,"temperature":1.0,"max_tokens":8}'
    said = _refusal("http://x", 400, raw, request)
    assert said.startswith("the policy refused the request (HTTP 400) over its parameter `top_p`: top_p must be")
    assert _refusal("http://x", 404, b"not json", request).endswith(": not json (http://x)")
