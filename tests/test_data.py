"""Dataset files: generate, prepare (validate, add agent_ref), blend; NeMo Gym rows load unchanged."""

import json
import tracemalloc
from collections import Counter

import pytest

from envs.data import DataError, check_row, run_blend, run_generate, run_prepare
from farm import schema
from farm.errors import UnknownAgent
from farm.schema import Task
from workers.loops.agent import known_agents

AGENTS = {"session_state", "single_tool_call", "noop"}

# Rows as NeMo Gym writes them: its session-state example (tools in the row, ground truth at the
# top level, the bookkeeping fields its rollout collection adds) and a math row whose agent_ref
# names a NeMo Gym agent this farm does not have.
NEMO_GYM_COUNTER = {
    "responses_create_params": {
        "input": [{"role": "user", "content": "add 4 then add 5 then get the count"}],
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
        "parallel_tool_calls": False,
    },
    "agent_ref": {"type": "responses_api_agents", "name": "session_state"},
    "expected_count": 15,
    "initial_count": 6,
    "_ng_task_index": 1,
    "_ng_rollout_index": 0,
}
NEMO_GYM_MATH = {
    "responses_create_params": {
        "input": [
            {"role": "system", "content": "Put the final answer in \\boxed{}."},
            {"role": "user", "content": [{"type": "input_text", "text": "What is 6 x 7?"}]},
        ]
    },
    "question": "What is 6 x 7?",
    "expected_answer": "42",
    "agent_ref": {"type": "responses_api_agents", "name": "math_with_judge_simple_agent"},
}


def write(path, lines):
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return path


def read(path):
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def good(i=0, **extra):
    return {"responses_create_params": {"input": [{"role": "user", "content": f"q{i}"}]}, "answer": i, **extra}


# -- generate ---------------------------------------------------------------------------------
def test_generate_is_deterministic_and_routes_every_row(tmp_path):
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    summary = run_generate("session_state", 25, 3, a)
    run_generate("session_state", 25, 3, b)
    run_generate("session_state", 25, 4, c)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    rows = read(a)
    assert summary.rows == len(rows) == 25
    assert all(r["agent_ref"] == {"type": "responses_api_agents", "name": "session_state"} for r in rows)
    assert all(check_row(r, agents=AGENTS) == [] for r in rows)


def test_generate_for_another_agent_name_and_to_stdout(tmp_path, capsys):
    run_generate("single_tool_call", 3, 0, "-", agent="weather")
    out = capsys.readouterr()
    rows = [json.loads(ln) for ln in out.out.splitlines()]
    assert len(rows) == 3 and {r["agent_ref"]["name"] for r in rows} == {"weather"}
    assert "generated 3 rows" in out.err


def test_generate_an_unknown_environment_fails_before_writing(tmp_path):
    with pytest.raises(UnknownAgent, match="no_such_env"):
        run_generate("no_such_env", 3, 0, tmp_path / "x.jsonl")
    assert not (tmp_path / "x.jsonl").exists()


# -- prepare ----------------------------------------------------------------------------------
BAD_FILE = [
    good(1, agent_ref={"type": "responses_api_agents", "name": "noop"}),  # 1 ok
    '{"responses_create_params": {"input": "hi"',  # 2 truncated JSON
    "[1, 2, 3]",  # 3 not an object
    {"question": "no params", "agent_ref": {"name": "noop"}},  # 4 no responses_create_params
    {"responses_create_params": {"input": []}, "agent_ref": {"name": "noop"}},  # 5 empty input
    "",  # 6 blank: skipped
    {"responses_create_params": {"input": [{"content": "no role"}]}, "agent_ref": {"name": "noop"}},  # 7
    good(8, agent_ref={"type": "responses_api_agents", "name": "nobody"}),  # 8 unknown agent
    good(9, agent_ref={"type": "resources_servers", "name": "noop"}),  # 9 wrong type
    good(10),  # 10 no agent_ref, no --agent
    {"responses_create_params": {"input": "x", "tools": [{"type": "function"}]}, "agent_ref": {"name": "noop"}},
]


def test_prepare_reports_every_bad_row_by_line_and_writes_nothing(tmp_path):
    path = write(tmp_path / "bad.jsonl", BAD_FILE)
    before = path.read_bytes()
    with pytest.raises(DataError) as info:
        run_prepare(path, agents=AGENTS)
    msg = str(info.value)
    assert [e.line for e in info.value.errors] == [2, 3, 4, 5, 7, 8, 9, 10, 11]
    for needle in (
        "line 2: invalid JSON",
        "line 3: a row must be a JSON object",
        "line 4: missing `responses_create_params`",
        "line 5: `responses_create_params.input` is empty",
        "line 7: `responses_create_params.input[0]` has role None",
        "line 8: unknown agent_ref name 'nobody'",
        "line 9: `agent_ref.type`",
        "line 10: missing `agent_ref`",
        "line 11: `responses_create_params.tools[0]`",
    ):
        assert needle in msg
    assert path.read_bytes() == before, "a failed prepare leaves the file as it was"
    assert list(tmp_path.iterdir()) == [path], "no temporary file is left behind"


def test_prepare_without_strict_drops_bad_rows_and_says_which(tmp_path, capsys):
    path = write(tmp_path / "bad.jsonl", BAD_FILE)
    out = tmp_path / "ok.jsonl"
    summary = run_prepare(path, output=out, strict=False, agents=AGENTS)
    assert summary.rows == 1 and summary.dropped == 9
    assert [r["answer"] for r in read(out)] == [1]
    assert "line 8" in capsys.readouterr().err


def test_prepare_adds_a_missing_agent_ref_and_keeps_existing_ones(tmp_path):
    path = write(tmp_path / "d.jsonl", [good(0), good(1, agent_ref={"name": "noop"}), good(2)])
    summary = run_prepare(path, agent="session_state", agents=AGENTS)
    rows = read(path)
    assert [r["agent_ref"] for r in rows] == [
        {"type": "responses_api_agents", "name": "session_state"},
        {"type": "responses_api_agents", "name": "noop"},  # its type filled in, its name kept
        {"type": "responses_api_agents", "name": "session_state"},
    ]
    assert [r["answer"] for r in rows] == [0, 1, 2]
    assert summary.agent_refs_added == 2 and summary.per_agent == {"session_state": 2, "noop": 1}


def test_prepare_an_unknown_agent_name_or_an_empty_file_fails(tmp_path):
    path = write(tmp_path / "d.jsonl", [good(0)])
    with pytest.raises(UnknownAgent, match="unknown agent 'nobody'"):
        run_prepare(path, agent="nobody", agents=AGENTS)
    with pytest.raises(DataError, match="no rows"):
        run_prepare(write(tmp_path / "empty.jsonl", ["", "  "]))
    with pytest.raises(DataError, match="no such file"):
        run_prepare(tmp_path / "missing.jsonl")


def test_prepare_streams_a_large_file(tmp_path):
    path = tmp_path / "big.jsonl"
    with open(path, "w") as f:
        for i in range(8000):
            f.write(json.dumps(good(i, padding="x" * 200)) + "\n")
    size = path.stat().st_size
    tracemalloc.start()
    try:
        summary = run_prepare(path, agent="noop", output=tmp_path / "out.jsonl")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert summary.rows == 8000
    assert peak < size / 20, f"peak {peak} bytes for a {size}-byte file: the file was held in memory"


def test_a_nemo_gym_row_loads_unchanged(tmp_path):
    path = write(tmp_path / "gym.jsonl", [NEMO_GYM_COUNTER])
    run_prepare(path, agents=known_agents())
    [row] = read(path)
    assert row == NEMO_GYM_COUNTER
    # ... and travels the wire as it is.
    task = Task.new(run_id="r", agent=row["agent_ref"]["name"], row=row, reply_to="farm:results:r")
    assert schema.decode_task(schema.entry(task)).row == NEMO_GYM_COUNTER


def test_a_nemo_gym_row_for_an_agent_we_do_not_have_is_retargeted(tmp_path):
    path = write(tmp_path / "gym.jsonl", [NEMO_GYM_MATH])
    with pytest.raises(DataError, match="unknown agent_ref name 'math_with_judge_simple_agent'"):
        run_prepare(path, agents=AGENTS)
    run_prepare(path, agent="noop", replace_agent=True, agents=AGENTS)
    [row] = read(path)
    assert row == {**NEMO_GYM_MATH, "agent_ref": {"type": "responses_api_agents", "name": "noop"}}


def test_known_agents_are_environments_and_agents():
    names = known_agents()
    assert {"session_state", "single_tool_call", "noop"} <= names


# -- blend ------------------------------------------------------------------------------------
def agent_file(tmp_path, name, n):
    return write(
        tmp_path / f"{name}.jsonl",
        [good(i, agent_ref={"type": "responses_api_agents", "name": name}) for i in range(n)],
    )


def test_blend_is_balanced_shuffled_and_deterministic(tmp_path):
    inputs = [agent_file(tmp_path, "a", 30), agent_file(tmp_path, "b", 7), agent_file(tmp_path, "c", 12)]
    one, two, other = tmp_path / "1.jsonl", tmp_path / "2.jsonl", tmp_path / "3.jsonl"
    summary = run_blend(inputs, one, seed=1)
    run_blend(inputs, two, seed=1)
    run_blend(inputs, other, seed=2)
    assert one.read_bytes() == two.read_bytes() != other.read_bytes()
    rows = read(one)
    assert summary.rows == len(rows) == 21
    assert Counter(r["agent_ref"]["name"] for r in rows) == {"a": 7, "b": 7, "c": 7}
    names = [r["agent_ref"]["name"] for r in rows]
    assert names != sorted(names), "the mix is shuffled, not concatenated"
    assert len({(r["agent_ref"]["name"], r["answer"]) for r in rows}) == 21, "no row is taken twice"
    originals = set(inputs[0].read_text().splitlines())
    assert {ln for ln in one.read_text().splitlines() if '"a"}' in ln} <= originals, "rows are copied verbatim"


def test_blend_without_balance_takes_every_row(tmp_path):
    inputs = [agent_file(tmp_path, "a", 30), agent_file(tmp_path, "b", 7)]
    out = tmp_path / "all.jsonl"
    run_blend(inputs, out, balance=False, seed=0)
    assert Counter(r["agent_ref"]["name"] for r in read(out)) == {"a": 30, "b": 7}


def test_blend_refuses_rows_that_cannot_be_routed(tmp_path):
    routed = agent_file(tmp_path, "a", 3)
    unrouted = write(tmp_path / "u.jsonl", [good(0, agent_ref={"name": "b"}), good(1), "{oops"])
    out = tmp_path / "out.jsonl"
    with pytest.raises(DataError) as info:
        run_blend([routed, unrouted], out)
    assert [e.line for e in info.value.errors] == [2, 3] and "missing `agent_ref`" in str(info.value)
    assert not out.exists()
    with pytest.raises(DataError, match="no such file"):
        run_blend([routed, tmp_path / "nope.jsonl"], out)
    with pytest.raises(DataError, match="no rows"):
        run_blend([routed, write(tmp_path / "e.jsonl", [""])], out)
