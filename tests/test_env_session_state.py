"""session_state: its tools, its verifier, its data, and a smoke run through the whole farm.

Verifier correctness is tested directly, with known-right and known-wrong counters; the
real-vLLM smoke test only checks the pipeline (SmolLM2-135M rarely calls tools correctly).
A scripted policy drives the real agent loop and tokenizer to show that a model that calls
the tools right earns reward 1, without needing a model that does.
"""

import asyncio
import re

import pytest
from helpers.policies import ScriptedPolicy, hermes
from helpers.workers import run_through_worker

from envs.data import check_row
from envs.sdk import RowError, Transcript, load_env
from envs.session_state import TOOLS, Counter, SessionState, generate, increment_counter
from farm.errors import RolloutFailure
from farm.schema import Sampling, Task
from workers.loops.agent import AgentContext
from workers.loops.loop import AgentLoop

# A row as NeMo Gym's example_session_state_mgmt data has it (its tools name the argument `count`).
REFERENCE_ROW = {
    "responses_create_params": {
        "input": [{"role": "user", "content": "add 1 then add 2 then get the count"}],
        "tools": [
            {
                "name": "increment_counter",
                "parameters": {
                    "type": "object",
                    "properties": {"count": {"type": "integer", "description": ""}},
                    "required": ["count"],
                    "additionalProperties": False,
                },
                "strict": True,
                "type": "function",
                "description": "",
            },
            {
                "name": "get_counter_value",
                "parameters": {"type": "object", "properties": {}, "required": [], "additionalProperties": False},
                "strict": True,
                "type": "function",
                "description": "",
            },
        ],
    },
    "agent_ref": {"type": "responses_api_agents", "name": "session_state"},
    "expected_count": 6,
    "initial_count": 3,
}


def row(**fields):
    """A typed row with the given ground truth (as the worker hands it to the environment)."""
    return SessionState().check_row({"responses_create_params": {"input": "add"}, **fields})


def verify(row, state, text=""):
    return asyncio.run(SessionState().verify(row, state, Transcript(final_text=text, output=[], tool_calls=[])))


def test_registered_under_its_entry_point():
    env = load_env("session_state")
    assert isinstance(env, SessionState) and env.agent.loop == "tool_use"
    assert [t.name for t in env.tools()] == ["increment_counter", "get_counter_value"]


async def test_tools_change_the_counter_as_documented():
    state = SessionState().new_state(row(initial_count=3, expected_count=0))
    add, get = TOOLS["increment_counter"], TOOLS["get_counter_value"]
    assert await get(state, {}) == {"count": 3}
    assert await add(state, {}) == {"success": True}  # default 1
    await add(state, {"count": 4})  # NeMo Gym's name
    await add(state, {"amount": 2})  # accepted alias
    await add(state, {"count": -5})
    assert await get(state, {}) == {"count": 5}
    assert (state.value, state.increments, state.reads) == (5, 4, 2)
    for bad in ({"count": "3"}, {"count": 1.5}, {"count": True}, {"count": 1, "amount": 1}, {"step": 1}, ["count"]):
        with pytest.raises(TypeError):
            await add(state, bad)
    assert state.value == 5, "a rejected call leaves the counter alone"


def test_tool_schemas_come_from_the_signatures_and_docstrings():
    add = TOOLS["increment_counter"].schema()["function"]
    assert add["description"] == "Add an integer to the counter (default 1)."
    assert add["parameters"] == {
        "type": "object",
        "required": [],
        "additionalProperties": False,
        "properties": {
            "count": {"type": "integer", "description": "How much to add."},
            "amount": {"type": "integer", "description": "How much to add (another name for count)."},
        },
    }


def test_every_rollout_starts_from_a_fresh_counter():
    env = SessionState()
    a, b = env.new_state(row(initial_count=5, expected_count=1)), env.new_state(row(initial_count=5, expected_count=1))
    asyncio.run(increment_counter(a, count=10))
    assert (a.value, b.value) == (15, 5)
    assert env.new_state(row(expected_count=1)).value == 0
    with pytest.raises(RowError, match="initial_count"):
        row(initial_count="five", expected_count=1)


@pytest.mark.parametrize("initial,adds,expected", [(0, [1], 1), (3, [1, 2], 6), (7, [9, 9, 9], 34), (2, [-2], 0)])
def test_full_reward_when_the_counter_holds_the_expected_count(initial, adds, expected):
    state = Counter(value=initial)
    for a in adds:
        asyncio.run(increment_counter(state, count=a))
    v = verify(row(expected_count=expected), state, text=f"The count is {expected}.")
    assert v.reward == 1.0 and v.components == {"called_tool": 1.0, "right_count": 1.0}
    assert v.metrics["counter"] == expected and v.metrics["answered_count"] is True


@pytest.mark.parametrize("value,expected", [(5, 6), (7, 6), (0, 1), (-1, 1), (60, 6)])
def test_no_reward_for_a_wrong_count(value, expected):
    v = verify(row(expected_count=expected), Counter(value=value, increments=1))
    assert v.reward == 0.0 and v.components["right_count"] == 0.0


def test_the_verifier_reads_the_counter_not_the_models_claim():
    v = verify(row(expected_count=6), Counter(value=3), text="I added 1 and 2; the count is 6.")
    assert v.reward == 0.0 and v.components["called_tool"] == 0.0 and v.metrics["answered_count"] is False


@pytest.mark.parametrize("fields", [{}, {"expected_count": "six"}, {"expected_count": None}, {"expected_count": 6.5}])
def test_a_row_without_a_usable_expected_count_is_an_error_not_a_zero(fields):
    with pytest.raises(RowError, match="expected_count"):
        row(**fields)


def test_generation_is_deterministic_and_consistent():
    a, b, c = generate(20, seed=7), generate(20, seed=7), generate(20, seed=8)
    assert a == b and a != c
    assert SessionState().generate(20, seed=7) == a
    for row in a:
        assert check_row(row) == []
        adds = [int(x) for x in re.findall(r"add (\d+)", row["responses_create_params"]["input"][-1]["content"])]
        assert row["expected_count"] == row["initial_count"] + sum(adds)
        assert row["agent_ref"] == {"type": "responses_api_agents", "name": "session_state"}


def test_a_nemo_gym_row_scores_unchanged():
    env = SessionState()
    reference = env.check_row(REFERENCE_ROW)
    state = env.new_state(reference)
    assert state.value == 3
    assert verify(reference, state).reward == 0.0
    asyncio.run(increment_counter(state, count=1))
    asyncio.run(increment_counter(state, count=2))
    assert verify(reference, state).reward == 1.0


@pytest.mark.parametrize(
    "script,reward",
    [
        (
            [
                hermes("increment_counter", {"count": 1}),
                hermes("increment_counter", {"count": 2}),
                hermes("get_counter_value"),
                "The count is 6.",
            ],
            1.0,
        ),
        ([hermes("increment_counter", {"count": 1}) + hermes("increment_counter", {"count": 2}), "It is 6."], 1.0),
        ([hermes("increment_counter", {"count": 3}), hermes("increment_counter", {"count": "x"}), "6"], 1.0),
        ([hermes("increment_counter", {"count": 1}), "The count is 6."], 0.0),
        (["The count is 6."], 0.0),
    ],
)
async def test_the_agent_loop_with_a_scripted_policy(tokenizer, script, reward):
    agent = AgentLoop.over_tokens(SessionState(), ScriptedPolicy(tokenizer, script), tokenizer)
    task = Task.new(run_id="s", agent="session_state", row=REFERENCE_ROW, reply_to="x")
    rollout = await agent.run(task, AgentContext(worker_id="test", settings=None))
    assert rollout.reward == reward and rollout.status.value == "ok"
    assert rollout.reward_components["right_count"] == reward
    n_calls = sum(s.count("<tool_call>") for s in script)
    assert rollout.metrics["tool_calls"] == n_calls
    assert (0 in rollout.trace.mask()) == (n_calls > 0), "tool results are environment tokens (mask 0)"
    kinds = [o["type"] for o in rollout.output]
    assert kinds.count("function_call_output") == n_calls


async def test_a_missing_expected_count_fails_the_rollout_as_malformed_before_any_model_call(tokenizer):
    row = {k: v for k, v in REFERENCE_ROW.items() if k != "expected_count"}
    policy = ScriptedPolicy(tokenizer, ["6"])
    agent = AgentLoop.over_tokens(SessionState(), policy, tokenizer)
    task = Task.new(run_id="s", agent="session_state", row=row, reply_to="x")
    with pytest.raises(RolloutFailure, match="expected_count") as info:
        await agent.run(task, AgentContext(worker_id="test", settings=None))
    assert info.value.kind == "malformed"
    assert policy.turns == ["6"], "no model call is spent on a row that cannot be scored"


@pytest.mark.slow
@pytest.mark.vllm
def test_worker_runs_session_state_against_real_vllm(settings, vllm, model_dir):
    """A few real rollouts through Redis, a `farm worker` process and the shared vLLM."""
    got = run_through_worker(
        settings,
        vllm,
        model_dir,
        "session_state",
        generate(4, seed=1),
        sampling=lambda i: Sampling(max_tokens=32, seed=i),
    )
    assert len(got) == 4
    for r in got:
        assert r.status.value in ("ok", "truncated"), r.error
        assert r.reward in (0.0, 1.0) and set(r.reward_components) == {"called_tool", "right_count"}
        assert isinstance(r.metrics["counter"], int)
        n = len(r.trace.completion())
        assert n > 0 and len(r.trace.completion_logprobs()) == n
        assert r.timings.model_s > 0 and r.worker_id.startswith("session_state@")


async def test_nemo_gym_published_session_sequence():
    """NeMo Gym's example_session_state_mgmt test, as data: a counter per session starting at 0;
    each rollout's state is its session here (a fresh state per rollout)."""
    env = SessionState()
    add, get = TOOLS["increment_counter"], TOOLS["get_counter_value"]
    first = env.new_state(row(initial_count=0, expected_count=0))
    assert await get(first, {}) == {"count": 0}
    assert await add(first, {"count": 2}) == {"success": True}
    assert await get(first, {}) == {"count": 2}
    second = env.new_state(row(initial_count=0, expected_count=0))  # a new session
    assert await add(second, {"count": 4}) == {"success": True}
    assert await get(second, {}) == {"count": 4}
    assert await add(second, {"count": 3}) == {"success": True}
    assert await get(second, {}) == {"count": 7}
    assert await get(first, {}) == {"count": 2}  # sessions do not share state
