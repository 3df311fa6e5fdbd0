"""The model gateway in one process: the real openai SDK and Agents SDK against the real aiohttp
server and SmolLM2's real tokenizer; the model is a scripted stand-in (SmolLM2 rarely calls tools
correctly, and these tests are about what the gateway does with the ids, not about the model).

The worker-process tests (real Redis, the policy stub, the embedded vLLM) are test_harness_*.py.
"""

from __future__ import annotations

import asyncio
import json

import msgspec
import openai
import pytest
from helpers.policies import hermes
from helpers.redis import make_settings

from envs.sdk import load_env
from farm.agent_config import AgentConfig
from farm.errors import ConfigError, RolloutFailure
from farm.schema import Status, Task
from workers.gateway.bridge import Bridge
from workers.gateway.calls import Limits, RolloutCalls
from workers.gateway.local import local_http
from workers.gateway.server import Gateway
from workers.loops.context import AgentContext
from workers.loops.harness import HarnessAgent, load_harness
from workers.policy.rotation import Session
from workers.policy.tokens import Completion

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
HISTORY = [{"role": "system", "content": "You are a weather assistant."}, {"role": "user", "content": "Paris?"}]


class Scripted:
    """The policy: each call answers the next scripted text (+ EOS unless it ends in None), and the
    prompts it was sent are kept, so a test can check what the gateway sent."""

    def __init__(self, tok, turns, hold: asyncio.Event | None = None):
        self.tok, self.turns, self.prompts, self.hold = tok, list(turns), [], hold
        self.cancelled = 0

    async def max_model_len(self, session):
        return 2048

    async def complete(self, prompt_ids, sampling, session):
        self.prompts.append(list(prompt_ids))
        if self.hold is not None:
            try:
                await self.hold.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        text = self.turns.pop(0)
        cut = isinstance(text, tuple)  # (text, "length"): cut at max_tokens, no EOS
        ids = self.tok.encode(text[0] if cut else text) + ([] if cut else [self.tok.eos_id])
        return Completion(ids, [-0.25] * len(ids), "", "length" if cut else "stop", "scripted", 0.0)

    def ready(self):
        return True

    async def wait_ready(self):
        return None

    async def aclose(self):
        return None


@pytest.fixture(params=["http", "in_process"])
async def gateway(request, tokenizer):
    """A gateway with one rollout open and an openai client for it: over HTTP (what a command or a
    harness's own client uses) and through the in-process transport in-process harnesses get."""
    gateways = []

    async def start(turns, **kw):
        policy = Scripted(tokenizer, turns, kw.pop("hold", None))
        gw = await Gateway(policy, tokenizer).start()
        gateways.append(gw)
        results: list = []

        async def run_tool(name, args):
            results.append((name, args))
            return json.dumps({"city": args.get("city"), "conditions": "sunny"})

        calls = RolloutCalls(
            model="m",
            sampling={"temperature": 1.0, "max_tokens": 64},
            limits=Limits(kw.get("max_steps", 8), max_rollout_tokens=kw.get("max_rollout_tokens")),
            session=Session(),
            bridge=Bridge(tokenizer),
            run_tool=run_tool,
            task_json={"task_id": "t"},
        )
        gw.open(calls)
        http = local_http(gw) if request.param == "in_process" else None
        client = openai.AsyncOpenAI(base_url=gw.base_url(calls), api_key="unused", max_retries=0, http_client=http)
        clients.append(client)
        return gw, policy, calls, client

    clients: list = []
    yield start
    for client in clients:
        await client.close()
    for gw in gateways:
        await gw.aclose()


def sampled(seg):
    return [i for i, m in zip(seg.ids, seg.mask) if m]


@pytest.mark.slow
async def test_a_tool_loop_is_one_segment_whose_prompts_extend_the_sampled_ids(gateway, tokenizer):
    gw, policy, calls, client = await gateway([hermes("get_weather", {"city": "Paris"}), "Sunny in Paris."])
    messages = list(HISTORY)
    r = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.content is None
    assert msg.tool_calls[0].function.name == "get_weather"
    assert json.loads(msg.tool_calls[0].function.arguments) == {"city": "Paris"}
    # The SDK's own dump of the message (content None, refusal None, ...) is what harnesses echo.
    messages += [msg.model_dump(), {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "sunny"}]
    r2 = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    assert r2.choices[0].message.content == "Sunny in Paris."
    [seg] = calls.bridge.segments
    first_reply = tokenizer.encode(hermes("get_weather", {"city": "Paris"})) + [tokenizer.eos_id]
    # The second prompt starts with the first prompt and the sampled ids, untouched.
    assert policy.prompts[1][: len(policy.prompts[0]) + len(first_reply)] == policy.prompts[0] + first_reply
    assert seg.prompt == policy.prompts[0]
    assert sampled(seg) == first_reply + tokenizer.encode("Sunny in Paris.") + [tokenizer.eos_id]
    assert calls.bridge.metrics()["retokenized_tokens"] == 0 and calls.bridge.metrics()["segments"] == 1


@pytest.mark.slow
async def test_a_retried_call_forks_and_an_edited_history_starts_a_new_segment(gateway, tokenizer):
    gw, policy, calls, client = await gateway([hermes("get_weather", {"city": "Paris"}), "A", "B", "C"])
    messages = list(HISTORY)
    msg = (await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)).choices[0].message
    messages += [msg.model_dump(), {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "sunny"}]
    await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)  # extends: "A"
    await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)  # the same call again: "B"
    edited = [*HISTORY[:1], {"role": "user", "content": "Paris, please?"}]
    await client.chat.completions.create(model="m", messages=edited, tools=TOOLS)  # matches no chain: "C"
    first, fork, new = calls.bridge.segments
    a = tokenizer.encode("A") + [tokenizer.eos_id]
    assert sampled(first)[-len(a) :] == a
    # The fork's prompt holds the first segment's tokens through the tool result: trained once, there.
    assert fork.prompt == policy.prompts[2] and sampled(fork) == tokenizer.encode("B") + [tokenizer.eos_id]
    assert fork.prompt[: len(first.prompt)] == first.prompt
    assert new.prompt == policy.prompts[3] and sampled(new) == tokenizer.encode("C") + [tokenizer.eos_id]
    m = calls.bridge.metrics()
    assert (m["segments"], m["forks"], m["retokenized_tokens"]) == (3, 1, 0)
    # Each sampled token is in exactly one segment's completion: the four replies, once each.
    replies = [hermes("get_weather", {"city": "Paris"}), "A", "B", "C"]
    assert sum(len(sampled(s)) for s in calls.bridge.segments) == sum(len(tokenizer.encode(t)) + 1 for t in replies)


@pytest.mark.slow
async def test_content_none_equals_empty_and_arguments_match_as_canonical_json(gateway):
    gw, policy, calls, client = await gateway([hermes("get_weather", {"city": "Paris"}), "done"])
    msg = (await client.chat.completions.create(model="m", messages=HISTORY, tools=TOOLS)).choices[0].message
    call = msg.tool_calls[0]
    # An echo with content "" and the arguments re-serialised with other spacing still extends the chain.
    echoed = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{ "city" : "Paris" }'},
            }
        ],
    }
    tail = {"role": "tool", "tool_call_id": call.id, "content": "sunny"}
    await client.chat.completions.create(model="m", messages=[*HISTORY, echoed, tail], tools=TOOLS)
    assert len(calls.bridge.segments) == 1
    # Another call id, or other tools, is another history: a new segment.
    other = {**echoed, "tool_calls": [{**echoed["tool_calls"][0], "id": "call_other"}]}
    policy.turns.append("x")
    await client.chat.completions.create(model="m", messages=[*HISTORY, other, tail], tools=TOOLS)
    assert len(calls.bridge.segments) == 2


@pytest.mark.slow
async def test_a_turn_cut_at_max_tokens_is_extended_with_the_eos_as_an_inserted_token(gateway, tokenizer):
    gw, policy, calls, client = await gateway([("It is", "length"), "sunny."])
    r = await client.chat.completions.create(model="m", messages=HISTORY)
    assert r.choices[0].finish_reason == "length"
    messages = [*HISTORY, r.choices[0].message.model_dump(), {"role": "user", "content": "Go on."}]
    await client.chat.completions.create(model="m", messages=messages)
    [seg] = calls.bridge.segments
    cut = len(tokenizer.encode("It is"))
    assert seg.ids[cut] == tokenizer.eos_id and seg.mask[cut] == 0  # inserted, never trained
    assert calls.bridge.metrics()["unterminated_turns"] == 1


@pytest.mark.slow
async def test_responses_api_streamed_and_not_with_function_calls(gateway):
    gw, policy, calls, client = await gateway([hermes("get_weather", {"city": "Oslo"}), "Cold in Oslo."])
    tools = [{"type": "function", **TOOLS[0]["function"]}]
    r = await client.responses.create(model="m", instructions=HISTORY[0]["content"], input="Oslo?", tools=tools)
    [call] = [i for i in r.output if i.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Oslo"}
    items = [{"role": "user", "content": "Oslo?"}, *[i.model_dump() for i in r.output]]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "cold"})
    async with client.responses.stream(
        model="m", instructions=HISTORY[0]["content"], input=items, tools=tools
    ) as stream:
        final = await stream.get_final_response()
    assert final.output_text == "Cold in Oslo."
    assert len(calls.bridge.segments) == 1  # the echoed items extended the first reply's chain
    # previous_response_id continues a response of this rollout
    policy.turns.append("Yes.")
    r3 = await client.responses.create(model="m", previous_response_id=final.id, input="Sure?", tools=tools)
    assert r3.output_text == "Yes." and len(calls.bridge.segments) == 1


@pytest.mark.slow
async def test_chat_streaming_with_usage(gateway):
    gw, policy, calls, client = await gateway([hermes("get_weather", {"city": "Lima"})])
    stream = await client.chat.completions.create(
        model="m", messages=HISTORY, tools=TOOLS, stream=True, stream_options={"include_usage": True}
    )
    chunks = [c async for c in stream]
    calls_seen = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
    assert calls_seen[0].function.name == "get_weather"
    assert chunks[-1].usage.prompt_tokens == len(policy.prompts[0]) and chunks[-1].usage.completion_tokens > 0


@pytest.mark.parametrize(
    "extra, status, code",
    [
        ({"n": 2}, 400, "invalid_value"),
        ({"tool_choice": "required"}, 400, "invalid_value"),
        ({"response_format": {"type": "json_object"}}, 400, "invalid_value"),
        ({"presence_penalty": 0.5}, 400, "invalid_value"),
        ({"model": "gpt-4o"}, 404, "model_not_found"),
        ({"messages": []}, 400, "missing_required_parameter"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "invalid_value"),
    ],
)
@pytest.mark.slow
async def test_what_cannot_be_honoured_is_a_400_in_openai_shape(gateway, extra, status, code):
    gw, policy, calls, client = await gateway(["unused"])
    body = {"model": "m", "messages": HISTORY, **extra}
    with pytest.raises(openai.APIStatusError) as err:
        await client.chat.completions.create(**body)
    assert err.value.status_code == status and err.value.body["code"] == code
    assert policy.prompts == []  # nothing reached the model


@pytest.mark.slow
async def test_harmless_parameters_are_ignored_and_the_task_sampling_is_imposed(gateway):
    gw, policy, calls, client = await gateway(["ok"])
    r = await client.chat.completions.create(
        model="m",
        messages=HISTORY,
        temperature=0.0,
        store=False,
        metadata={"a": "b"},
        parallel_tool_calls=False,
        user="u",
        max_tokens=5000,
    )
    assert r.choices[0].message.content == "ok"


@pytest.mark.slow
async def test_keys_malformed_bodies_and_unknown_routes(gateway):
    gw, policy, calls, client = await gateway(["ok"])
    import aiohttp

    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/chat/completions", json={"model": "m", "messages": HISTORY}) as resp:
            assert resp.status == 401 and (await resp.json())["error"]["code"] == "invalid_api_key"
        headers = {"Authorization": f"Bearer {calls.secret}"}
        async with http.post(f"{gw.url}/v1/chat/completions", data=b"{not json", headers=headers) as resp:
            assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_json"
        async with http.post(f"{gw.url}/v1/embeddings", json={}, headers=headers) as resp:
            assert resp.status == 404 and "error" in await resp.json()
        async with http.post(
            f"{gw.url}/v1/chat/completions", json={"model": "m", "messages": HISTORY}, headers=headers
        ) as resp:
            assert resp.status == 200  # the bearer key alone is enough
        gw.close(calls)  # the rollout ended: its key stops working
        async with http.post(
            f"{gw.url}/v1/chat/completions", json={"model": "m", "messages": HISTORY}, headers=headers
        ) as resp:
            assert resp.status == 401


@pytest.mark.slow
async def test_in_process_requests_get_the_servers_answers(gateway):
    """gateway.handle is what both paths call: keys, routes, bodies and methods answer the same."""
    gw, policy, calls, client = await gateway(["ok"])
    body = json.dumps({"model": "m", "messages": HISTORY}).encode()
    cases = [
        ("POST", "/v1/chat/completions", "", body, 401, "invalid_api_key"),
        ("POST", "/v1/chat/completions", f"Bearer {calls.secret}", b"{not json", 400, "invalid_json"),
        ("POST", f"/r/{calls.secret}/v1/embeddings", "", b"{}", 404, "not_found"),
        ("GET", f"/r/{calls.secret}/v1/chat/completions", "", b"", 405, "method_not_allowed"),
        ("POST", "/t/nope/report", "", b"{}", 404, "not_found"),
    ]
    import aiohttp

    async with aiohttp.ClientSession() as http:
        for method, path, auth, raw, status, code in cases:
            answer = await gw.handle(method, path, auth, raw)
            assert (answer.status, msgspec.json.decode(answer.body)["error"]["code"]) == (status, code), path
            headers = {"Authorization": auth} if auth else {}
            async with http.request(method, gw.url + path, data=raw, headers=headers) as resp:
                assert (resp.status, (await resp.json())["error"]["code"]) == (status, code), path
    answer = await gw.handle("GET", f"/r/{calls.secret}/v1/models", "", b"")
    assert msgspec.json.decode(answer.body)["data"][0]["id"] == "m"


@pytest.mark.slow
async def test_a_report_of_a_failed_grader_ends_the_rollout_as_a_verifier_failure(gateway):
    """POST {FARM_TASK_URL}/report {"error": ...}: how a command says its grader failed (an exit
    status alone is a crash, retried)."""
    gw, policy, calls, client = await gateway(["ok"])
    answer = await gw.handle("POST", f"/t/{calls.task_secret}/report", "", b'{"error": "reward raised\\n  KeyError"}')
    assert answer.status == 200
    assert calls.stopped.is_set() and calls.failure is not None
    assert calls.failure.kind == "verifier" and not calls.failure.retryable
    assert calls.failure.message == "the harness's own grader failed: reward raised KeyError"


@pytest.mark.slow
async def test_max_steps_stops_the_rollout_and_closing_cancels_open_calls(gateway):
    gw, policy, calls, client = await gateway(["a", "b"], max_steps=1)
    await client.chat.completions.create(model="m", messages=HISTORY)
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(model="m", messages=HISTORY)
    assert err.value.body["code"] == "rollout_limit" and "max_steps" in calls.stop_reason
    assert calls.stopped.is_set()

    hold = asyncio.Event()
    gw2, policy2, calls2, client2 = await gateway(["never"], hold=hold)
    pending = asyncio.ensure_future(client2.chat.completions.create(model="m", messages=HISTORY))
    await asyncio.sleep(0.2)
    gw2.close(calls2)
    with pytest.raises(openai.APIStatusError) as err:
        await pending
    assert err.value.status_code == 503 and policy2.cancelled == 1


# -- the harness agent, in process -------------------------------------------------------------
def task_for(env_name: str, row: dict) -> Task:
    return Task.new(run_id="r", agent="a", row=row, reply_to="farm:results:r")


async def harness_agent(tokenizer, turns, harness: str, env: str = "single_tool_call", **cfg):
    settings = make_settings("redis://127.0.0.1:6379", "gw", policy_urls=["http://127.0.0.1:9"])
    agent = HarnessAgent(
        "a",
        load_env(env),
        Scripted(tokenizer, turns),
        tokenizer,
        load_env(env).agent,
        AgentConfig(env=env, harness=harness, **cfg),
        settings,
    )
    await agent.setup()
    return agent


@pytest.mark.slow
async def test_plain_sdk_harness_rollout_is_verified_and_carries_the_trace(tokenizer):
    from envs.single_tool_call import generate

    agent = await harness_agent(
        tokenizer, [hermes("get_weather", {"city": "Paris"}), "It is sunny."], "examples.harnesses.plain_sdk:run"
    )
    row = {**generate(1)[0], "expected_city": "Paris"}
    try:
        rollout = await agent.run(task_for("single_tool_call", row), AgentContext("w", agent.farm))
    finally:
        await agent.aclose()
    assert rollout.status is Status.ok and rollout.reward == 1.0
    assert rollout.trace is not None and rollout.segments == []
    assert rollout.metrics["tool_calls"] == 1 and rollout.metrics["turns"] == 2
    assert rollout.metrics["retokenized_tokens"] == 0
    kinds = [i["type"] for i in rollout.output]
    assert kinds == ["function_call", "function_call_output", "message"]


@pytest.mark.slow
async def test_agents_sdk_harness_uses_the_responses_api(tokenizer):
    from envs.single_tool_call import generate

    agent = await harness_agent(
        tokenizer, [hermes("get_weather", {"city": "Paris"}), "It is sunny."], "examples.harnesses.agents_sdk:run"
    )
    row = {**generate(1)[0], "expected_city": "Paris"}
    try:
        rollout = await agent.run(task_for("single_tool_call", row), AgentContext("w", agent.farm))
    finally:
        await agent.aclose()
    assert rollout.status is Status.ok and rollout.reward == 1.0, rollout
    assert len(agent.client.prompts) == 2 and rollout.segments == []


async def crashing(client, task):
    await client.chat.completions.create(model=task.model, messages=task.messages)
    raise KeyError("boom")


async def idle(client, task):
    return "I did not ask the model."


async def looping(client, task):
    while True:
        try:
            await client.chat.completions.create(model=task.model, messages=task.messages)
        except openai.BadRequestError:
            raise RuntimeError("the harness's own error, which the gateway's reason wins over")


async def two_at_once(client, task):
    await client.chat.completions.create(model=task.model, messages=task.messages, n=2)


def blocking(client, task):
    return "blocks the event loop"


async def grader_fails(client, task):
    await client.chat.completions.create(model=task.model, messages=task.messages)
    task.report_failure("TaskError: the reward function raised ValueError('twelve')")
    raise RuntimeError("exit 1")  # what a command does next: exit non-zero (a crash, were it alone)


@pytest.mark.slow
async def test_harness_failures_end_as_the_contract_says(tokenizer):
    from envs.single_tool_call import generate

    row = generate(1)[0]
    agent = await harness_agent(tokenizer, ["x"], f"{__name__}:crashing")
    with pytest.raises(RolloutFailure) as err:
        await agent.run(task_for("single_tool_call", row), AgentContext("w", agent.farm))
    assert err.value.kind == "agent_error" and err.value.retryable and "KeyError" in err.value.message
    await agent.aclose()

    agent = await harness_agent(tokenizer, [], f"{__name__}:idle")
    with pytest.raises(RolloutFailure) as err:
        await agent.run(task_for("single_tool_call", row), AgentContext("w", agent.farm))
    assert (
        err.value.kind == "agent_error" and not err.value.retryable and "without calling the model" in err.value.message
    )
    await agent.aclose()

    agent = await harness_agent(tokenizer, ["a", "b", "c"], f"{__name__}:looping", max_steps=3)
    rollout = await agent.run(task_for("single_tool_call", row), AgentContext("w", agent.farm))
    await agent.aclose()
    assert rollout.status is Status.truncated and "max_steps" in rollout.metrics["stop_reason"]
    # the same history three times: three samples, each its own segment
    assert rollout.metrics["turns"] == 3 and rollout.metrics["segments"] == 3

    # A parameter the gateway refuses: the harness would ask the same again, so it is not retried,
    # and the failure names the parameter (not a crash retried max_attempts times).
    agent = await harness_agent(tokenizer, ["x"], f"{__name__}:two_at_once")
    with pytest.raises(RolloutFailure) as err:
        await agent.run(task_for("single_tool_call", row), AgentContext("w", agent.farm))
    await agent.aclose()
    assert err.value.kind == "policy" and not err.value.retryable and "parameter `n`" in err.value.message

    # A harness whose own grader failed: a verifier failure with its message, not retried, whatever the
    # harness does next (it was a crash retried max_attempts times, then dead-lettered).
    agent = await harness_agent(tokenizer, ["x"], f"{__name__}:grader_fails")
    with pytest.raises(RolloutFailure) as err:
        await agent.run(task_for("single_tool_call", row), AgentContext("w", agent.farm))
    await agent.aclose()
    assert err.value.kind == "verifier" and not err.value.retryable
    said = "the harness's own grader failed: TaskError: the reward function raised ValueError('twelve')"
    assert err.value.message == said

    with pytest.raises(ConfigError, match="not an async function"):
        load_harness(f"{__name__}:blocking")
    with pytest.raises(ConfigError, match="cannot import"):
        load_harness("no_such_module_here:run")


def test_the_docs_parameter_table_is_the_gateways():
    from pathlib import Path

    from workers.gateway.shapes import PARAMETERS

    page = (Path(__file__).parent.parent / "docs" / "bring-your-own-agent.md").read_text()
    rows = {f"| {name} | {what} | {why} |" for name, (what, why) in PARAMETERS.items()}
    assert rows <= set(page.splitlines()), rows - set(page.splitlines())
