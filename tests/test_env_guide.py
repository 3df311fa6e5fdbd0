"""docs/write-your-own-environment.md: its example environment, exactly as printed, works.

The module is cut out of the guide (the ```python block after its `guide-example` marker),
imported, and run through the real agent loop and tokenizer with a scripted policy, so the
guide cannot drift from the SDK without this failing.
"""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest

from envs.sdk import Environment, ErrorKind, RolloutFailure, ToolArgumentError, Transcript
from farm.schema import Status, Task
from workers.loops.agent import AgentContext
from workers.loops.loop import AgentLoop

from conftest import ROOT, ScriptedPolicy, hermes

GUIDE = ROOT / "docs" / "write-your-own-environment.md"


@pytest.fixture(scope="module")
def pantry(tmp_path_factory):
    text = GUIDE.read_text()
    found = re.search(r"<!-- guide-example: (\S+) -->\n```python\n(.*?)```", text, re.S)
    assert found, "the guide's example module is marked with <!-- guide-example: PATH -->"
    path = tmp_path_factory.mktemp("guide") / "pantry.py"
    path.write_text(found.group(2))
    spec = importlib.util.spec_from_file_location("guide_pantry", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["guide_pantry"] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules["guide_pantry"]


def said(text: str = "done", calls: list | None = None) -> Transcript:
    return Transcript(final_text=text, output=[], tool_calls=calls or [])


def test_the_example_is_an_environment_with_typed_rows_and_derived_tool_schemas(pantry):
    env = pantry.Pantry()
    assert isinstance(env, Environment) and env.row_type is pantry.PantryRow
    add = pantry.TOOLS["add_item"].schema()["function"]
    assert add["description"] == "Put items into the pantry."
    assert add["parameters"]["required"] == ["item"]
    assert add["parameters"]["properties"]["count"] == {
        "type": "integer",
        "default": 1,
        "description": "How many (default 1).",
    }
    rows = env.generate(20, seed=3)
    assert rows == env.generate(20, seed=3) and rows != env.generate(20, seed=4)
    for row in rows:
        typed = env.check_row(row)
        assert sum(typed.expected.values()) > sum(typed.start.values())


async def test_its_tools_and_verifier_on_known_cases(pantry):
    env = pantry.Pantry()
    row = {
        "responses_create_params": {"input": "Add 2 rice."},
        "start": {"salt": 1},
        "expected": {"salt": 1, "rice": 2},
    }
    state = env.new_state(env.check_row(row))
    assert await pantry.TOOLS["add_item"](state, {"item": "rice", "count": 2}) == {"item": "rice", "stock": 2}
    assert (await env.score(row, state, said())).reward == 1.0
    assert (await env.score(row, {"salt": 1, "rice": 3}, said())).reward == 0.0
    assert (await env.score(row, {"salt": 1}, said("I added 2 rice."))).reward == 0.0
    for bad in ({"item": "rice", "count": "2"}, {"count": 2}, {"item": "rice", "amount": 2}):
        with pytest.raises(ToolArgumentError):
            await pantry.TOOLS["add_item"](state, bad)
    assert state == {"salt": 1, "rice": 2}


async def test_a_scripted_model_earns_the_reward_through_the_real_loop(pantry, tokenizer):
    env = pantry.Pantry()
    row = next(r for r in env.generate(10, seed=1))
    item, count = re.search(r"Add (\d+) (\w+)", row["responses_create_params"]["input"][-1]["content"]).group(2, 1)
    script = [hermes("get_stock"), hermes("add_item", {"item": item, "count": int(count)}), "done"]
    agent = AgentLoop.over_tokens(env, ScriptedPolicy(tokenizer, script), tokenizer)
    rollout = await agent.run(
        Task.new(run_id="guide", agent="pantry", row=row, reply_to="x"), AgentContext(worker_id="test", settings=None)
    )
    assert rollout.status is Status.ok and rollout.reward == 1.0 and rollout.metrics["tool_calls"] == 2

    broken = {**row, "expected": {item: "many"}}
    with pytest.raises(RolloutFailure, match="PantryRow") as info:
        await AgentLoop.over_tokens(env, ScriptedPolicy(tokenizer, []), tokenizer).run(
            Task.new(run_id="guide", agent="pantry", row=broken, reply_to="x"),
            AgentContext(worker_id="test", settings=None),
        )
    assert info.value.kind is ErrorKind.malformed
