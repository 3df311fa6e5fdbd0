"""Hosted and OpenAI-compatible policies (policy_kind chat / responses) through the openai client.

Most tests run against bench/policy_stub.py, a real HTTP server in a process of its own that
answers with scripted chat / Responses replies and injects faults on demand: the client, the
loop, the error mapping and the worker are the real ones, and only the model is scripted
(SmolLM2 rarely calls tools right, so rewards could not be asserted against it). The test
marked `vllm` runs the chat kind against the real vLLM and asserts on the rollout's shape.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from helpers import ROOT
from helpers.processes import stop
from helpers.workers import worker_env

from farm.client import FarmClient
from farm.embedded import free_port
from farm.errors import ConfigError, RolloutFailure
from farm.schema import Rollout, Sampling, Status, Task
from farm.settings import load_settings
from workers.loops.agent import AgentContext, policy_agent
from workers.policy.stub import Script, StubProcess

pytestmark = pytest.mark.slow

KEY = "sk-test-5ecr3t-do-not-log-0123456789"
WEATHER = [
    {"content": None, "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]},
    {"content": "It is sunny in Paris."},
]


def row(city: str = "Paris", content: str | None = None) -> dict:
    return {
        "responses_create_params": {
            "input": [
                {"role": "system", "content": "Use the get_weather tool before answering."},
                {"role": "user", "content": content or f"What is the weather in {city}?"},
            ]
        },
        "agent_ref": {"type": "responses_api_agents", "name": "single_tool_call"},
        "expected_city": city,
    }


def task(r: dict, sampling: Sampling | None = None) -> Task:
    return Task.new(run_id="hosted", agent="single_tool_call", row=r, reply_to="unused", sampling=sampling)


@pytest.fixture
def stub(tmp_path):
    server = StubProcess(Script(chat_replies=WEATHER), latency_s=0.05, workdir=tmp_path).start()
    yield server
    server.stop()


def hosted(settings, url: str, kind: str = "chat", **kw):
    return settings.replace(policy_urls=[url], policy_kind=kind, policy_model="stub", **kw)


async def run_one(s, r: dict, sampling: Sampling | None = None) -> Rollout:
    agent = policy_agent("single_tool_call", s)
    try:
        return await agent.run(task(r, sampling), AgentContext("test", s))
    finally:
        await agent.aclose()


@pytest.mark.parametrize("kind", ["chat", "responses"])
async def test_single_tool_call_end_to_end(stub, settings, kind):
    got = await run_one(hosted(settings, stub.url, kind), row("Paris"))
    assert got.status is Status.ok and got.reward == 1.0
    assert got.trainable is False and got.trace is None
    assert [o["type"] for o in got.output] == ["function_call", "function_call_output", "message"]
    assert json.loads(got.output[0]["arguments"]) == {"city": "Paris"}
    assert got.output[1]["call_id"] == got.output[0]["call_id"]
    assert got.output[2]["content"][0]["text"] == "It is sunny in Paris."
    assert got.metrics["turns"] == 2 and got.metrics["tool_calls"] == 1 and got.metrics["bad_tool_calls"] == 0
    assert got.metrics["prompt_tokens"] == 20 and got.metrics["completion_tokens"] == 10  # the stub's usage
    path = "/v1/chat/completions" if kind == "chat" else "/v1/responses"
    assert stub.stats()[f"POST {path}"] == 2
    # Negative control: the same calls for a row that asks about another city score 0.
    other = await run_one(hosted(settings, stub.url, kind), row("Tokyo"))
    assert other.status is Status.ok and other.reward == 0.0


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
async def test_base_url_with_or_without_v1(stub, settings, suffix):
    s = hosted(settings, stub.url + suffix)
    assert s.policy_urls == [stub.url]
    got = await run_one(s, row())
    assert got.reward == 1.0 and stub.stats()["POST /v1/chat/completions"] == 2


async def test_hermes_tags_in_text_are_tool_calls(tmp_path, settings):
    """A model served without a tool parser writes its calls in the text; bad ones go back as errors."""
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    script = Script(
        chat_replies=[{"content": "<tool_call>{not json</tool_call>"}, {"content": call}, {"content": "Sunny."}]
    )
    with StubProcess(script, latency_s=0.01, workdir=tmp_path) as server:
        got = await run_one(hosted(settings, server.url), row())
    assert got.status is Status.ok and got.reward == 1.0
    assert got.metrics["bad_tool_calls"] == 1 and got.metrics["tool_calls"] == 1 and got.metrics["turns"] == 3
    assert got.output[1]["type"] == "function_call" and got.output[1]["status"] == "incomplete"
    assert got.output[2]["output"].startswith("Error: invalid JSON")


async def test_rollouts_spread_over_replicas_and_share_one_client_each(tmp_path, settings):
    with (
        StubProcess(Script(chat_replies=WEATHER), latency_s=0.1, workdir=tmp_path) as a,
        StubProcess(Script(chat_replies=WEATHER), latency_s=0.1, workdir=tmp_path) as b,
    ):
        s = settings.replace(policy_urls=[a.url, b.url + "/v1"], policy_kind="chat", policy_model="stub")
        agent = policy_agent("single_tool_call", s)
        try:
            got = await asyncio.gather(*(agent.run(task(row()), AgentContext("test", s)) for _ in range(8)))
            clients = list(agent.policy.clients)
            await agent.run(task(row()), AgentContext("test", s))
            assert agent.policy.clients == clients and all(c is not None for c in clients)
        finally:
            await agent.aclose()
        counts = [server.stats().get("POST /v1/chat/completions", 0) for server in (a, b)]
    assert all(r.reward == 1.0 for r in got)
    assert sum(counts) == 18 and min(counts) >= 6
    assert all(n % 2 == 0 for n in counts)  # each rollout kept its replica for both turns


def test_the_aiohttp_transport_is_used():
    import openai

    from workers.policy.openai_pool import _http_client

    assert isinstance(_http_client(16), openai.DefaultAioHttpClient)


@pytest.mark.parametrize("fault", [500, 503, 429])
async def test_server_errors_are_retried_then_fail_retryable(stub, settings, fault):
    stub.control(fault=fault, retry_after=0.1)
    with pytest.raises(RolloutFailure) as info:
        await run_one(hosted(settings, stub.url, policy_max_retries=2), row())
    assert info.value.kind == "policy" and info.value.retryable
    assert f"HTTP {fault}" in info.value.message and "after 3 tries" in info.value.message
    assert stub.stats()[f"status {fault}"] == 3  # openai's own retries: 1 + policy_max_retries


async def test_connection_refused_fails_retryable(settings):
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RolloutFailure) as info:
        await run_one(hosted(settings, url, policy_max_retries=1), row())
    assert info.value.kind == "policy" and info.value.retryable
    assert info.value.message.startswith(f"cannot reach the policy at {url}/v1 (after 2 tries)")


@pytest.mark.parametrize("fault", [400, 401, 404])
async def test_client_errors_fail_at_once_with_the_reason(stub, settings, fault):
    stub.control(fault=fault)
    with pytest.raises(RolloutFailure) as info:
        await run_one(hosted(settings, stub.url, policy_max_retries=3, policy_api_key=KEY), row())
    assert info.value.kind == "policy" and not info.value.retryable
    assert f"answered HTTP {fault}: injected HTTP {fault}" in info.value.message
    assert stub.stats()[f"status {fault}"] == 1 and KEY not in info.value.message


def test_error_mapping_overflow_and_key_scrubbing(settings):
    """Errors the stub cannot produce: a context-length 400 and a server that echoes the key."""
    import httpx2
    import openai

    from workers.policy.config import PolicyConfig
    from workers.policy.openai_pool import OpenAIPolicy
    from workers.policy.protocol import ContextOverflow

    config = PolicyConfig.from_settings(hosted(settings, "http://policy:8000", policy_api_key=KEY))
    replicas = OpenAIPolicy(config, "chat")
    where = replicas.replicas[0]
    request = httpx2.Request("POST", "http://policy:8000/v1/chat/completions")

    def status_error(cls, status, message, code=None):
        return cls(
            f"Error code: {status}",
            response=httpx2.Response(status, request=request),
            body={"message": message, "code": code},
        )

    overflow = status_error(openai.BadRequestError, 400, "This model's maximum context length is 1024 tokens.")
    assert isinstance(replicas.failure(overflow, where), ContextOverflow)
    coded = status_error(openai.BadRequestError, 400, "too many tokens", "context_length_exceeded")
    assert isinstance(replicas.failure(coded, where), ContextOverflow)
    echoed = replicas.failure(status_error(openai.AuthenticationError, 401, f"bad key {KEY}\nrejected"), where)
    assert isinstance(echoed, RolloutFailure) and not echoed.retryable
    assert KEY not in echoed.message and "bad key <hidden> rejected" in echoed.message
    timeout = replicas.failure(openai.APITimeoutError(request=request), where)
    assert isinstance(timeout, RolloutFailure) and timeout.retryable and "did not answer within" in timeout.message


def _calls_and_results(r: Rollout) -> list:
    """The rollout as the environment saw it: tool calls and results, user turns, the last answer."""
    seen = []
    for o in r.output:
        if o["type"] == "function_call":
            seen.append(("call", o["name"], json.loads(o["arguments"])))
        elif o["type"] == "function_call_output":
            seen.append(("result", o["output"]))
        elif o["role"] == "user":
            seen.append(("user", o["content"][0]["text"]))
    return seen + [("answer", r.output[-1]["content"][0]["text"])]


@pytest.mark.parametrize("kind", ["chat", "responses"])
async def test_one_loop_drives_the_token_and_the_openai_backends_alike(tmp_path, settings, tokenizer, kind):
    """The same scripted multi-turn tool-use conversation through the tokens backend (token ids in
    and out, the real tokenizer) and the openai backend, both against one stub serving the same
    script as token ids and as chat / Responses replies: one loop, so the same tool calls, user
    turns, metrics and reward; only the token fields differ."""
    from helpers.policies import hermes

    from envs.sdk import AgentSettings
    from envs.single_tool_call import SingleToolCall
    from workers.loops.loop import AgentLoop
    from workers.policy.config import PolicyConfig
    from workers.policy.openai_pool import OpenAIPolicy
    from workers.policy.token_policy import TokenPolicy
    from workers.policy.tokens import PolicyClient

    call, answer = hermes("get_weather", {"city": "Paris"}), "It is sunny in Paris."
    script = Script(
        chat_replies=WEATHER, token_replies=[tokenizer.encode(t) + [tokenizer.eos_id] for t in (call, answer)]
    )
    loop = AgentSettings(loop="multi_turn", max_steps=5)
    r = {**row("Paris"), "follow_up_messages": ["Thanks. And tomorrow?"]}
    with StubProcess(script, latency_s=0.01, workdir=tmp_path) as server:
        s = hosted(settings, server.url, kind)
        config = PolicyConfig.from_settings(s)
        agents = [
            AgentLoop(SingleToolCall(), TokenPolicy(PolicyClient(config), tokenizer), loop),
            AgentLoop(SingleToolCall(), OpenAIPolicy(config, kind), loop),
        ]
        got = []
        for agent in agents:
            try:
                got.append(await agent.run(task(r), AgentContext("test", s)))
            finally:
                await agent.aclose()
        stats = server.stats()
    tokens, text = got
    path = "/v1/chat/completions" if kind == "chat" else "/v1/responses"
    assert stats["POST /v1/completions"] == 3 and stats[f"POST {path}"] == 3  # three turns each
    assert _calls_and_results(tokens) == _calls_and_results(text)
    assert [c[0] for c in _calls_and_results(text)] == ["call", "result", "user", "answer"]
    assert set(tokens.metrics) - {"env_tokens"} == set(text.metrics)  # env_tokens: only a token trace has them
    same = ("turns", "tool_calls", "tool_errors", "bad_tool_calls", "hit_max_steps", "replica_moves", "lookups")
    assert {k: tokens.metrics[k] for k in same} == {k: text.metrics[k] for k in same}
    assert tokens.metrics["turns"] == 3 and tokens.metrics["hit_max_steps"] is False
    assert tokens.reward == text.reward == 1.0 and tokens.reward_components == text.reward_components
    assert tokens.status is text.status is Status.ok
    assert len(tokens.trace.turns) == 3 and tokens.trainable
    assert text.trace is None and not text.trainable


async def test_the_openai_backends_readiness_follows_the_rotation(stub, settings):
    """One rotation for both backends: a replica out of rotation makes the hosted agent not ready
    (the worker stops fetching), and the hosted rotation never probes /health."""
    agent = policy_agent("single_tool_call", hosted(settings, stub.url))
    rotation = agent.policy.rotation
    [replica] = rotation.replicas
    try:
        assert agent.ready()
        rotation.take_out(replica, "taken out by the test")
        assert not agent.ready()
        waiting = asyncio.create_task(agent.wait_ready())
        await asyncio.sleep(0.2)
        assert not waiting.done()
        rotation.put_back(replica)
        await asyncio.wait_for(waiting, 5)
        assert agent.ready()
        got = await agent.run(task(row()), AgentContext("test", settings))
    finally:
        await agent.aclose()
    assert got.reward == 1.0
    assert not any(k.startswith("GET /health") for k in stub.stats())


async def test_a_replica_that_failed_goes_last_for_the_cooldown(tmp_path, settings):
    """After a retryable failure a replica takes new rollouts only when no other can (COOLDOWN_S),
    though it stays in rotation: without the cooldown each next rollout would take either."""
    with (
        StubProcess(Script(chat_replies=WEATHER), latency_s=0.01, workdir=tmp_path) as bad,
        StubProcess(Script(chat_replies=WEATHER), latency_s=0.01, workdir=tmp_path) as good,
    ):
        bad.control(fault=500)
        s = settings.replace(policy_urls=[bad.url, good.url], policy_kind="chat", policy_model="stub")
        agent = policy_agent("single_tool_call", s.replace(policy_max_retries=0))
        try:
            for _ in range(30):  # each rollout takes either replica until one has failed
                try:
                    await agent.run(task(row()), AgentContext("test", s))
                except RolloutFailure as exc:
                    assert exc.retryable
                    break
            else:
                raise AssertionError("no rollout went to the failing replica")
            tried = bad.stats()["status 500"]
            got = [await agent.run(task(row()), AgentContext("test", s)) for _ in range(6)]
            assert agent.ready()
        finally:
            await agent.aclose()
        assert all(r.reward == 1.0 for r in got) and bad.stats()["status 500"] == tried == 1


def spawn_logged(settings, log_path, **env: str) -> subprocess.Popen:
    """`farm worker` with its output in a file (DEBUG output could fill a pipe nobody reads yet)."""
    out = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "farm", "worker", "--agent", "single_tool_call", "--concurrency", "4"],
        env=worker_env(settings, **env),
        cwd=ROOT,
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out.close()
    return proc


async def collect(settings, rows: list[dict], timeout_s: float = 60.0) -> list[Rollout]:
    client = FarmClient(settings)
    try:
        tasks = [
            client.task(run_id="hosted", agent="single_tool_call", row=r, group_id="g", sample_index=i)
            for i, r in enumerate(rows)
        ]
        got = await client.run_batch(tasks, timeout_s=timeout_s)
        return [got[t.task_id] for t in tasks]
    finally:
        await client.aclose()


async def test_worker_process_chat_kind_and_the_key_stays_secret(stub, settings, tmp_path):
    log_path = tmp_path / "worker.log"
    proc = spawn_logged(
        settings,
        log_path,
        FARM_POLICY_URLS=stub.url + "/v1",
        FARM_POLICY_KIND="chat",
        FARM_POLICY_MODEL="stub",
        FARM_POLICY_API_KEY=KEY,
        FARM_LOG_LEVEL="DEBUG",
    )
    try:
        good = await collect(settings, [row() for _ in range(4)])
        stub.control(fault=401)
        refused = await collect(settings, [row()])
    finally:
        stop(proc)
    out = log_path.read_text()
    assert proc.returncode == 0, out
    assert all(r.status is Status.ok and r.reward == 1.0 and not r.trainable and r.trace is None for r in good)
    assert all(r.metrics["tool_calls"] == 1 for r in good)
    [r] = refused
    assert r.status is Status.failed and r.error.kind == "policy" and r.attempt == 1
    assert "answered HTTP 401" in r.error.message
    assert "DEBUG" in out and "POST 401" in out  # the log did run at DEBUG and saw the failure
    assert KEY not in out and KEY not in r.error.message


async def test_worker_records_policy_failures_after_retries(stub, settings, tmp_path, sync_redis):
    log_path = tmp_path / "worker.log"
    proc = spawn_logged(
        settings,
        log_path,
        FARM_POLICY_URLS=stub.url,
        FARM_POLICY_KIND="responses",
        FARM_POLICY_MODEL="stub",
        FARM_POLICY_MAX_RETRIES="1",
        FARM_MAX_ATTEMPTS="2",
    )
    try:
        stub.control(fault=503)
        [unavailable] = await collect(settings, [row()])
        stub.stop()  # connection refused from now on
        [gone] = await collect(settings, [row()])
    finally:
        stop(proc)
    assert proc.returncode == 0, log_path.read_text()
    for r in (unavailable, gone):
        assert r.status is Status.failed and r.error.kind == "policy" and r.attempt == 2
        assert r.error.message.startswith("failed 2 attempts; last: ")
    assert "answered HTTP 503 (after 2 tries)" in unavailable.error.message
    assert "cannot reach the policy" in gone.error.message
    assert sync_redis.xlen(settings.keys.dead("single_tool_call")) == 2


def test_the_trainer_refuses_rollouts_without_token_ids(stub, settings, tmp_path):
    from trainer.rollout import FarmRollout

    class Tok:
        eos_token_id = 2

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [1, 2, 3]}

    proc = spawn_logged(
        settings, tmp_path / "worker.log", FARM_POLICY_URLS=stub.url, FARM_POLICY_KIND="chat", FARM_POLICY_MODEL="stub"
    )
    rollout = FarmRollout(settings, tokenizer=Tok(), num_generations=2, timeout_s=60)
    try:
        with pytest.raises(ConfigError) as info:
            rollout([json.dumps(row())] * 2)
    finally:
        rollout.close()
        stop(proc)
    message = str(info.value)
    assert "'single_tool_call'" in message and "policy_kind chat/responses carry no token ids" in message
    assert "train with policy_kind tokens against vLLM" in message and "\n" not in message
    assert rollout.batches == []  # nothing reached TRL


def test_settings_mask_the_key_and_take_it_from_the_environment():
    s = load_settings(env={"FARM_POLICY_API_KEY": KEY, "FARM_POLICY_KIND": "chat"})
    assert s.policy_api_key == KEY
    assert KEY not in repr(s) and KEY not in str(s) and KEY not in f"{[s]}" and "policy_api_key='<hidden>'" in repr(s)
    import rich.pretty

    assert KEY not in rich.pretty.pretty_repr(s)
    assert load_settings(env={"OPENAI_API_KEY": KEY, "FARM_POLICY_KIND": "responses"}).policy_api_key == KEY
    assert load_settings(env={"OPENAI_API_KEY": KEY}).policy_api_key is None  # tokens kind: not for vLLM
    assert (
        load_settings(
            env={"OPENAI_API_KEY": "other", "FARM_POLICY_API_KEY": KEY, "FARM_POLICY_KIND": "chat"}
        ).policy_api_key
        == KEY
    )


def test_no_command_line_option_takes_the_key():
    import click

    from farm.cli import cli

    def options(command):
        for param in command.params:
            yield from getattr(param, "opts", [])
        if isinstance(command, click.Group):
            for sub in command.commands.values():
                yield from options(sub)

    found = list(options(cli))
    assert "--agent" in found  # the walk does reach the subcommands
    assert not [o for o in found if "key" in o.lower()]


@pytest.mark.parametrize("urls", ["http://gym:8000/v1", ["http://a:8000/v1/", "http://b:8000"]])
def test_nemo_gym_env_yaml_keys_load(tmp_path, urls):
    cfg = tmp_path / "env.yaml"
    cfg.write_text(
        json.dumps(
            {"policy_base_url": urls, "policy_api_key": KEY, "policy_model_name": "gym-model", "policy_kind": "chat"}
        )
    )
    s = load_settings(cfg, env={})
    expected = ["http://gym:8000"] if isinstance(urls, str) else ["http://a:8000", "http://b:8000"]
    assert (s.policy_urls, s.policy_api_key, s.policy_model) == (expected, KEY, "gym-model")


@pytest.mark.parametrize(
    "both",
    [{"policy_base_url": "http://a", "policy_urls": ["http://b"]}, {"policy_model_name": "a", "policy_model": "b"}],
)
def test_an_alias_and_its_native_key_together_are_refused(tmp_path, both):
    cfg = tmp_path / "env.yaml"
    cfg.write_text(json.dumps(both))
    with pytest.raises(ConfigError, match="sets both"):
        load_settings(cfg, env={})


@pytest.mark.vllm
async def test_chat_kind_against_real_vllm(vllm, settings):
    s = settings.replace(policy_urls=[vllm.url + "/v1"], policy_kind="chat", policy_model=vllm.served_model_name)
    agent = policy_agent("single_tool_call", s)
    try:
        ctx = AgentContext("test", s)
        got = await agent.run(task(row(), Sampling(temperature=0.0, max_tokens=64, seed=1)), ctx)
        short = await agent.run(task(row(), Sampling(temperature=0.0, max_tokens=2)), ctx)
        long = await agent.run(task(row(content="weather " * 3000)), ctx)
    finally:
        await agent.aclose()
    assert got.status in (Status.ok, Status.truncated) and got.reward in (0.0, 1.0)
    assert got.trace is None and got.trainable is False
    assert got.metrics["turns"] >= 1 and got.metrics["prompt_tokens"] > 100 and got.metrics["completion_tokens"] > 0
    assert got.output and got.output[0]["type"] in ("message", "function_call")
    assert all(o["type"] in ("message", "function_call", "function_call_output") for o in got.output)
    # vLLM serves SmolLM2 without a tool parser: the tools went into the system prompt instead.
    assert agent.policy.prompted == [True]
    assert short.status is Status.truncated and short.metrics["turns"] == 1 and short.metrics["completion_tokens"] == 2
    assert long.status is Status.truncated and long.metrics["turns"] == 0 and long.output == []
