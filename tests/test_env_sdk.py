"""The environment SDK: tools from signatures, typed rows, setup/aclose driven by the worker,
one failure-kind enum, and every shipped environment on it."""

from __future__ import annotations

import asyncio
import json
from typing import Literal, Optional

import msgspec
import pytest
from helpers.policies import ScriptedPolicy

from envs.data import check_row, row_types, run_prepare
from envs.sdk import (
    AgentRef,
    AgentSettings,
    Environment,
    ErrorKind,
    Row,
    RowError,
    ToolArgumentError,
    Toolset,
    Transcript,
    Verdict,
    available_envs,
    load_env,
    parse_row,
)
from farm.client import FarmClient
from farm.errors import ConfigError, MalformedEntry, RolloutFailure
from farm.schema import AgentRef as WireAgentRef
from farm.schema import Rollout, RolloutError, Status, Task, decode_task, encode, entry
from workers.delivery.runtime import Worker
from workers.loops.loop import AgentLoop

TOOLS = Toolset()


@TOOLS.tool
async def book(
    state: list,
    room: str,
    nights: int,
    breakfast: bool = False,
    guests: Optional[list[str]] = None,
    kind: Literal["single", "double"] = "double",
    budget: float = 100.0,
) -> dict:
    """Book a hotel room.

    Longer notes that are not part of the description.

    Args:
        room: Room number
            (as printed on the door).
        nights: How many nights.
        kind: The bed.
    """
    state.append((room, nights, breakfast, guests, kind, budget))
    return {"booked": room}


@TOOLS.tool("Count the bookings.")
def count(state: list) -> int:
    return len(state)


def test_a_tool_schema_comes_from_its_signature_and_docstring():
    schema = TOOLS["book"].schema()
    assert schema["type"] == "function" and schema["function"]["name"] == "book"
    assert schema["function"]["description"] == "Book a hotel room."
    params = schema["function"]["parameters"]
    assert params["required"] == ["room", "nights"] and params["additionalProperties"] is False
    props = params["properties"]
    assert props["room"] == {"type": "string", "description": "Room number (as printed on the door)."}
    assert props["nights"] == {"type": "integer", "description": "How many nights."}
    assert props["breakfast"] == {"type": "boolean", "default": False}
    assert props["guests"] == {"type": "array", "items": {"type": "string"}}
    assert props["kind"] == {"enum": ["double", "single"], "default": "double", "description": "The bed."}
    assert props["budget"] == {"type": "number", "default": 100.0}
    assert TOOLS["count"].parameters == {
        "type": "object",
        "properties": {},
        "required": [],
        "additionalProperties": False,
    }
    assert TOOLS.names() == ["book", "count"] and "book" in TOOLS and len(TOOLS) == 2


async def test_arguments_are_checked_strictly_before_the_tool_runs():
    state: list = []
    assert await TOOLS["book"](state, {"room": "12", "nights": 2, "budget": 80}) == {"booked": "12"}
    assert await TOOLS["count"](state, {}) == 1  # a plain function works too
    assert state == [("12", 2, False, None, "double", 80)]
    bad = [
        ({"room": "12", "nights": "2"}, "Expected `int`, got `str` - argument `nights`"),
        ({"room": "12", "nights": True}, "Expected `int`, got `bool`"),
        ({"room": "12", "nights": 1.5}, "Expected `int`, got `float`"),
        ({"room": 12, "nights": 1}, "Expected `str`, got `int` - argument `room`"),
        ({"room": "1", "nights": 1, "kind": "triple"}, "Invalid enum value 'triple'"),
        ({"room": "1", "nights": 1, "pets": 2}, "unknown argument `pets`"),
        ({"nights": 1}, "missing required argument `room`"),
        (["room"], "arguments must be an object"),
    ]
    for arguments, message in bad:
        with pytest.raises(ToolArgumentError, match=message.replace("(", r"\(").replace(")", r"\)")):
            await TOOLS["book"](state, arguments)
        assert issubclass(ToolArgumentError, TypeError)  # the agent loop's "bad arguments" path
    assert len(state) == 1, "a refused call never reaches the tool"


async def test_a_lenient_toolset_checks_names_and_leaves_types_to_the_tool():
    lenient = Toolset(check_types=False)

    @lenient.tool
    def get(state: None, item_id: str) -> str:
        """Fetch an item.

        Args:
            item_id: 8-digit id
        """
        return str(item_id).zfill(8)

    assert lenient["get"].parameters["properties"]["item_id"] == {"type": "string", "description": "8-digit id"}
    assert await lenient["get"](None, {"item_id": 5}) == "00000005"
    with pytest.raises(ToolArgumentError, match="unknown argument `id`"):
        await lenient["get"](None, {"id": 5})


def test_declaring_a_tool_wrongly_fails_at_import_not_at_rollout():
    tools = Toolset()
    tools.tool(count)
    with pytest.raises(ValueError, match="declared twice"):
        tools.tool(count)
    with pytest.raises(TypeError, match="not in its signature"):
        tools.tool("Adds.", cents="money")(lambda state, amount: amount)
    with pytest.raises(TypeError, match=r"\*args"):
        tools.tool("Anything.")(lambda state, **kw: kw)


class TicketRow(Row):
    ticket: int
    tags: list[str] = []


def test_rows_are_typed_strictly_and_keep_what_they_do_not_declare():
    row = {
        "responses_create_params": {"input": "hi", "temperature": 0.5},
        "ticket": 7,
        "extra": {"any": 1},
        "agent_ref": {"name": "tickets"},
    }
    typed = parse_row(row, TicketRow)
    assert typed.ticket == 7 and typed.tags == [] and typed.responses_create_params.input == "hi"
    assert typed.agent_ref.name == "tickets" and typed.agent_ref.type == "responses_api_agents"
    for bad, where in [
        ({**row, "ticket": "7"}, "ticket"),
        ({**row, "ticket": None}, "ticket"),
        ({k: v for k, v in row.items() if k != "ticket"}, "ticket"),
        ({**row, "tags": "a"}, "tags"),
        ({"ticket": 1}, "responses_create_params"),
        ({**row, "responses_create_params": {"input": 3}}, "responses_create_params.input"),
    ]:
        with pytest.raises(RowError, match=f"row does not fit TicketRow: .*{where}"):
            parse_row(bad, TicketRow)


def test_a_rows_agent_ref_is_the_wire_agent_ref_and_keeps_ignoring_what_it_does_not_declare():
    """One AgentRef (farm.schema's): a row's is read as leniently as the row, the wire's strictly."""
    ref = {"name": "tickets", "since": "v2"}
    typed = parse_row({"responses_create_params": {"input": "hi"}, "agent_ref": ref}, Row)
    assert AgentRef is WireAgentRef and isinstance(typed.agent_ref, AgentRef)
    task = Task.new(run_id="r", agent="tickets", row={}, reply_to="farm:results:r")
    task = msgspec.structs.replace(task, agent_ref=typed.agent_ref)
    assert decode_task(entry(task)).agent_ref == AgentRef(name="tickets")
    raw = msgspec.msgpack.decode(encode(task))
    raw["agent_ref"] = ref
    with pytest.raises(MalformedEntry, match="since"):
        decode_task({b"v": b"1", b"d": msgspec.msgpack.encode(raw)})


class Recording(Environment):
    """Records what the worker calls, in order."""

    name = "recording"
    agent = AgentSettings(loop="single_turn", max_steps=1)
    row_type = TicketRow

    def __init__(self, fail_setup: bool = False):
        self.calls: list[str] = []
        self.fail_setup = fail_setup

    async def setup(self) -> None:
        self.calls.append("setup")
        if self.fail_setup:
            raise RuntimeError("the pool would not start")

    async def aclose(self) -> None:
        self.calls.append("aclose")

    def new_state(self, row: TicketRow) -> int:
        assert isinstance(row, TicketRow), "new_state gets the typed row"
        self.calls.append("new_state")
        return row.ticket

    async def verify(self, row: TicketRow, state: int, transcript: Transcript) -> Verdict:
        self.calls.append("verify")
        return Verdict(reward=float(transcript.final_text.strip() == str(row.ticket)))


async def test_the_worker_sets_the_environment_up_first_and_closes_it_when_it_stops(settings, tokenizer):
    env = Recording()
    agent = AgentLoop.over_tokens(env, ScriptedPolicy(tokenizer, ["7", "8"]), tokenizer)
    worker = Worker(settings, "recording", agent, concurrency=1)
    run = asyncio.create_task(worker.run())
    client = FarmClient(settings)
    rows = [
        {"responses_create_params": {"input": "Which ticket?"}, "ticket": 7},
        {"responses_create_params": {"input": "Which ticket?"}, "ticket": "8"},  # not an int: malformed
        {"responses_create_params": {"input": "Which ticket?"}, "ticket": 8},
    ]
    tasks = [client.task(run_id="sdk", agent="recording", row=r) for r in rows]
    try:
        await client.submit(tasks, check_agents=False)  # `recording`'s worker is starting beside this
        got = await client.collect(tasks, timeout_s=60)
    finally:
        worker.request_stop()
        await asyncio.wait_for(run, 30)
        await client.aclose()
    first, broken, third = (got[t.task_id] for t in tasks)
    assert (first.status, first.reward, third.reward) == (Status.ok, 1.0, 1.0)
    assert broken.status is Status.failed and broken.error.kind is ErrorKind.malformed
    assert "ticket" in broken.error.message and "Expected `int`, got `str`" in broken.error.message
    assert env.calls[0] == "setup" and env.calls[-1] == "aclose"
    assert env.calls.count("setup") == 1 and env.calls.count("aclose") == 1
    assert env.calls.count("verify") == 2, "the malformed row never reaches the environment"


async def test_a_setup_that_fails_stops_the_worker_with_the_reason(settings, tokenizer):
    env = Recording(fail_setup=True)
    worker = Worker(
        settings, "recording", AgentLoop.over_tokens(env, ScriptedPolicy(tokenizer, []), tokenizer), concurrency=1
    )
    with pytest.raises(
        ConfigError, match="agent recording: its environment's setup failed: RuntimeError: the pool would not start"
    ):
        await asyncio.wait_for(worker.run(), 30)
    assert env.calls == ["setup", "aclose"], "what setup started is closed again"


def test_failure_kinds_are_one_enum_on_the_wire():
    task = Task.new(run_id="r", agent="a", row={}, reply_to="x")
    rollout = Rollout.failure(task, "verifier", "boom")
    assert rollout.error.kind is ErrorKind.verifier
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(rollout), type=Rollout)
    assert decoded.error.kind is ErrorKind.verifier
    with pytest.raises(msgspec.ValidationError, match="Invalid enum value 'gremlins'"):
        msgspec.msgpack.decode(msgspec.msgpack.encode({"kind": "gremlins", "message": "m"}), type=RolloutError)
    with pytest.raises(ValueError, match="gremlins"):
        RolloutFailure("gremlins", "a kind that is not one of ErrorKind")
    assert RolloutFailure(ErrorKind.tool, "x").kind is ErrorKind.tool


ENVS = [
    "code_gen",
    "instruction_following",
    "llm_judge",
    "math",
    "mcqa",
    "reasoning_gym",
    "session_state",
    "single_tool_call",
    "verifiers",
    "workplace_assistant",
]


# Environments whose rows, tools and verdicts are an outside server's: no generator of their own, and
# their tools' arguments are checked by that server.
SERVER_ENVS = ["nemo_gym_server"]
SANDBOX_ENVS = ["harbor"]  # rows come from a task suite (tests/test_harbor_*.py), each rollout in a sandbox
# Rows, tools and rewards are the classes' an agent names (envs/factory; tests/test_factory*.py).
FACTORY_ENVS = ["environment_factory"]


def test_every_shipped_environment_is_on_the_sdk():
    assert sorted(available_envs()) == sorted(ENVS + SERVER_ENVS + SANDBOX_ENVS + FACTORY_ENVS)
    for name in ENVS + SERVER_ENVS + SANDBOX_ENVS + FACTORY_ENVS:
        cls = available_envs()[name].load()
        assert issubclass(cls, Environment) and cls.row_type is not Row and issubclass(cls.row_type, Row), name
        # What setup opens (pools, clients, servers), aclose closes: overriding setup means overriding aclose.
        opens = cls.setup is not Environment.setup
        assert not opens or cls.aclose is not Environment.aclose, f"{name} overrides setup but not aclose"


@pytest.mark.parametrize("name", [e for e in ENVS if e != "code_gen"] + ["code_gen"])
async def test_generated_rows_fit_their_environment_and_tools_come_from_one_registry(name):
    options = {"start_sandbox_worker": False} if name == "code_gen" else None
    env = load_env(name, options)
    try:
        rows = json.loads(json.dumps(env.generate(3, seed=1)))
        for row in rows:
            typed = env.check_row(row)
            assert isinstance(typed, env.row_type)
        for tool in env.tools():
            assert tool.arguments is not None, f"{name}.{tool.name} is declared with the Toolset decorator"
    finally:
        await env.aclose()


def test_data_prepare_checks_rows_against_their_environment(tmp_path):
    of = row_types({"counter": "session_state"})
    good = {"responses_create_params": {"input": "add 1"}, "agent_ref": {"name": "counter"}, "expected_count": 1}
    assert check_row(good, row_type_of=of) == []
    bad = {**good, "expected_count": "one"}
    assert check_row(bad, row_type_of=of) == [
        "row does not fit CounterRow: Expected `int`, got `str` - at `expected_count`"
    ]
    assert check_row({**good, "agent_ref": {"name": "noop"}}, row_type_of=of) == []  # no environment, no Row
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    from envs.data import DataError

    with pytest.raises(DataError) as info:
        run_prepare(path, row_type_of=of)
    assert "1 row invalid; nothing written" in str(info.value)
    assert "line 2: row does not fit CounterRow" in str(info.value) and "line 1" not in str(info.value)


GENERATE_ALL = """
import hashlib, json
from envs.sdk import load_env
for name in %r:
    env = load_env(name, {"start_sandbox_worker": False} if name == "code_gen" else None)
    print(name, hashlib.sha256(json.dumps(env.generate(30, seed=7), sort_keys=True).encode()).hexdigest())
"""


@pytest.mark.slow
def test_every_generator_gives_the_same_rows_in_any_process():
    """Same seed, same bytes, whatever the process's hash randomization (PYTHONHASHSEED)."""
    import os
    import subprocess
    import sys

    from helpers import ROOT

    outputs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
        out = subprocess.run(
            [sys.executable, "-c", GENERATE_ALL % ENVS], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stderr[-2000:]
        outputs.append(dict(line.split() for line in out.stdout.splitlines()))
    assert sorted(outputs[0]) == ENVS
    assert outputs[0] == outputs[1], {k for k in ENVS if outputs[0][k] != outputs[1][k]}
