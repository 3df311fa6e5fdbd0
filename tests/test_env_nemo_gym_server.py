"""nemo_gym_server: a NeMo Gym resource server as an environment, over its HTTP protocol.

Here against a stand-in speaking the protocol (tests/nemo_gym_standin.py, served in this
process), which can also misbehave on request, for the error paths; against NeMo Gym's own
servers in tests/test_env_nemo_gym_server_real.py, which uses the rows and helpers below. The
rollouts' tool calls come from a scripted policy (helpers.policies' ScriptedPolicy): no small model makes
a given call sequence on demand.
"""

from __future__ import annotations

import json
import re

import pytest
from helpers.policies import ScriptedPolicy, hermes
from nemo_gym_standin import StandIn

from envs.nemo_gym_server import CheckedRow, NemoGymServer, response_object
from envs.sdk import ErrorKind, RolloutFailure, RowError, Transcript, load_env
from farm.embedded import free_port
from farm.errors import ConfigError
from farm.schema import Status, Task
from workers.loops.agent import AgentContext
from workers.loops.env_calls import call_tool
from workers.loops.loop import AgentLoop


def tool(name: str, properties: dict, required: list[str]) -> dict:
    """A tool as NeMo Gym's example rows carry it (Responses shape)."""
    parameters = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return {"name": name, "parameters": parameters, "strict": True, "type": "function", "description": ""}


COUNTER_TOOLS = [
    tool("increment_counter", {"count": {"type": "integer", "description": ""}}, ["count"]),
    tool("get_counter_value", {}, []),
]
NAMES = ["increment_counter", "get_counter_value"]


def counter_row(initial: int = 3, expected: int = 6, **extra) -> dict:
    """A row of NeMo Gym's example_session_state_mgmt data, plus `extra` fields."""
    prompt = [{"content": "add 1 then add 2 then get the count", "role": "user"}]
    return {
        "responses_create_params": {"input": prompt, "tools": COUNTER_TOOLS},
        "expected_count": expected,
        "initial_count": initial,
        **extra,
    }


def assistant(text: str) -> dict:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def transcript(*calls: tuple[str, dict, str], answer: str = "6", truncated: bool = False) -> Transcript:
    """The transcript the agent loop would write for these (name, arguments, result) calls, then an answer."""
    output: list[dict] = []
    for i, (name, arguments, result) in enumerate(calls):
        output.append(assistant(hermes(name, arguments)))
        output.append({"type": "function_call", "call_id": f"c{i}", "name": name, "arguments": json.dumps(arguments)})
        output.append({"type": "function_call_output", "call_id": f"c{i}", "output": result})
    output.append(assistant(answer))
    tool_calls = [{"name": n, "arguments": a} for n, a, _ in calls]
    return Transcript(final_text=answer, output=output, tool_calls=tool_calls, truncated=truncated)


@pytest.fixture(scope="module")
def standin():
    server = StandIn().start()
    yield server
    server.stop()


@pytest.fixture
async def env(standin):
    env = NemoGymServer(standin.url, tools=NAMES)
    await env.setup()
    yield env
    await env.aclose()


async def rollout(env: NemoGymServer, row: dict, *calls: tuple[str, dict]):
    """A rollout's tool calls through the environment's tools: (typed row, session, results)."""
    typed = env.check_row(row)
    session = env.new_state(typed)
    tools = {t.name: t for t in env.tools()}
    return typed, session, [await tools[name](session, arguments) for name, arguments in calls]


def sid_of(session) -> str:
    return session.cookies["StandInCounterServer___standin"]


# ---- options and rows ---------------------------------------------------------------------------


def test_registered_under_its_entry_point_with_its_options_checked():
    chat_shaped = {"type": "function", "function": {"name": "get_counter_value", "description": "Read it."}}
    env = load_env("nemo_gym_server", {"url": "http://127.0.0.1:9/", "tools": ["increment_counter", chat_shaped]})
    assert isinstance(env, NemoGymServer) and env.url == "http://127.0.0.1:9"
    described = [(t.name, t.description) for t in env.tools()]
    assert described == [("increment_counter", ""), ("get_counter_value", "Read it.")]
    assert env.agent.loop == "tool_use" and env.agent.max_steps == 8
    assert env.agent.tool_timeout_s > 30 and env.agent.verify_timeout_s > 30, "the request's own timeout fires first"
    with pytest.raises(ConfigError, match="environment nemo_gym_server: bad option"):
        load_env("nemo_gym_server", {})
    with pytest.raises(ValueError, match="url must be an http"):
        NemoGymServer("127.0.0.1:8000")
    with pytest.raises(ValueError, match="bad tool name 'verify'"):
        NemoGymServer("http://h", tools=["verify"])
    with pytest.raises(ValueError, match="bad tool name 'a/b'"):
        NemoGymServer("http://h", tools=["a/b"])
    with pytest.raises(ValueError, match="listed twice"):
        NemoGymServer("http://h", tools=["a", {"name": "a"}])


def test_nemo_gym_rows_pass_check_row_unchanged():
    env = NemoGymServer("http://h", tools=NAMES)
    row = counter_row(agent_ref={"type": "responses_api_agents", "name": "counter"}, uuid="u1", metadata={"k": [1]})
    original = json.loads(json.dumps(row))
    checked = env.check_row(row)
    assert isinstance(checked, CheckedRow) and checked.fields == original and checked.tools == COUNTER_TOOLS
    assert row == original, "the row itself is left as it was"
    assert env.check_row({"responses_create_params": {"input": "2+2?"}}).tools is None  # a verify-only row
    with pytest.raises(RowError, match=r"row offers tool\(s\) \['get_counter_value'\] that the server's `tools`"):
        NemoGymServer("http://h", tools=["increment_counter"]).check_row(row)
    with pytest.raises(RowError, match="responses_create_params"):
        env.check_row({"expected_count": 6})


# ---- the protocol, against the stand-in ---------------------------------------------------------


async def test_a_rollouts_tool_calls_and_verify_share_its_own_session(env, standin):
    """Two rollouts interleaved on one client: each seeds its own counter and reads only its own."""
    a_row, a, a_out = await rollout(env, counter_row(3, 6), ("increment_counter", {"count": 1}))
    b_row, b, b_out = await rollout(env, counter_row(10, 10), ("increment_counter", {"count": 5}))
    tools = {t.name: t for t in env.tools()}
    a_out.append(await tools["increment_counter"](a, {"count": 2}))
    a_out.append(await tools["get_counter_value"](a, {}))
    b_out.append(await tools["get_counter_value"](b, {}))
    assert a_out == ['{"success":true}', '{"success":true}', '{"count":6}'], "the server's text, unchanged"
    assert b_out == ['{"success":true}', '{"count":15}']
    assert sid_of(a) != sid_of(b)
    assert standin.routes(sid_of(a)) == ["/seed_session", *["/increment_counter"] * 2, "/get_counter_value"]
    seed = next(body for route, sid, body in standin.seen if sid == sid_of(a) and route == "/seed_session")
    assert seed == counter_row(3, 6), "seed_session gets the whole row"
    right = await env.verify(a_row, a, transcript(("increment_counter", {"count": 1}, "")))
    wrong = await env.verify(b_row, b, transcript())
    assert (right.reward, wrong.reward) == (1.0, 0.0)
    assert standin.routes(sid_of(a))[-1] == "/verify" and standin.routes(sid_of(b))[-1] == "/verify"


async def test_verify_gets_the_row_and_the_rollout_as_a_responses_object(env, standin):
    row = counter_row(0, 1, uuid="row-7")
    typed, session, _ = await rollout(env, row, ("increment_counter", {"count": 1}))
    await env.verify(typed, session, transcript(("increment_counter", {"count": 1}, '{"success":true}'), answer="1"))
    body = standin.seen[-1][2]
    assert {k: v for k, v in body.items() if k != "response"} == row
    response = body["response"]
    assert response["object"] == "response" and response["id"].startswith("resp_")
    assert response["status"] == "completed" and response["incomplete_details"] is None
    assert response["tools"] == [{**t, "strict": True} for t in COUNTER_TOOLS]
    assert (response["tool_choice"], response["parallel_tool_calls"], response["model"]) == ("auto", True, "policy")
    call = {"type": "function_call", "call_id": "c0", "name": "increment_counter", "arguments": '{"count": 1}'}
    answer = {"type": "output_text", "text": "1", "annotations": []}
    assert response["output"] == [
        {"id": "fc_1", "status": "completed", **call},
        {"type": "function_call_output", "call_id": "c0", "output": '{"success":true}'},
        {"id": "msg_3", "status": "completed", "type": "message", "role": "assistant", "content": [answer]},
    ], "the Hermes markup message is taken out: the call is its function_call item"


def test_a_truncated_rollout_is_an_incomplete_response_and_configured_tools_stand_in_for_the_rows():
    text = "Let me look. <tool_call>{}</tool_call>"
    t = Transcript(
        final_text=text,
        output=[{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}],
        tool_calls=[],
        truncated=True,
    )
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    got = response_object({"input": "x", "model": "m", "tool_choice": "required"}, tools, t)
    assert (got["status"], got["incomplete_details"], got["model"], got["tool_choice"]) == (
        "incomplete",
        {"reason": "max_output_tokens"},
        "m",
        "required",
    )
    assert got["tools"] == [{"type": "function", "strict": None, "name": "f", "parameters": {"type": "object"}}]
    assert got["output"][0]["content"] == [{"type": "output_text", "text": "Let me look.", "annotations": []}]


async def test_the_answer_maps_to_reward_components_and_metrics(env, standin):
    typed, session, _ = await rollout(
        env, counter_row(4, 6, standin_components=True), ("increment_counter", {"count": 2})
    )
    verdict = await env.verify(typed, session, transcript(("increment_counter", {"count": 2}, "")))
    assert verdict.reward == 1.0
    assert verdict.components == {"right_count": 1.0, "called_tools": 1.0}
    # What the answer added; not what it echoed (expected_count, initial_count, the flag) nor its strings.
    assert verdict.metrics == {"counter": 6, "function_calls": 1, "resolved": True}


async def test_a_rollout_without_tool_calls_is_seeded_before_verify(env, standin):
    typed, session, _ = await rollout(env, counter_row(6, 6))
    assert (await env.verify(typed, session, transcript())).reward == 1.0, "the seeded counter already holds 6"
    assert standin.routes(sid_of(session)) == ["/seed_session", "/verify"]
    typed, session, _ = await rollout(env, counter_row(5, 6))
    assert (await env.verify(typed, session, transcript())).reward == 0.0


@pytest.mark.parametrize(
    "mode,reason,retryable",
    [
        ("http_500", "POST /verify: answered HTTP 500: Internal trouble http_500", False),
        ("http_503", "POST /verify: answered HTTP 503: Internal trouble http_503", True),
        ("not_json", "POST /verify: answered non-JSON: <html>oops</html>", False),
        ("no_reward", "POST /verify: answered without `reward` (keys: responses_create_params, expected_", False),
        ("reward_string", "POST /verify: answered a `reward` that is not a number: '1.0'", False),
        ("slow", "POST /verify: no answer within 0.5s", True),
    ],
)
async def test_a_verify_that_gives_no_verdict_fails_the_rollout_with_a_one_line_reason(
    standin, mode, reason, retryable
):
    env = NemoGymServer(standin.url, tools=NAMES, timeout_s=0.5)
    try:
        typed, session, _ = await rollout(env, counter_row(6, 6, standin_verify=mode))
        with pytest.raises(RolloutFailure) as info:
            await env.verify(typed, session, transcript())
    finally:
        await env.aclose()
    failure = info.value
    assert failure.kind is ErrorKind.verifier and failure.retryable is retryable
    assert failure.message.startswith(f"nemo_gym_server {standin.url}: {reason}"), failure.message
    assert "\n" not in failure.message


async def test_a_request_waiting_for_a_connection_is_not_timed_as_the_servers_delay(standin):
    """Four verifies of 0.4 s each on one connection with a 1 s limit: the last waits 1.2 s for the
    connection, then gets its answer in 0.4 s. It is not "no answer within 1s": the queue is this
    process's (thousands of loops on a few connections), not the server's."""
    import asyncio

    env = NemoGymServer(standin.url, tools=NAMES, timeout_s=1.0, max_connections=1)
    try:
        done = [await rollout(env, counter_row(6, 6, standin_verify="pause")) for _ in range(4)]
        verdicts = await asyncio.gather(*(env.verify(typed, session, transcript()) for typed, session, _ in done))
    finally:
        await env.aclose()
    assert [v.reward for v in verdicts] == [1.0] * 4


async def test_an_unreachable_server_fails_the_rollout_with_the_reason():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    env = NemoGymServer(url, tools=NAMES)
    try:
        typed, session, _ = await rollout(env, counter_row())
        with pytest.raises(RolloutFailure) as info:
            await env.verify(typed, session, transcript())
    finally:
        await env.aclose()
    assert info.value.kind is ErrorKind.verifier and info.value.retryable
    expected = rf"nemo_gym_server {url}: POST /seed_session: no answer \(ClientConnectorError: .+\)"
    assert re.fullmatch(expected, str(info.value)), str(info.value)


async def test_a_tools_error_answer_goes_back_to_the_model(standin):
    """Through the worker's own tool call (workers/loops/env_calls.py): the text the model reads."""
    env = NemoGymServer(standin.url, tools=[*NAMES, "broken_tool", "no_such_route"])
    try:
        session = env.new_state(env.check_row(counter_row()))
        tools, metrics = {t.name: t for t in env.tools()}, {"tool_errors": 0, "bad_tool_calls": 0}
        bad = await call_tool(tools, "increment_counter", {"count": "two"}, session, 5, metrics)
        broken = await call_tool(tools, "broken_tool", {}, session, 5, metrics)
        missing = await call_tool(tools, "no_such_route", {}, session, 5, metrics)
        fine = await call_tool(tools, "get_counter_value", {}, session, 5, metrics)
    finally:
        await env.aclose()
    assert bad.startswith("Error: bad arguments for increment_counter: the server refused the arguments: ")
    assert '"loc":["body","count"]' in bad and '"input":"two"' in bad
    assert broken == "Error: tool broken_tool failed: ToolHTTPError: HTTP 500: \"ValueError('the tool broke')\""
    assert missing == 'Error: tool no_such_route failed: ToolHTTPError: HTTP 404: {"detail":"Not Found"}'
    assert fine == '{"count":3}' and metrics == {"tool_errors": 3, "bad_tool_calls": 0}
    assert session.failure is None, "an answer, even an error, is the model's to read"


async def test_a_tool_call_that_got_no_answer_fails_the_rollout_at_verify():
    server = StandIn().start()
    env = NemoGymServer(server.url, tools=NAMES)
    try:
        typed, session, outs = await rollout(env, counter_row(), ("increment_counter", {"count": 1}))
        assert outs == ['{"success":true}']
        server.stop()
        with pytest.raises(RolloutFailure, match="POST /increment_counter: no answer") as info:
            await env.tools()[0](session, {"count": 2})
        assert info.value.kind is ErrorKind.tool and info.value.retryable
        with pytest.raises(RolloutFailure) as at_verify:
            await env.verify(typed, session, transcript())
        assert at_verify.value is info.value, "the rollout fails with the tool's reason, not a reward"
    finally:
        await env.aclose()


async def test_one_shared_client_opened_by_setup_and_closed_by_aclose(standin):
    env = NemoGymServer(standin.url, tools=NAMES, max_connections=3)
    await env.setup()
    client = env._http
    assert client is not None and client.connector.limit == 3
    for _ in range(2):
        await rollout(env, counter_row(), ("get_counter_value", {}))
    assert env._http is client, "rollouts share the client; their sessions are their cookies"
    await env.aclose()
    assert client.closed and env._http is None
    await env.aclose()  # twice is harmless


async def test_a_thousand_concurrent_rollouts_keep_their_sessions_apart_on_a_few_connections(standin):
    """1,000 rollouts at once on one environment (one process's loops): each seeds, adds and verifies
    in its own session over a pool of 16 connections; every reward is its own, no session is shared."""
    import asyncio

    env = NemoGymServer(standin.url, tools=NAMES, max_connections=16)
    await env.setup()
    add = {t.name: t for t in env.tools()}["increment_counter"]
    n, before = 1000, len(standin.seen)

    async def one(i: int):
        typed = env.check_row(counter_row(i, i + 2 * (i % 3) + (i % 2)))  # odd i: expects one more than it adds
        session = env.new_state(typed)
        for _ in range(i % 3):
            await asyncio.sleep(0.001 * (i % 7))  # the policy's turn: other rollouts' requests go between
            await add(session, {"count": 2})
        await asyncio.sleep(0.001 * (i % 5))
        verdict = await env.verify(typed, session, transcript())
        return sid_of(session), verdict.reward

    try:
        got = await asyncio.gather(*(one(i) for i in range(n)))
        assert env._http.connector.limit == 16
    finally:
        await env.aclose()
    assert len({sid for sid, _ in got}) == n
    assert [reward for _, reward in got] == [float(i % 2 == 0) for i in range(n)]
    assert len(standin.seen) - before == n * 2 + sum(i % 3 for i in range(n)), "one seed, the adds, one verify each"


COUNTER_SCRIPT = [
    hermes("increment_counter", {"count": "one"}),
    hermes("increment_counter", {"count": 1}),
    hermes("increment_counter", {"count": 2}),
    hermes("get_counter_value"),
    "The count is 6.",
]


async def run_scripted(env, tokenizer, row: dict, script: list[str]):
    agent = AgentLoop.over_tokens(env, ScriptedPolicy(tokenizer, list(script)), tokenizer)
    task = Task.new(run_id="s", agent="nemo_gym_server", row=row, reply_to="x")
    await env.setup()
    try:
        return await agent.run(task, AgentContext(worker_id="test", settings=None))
    finally:
        await env.aclose()


async def test_the_agent_loop_with_a_scripted_policy_against_the_standin(standin, tokenizer):
    got = await run_scripted(NemoGymServer(standin.url, tools=NAMES), tokenizer, counter_row(3, 6), COUNTER_SCRIPT)
    assert got.status is Status.ok and got.reward == 1.0
    assert (got.metrics["tool_calls"], got.metrics["tool_errors"]) == (4, 1)
    assert (got.metrics["counter"], got.metrics["function_calls"]) == (6, 4)
    results = [o["output"] for o in got.output if o["type"] == "function_call_output"]
    assert results[0].startswith("Error: bad arguments for increment_counter: the server refused the arguments:")
    assert results[1:] == ['{"success":true}', '{"success":true}', '{"count":6}']
    sent = standin.seen[-1][2]["response"]["output"]
    assert [i["type"] for i in sent] == ["function_call", "function_call_output"] * 4 + ["message"]
    assert sent[-1]["content"][0]["text"] == "The count is 6."
