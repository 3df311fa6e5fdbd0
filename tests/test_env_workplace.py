"""workplace_assistant: the end-state verifier, the generator, real rollouts (tools: test_env_workplace_tools.py)."""

from __future__ import annotations

import json

import pytest
from helpers.policies import ScriptedPolicy, hermes
from helpers.workers import run_through_worker

from envs.sdk import Transcript, load_env
from envs.workplace import BadGroundTruth, WorkplaceAssistant, generate
from envs.workplace.office import TABLES, ToolError, rows_off, snapshot
from envs.workplace.replay import ground_truth_calls
from envs.workplace.seeded import build_office
from envs.workplace.tools import MUTATING, call
from envs.workplace.tools import TOOLS as OFFICE_TOOLS
from farm.schema import Sampling

ENV = WorkplaceAssistant()
TOOLS = {t.name: t for t in ENV.tools()}


def first(table: dict) -> dict:
    return next(iter(table.values()))


def row_with(calls: list[tuple[str, dict]], seed: int = 7) -> dict:
    return {
        "responses_create_params": {"input": "Do it."},
        "seed": seed,
        "ground_truth": [{"name": n, "arguments": json.dumps(a)} for n, a in calls],
    }


async def score(row: dict, calls: list[tuple[str, dict]], env=ENV):
    """Play `calls` as the model would (errors are results, not crashes), then verify."""
    row = env.check_row(row)
    state = env.new_state(row)
    tools = {t.name: t for t in env.tools()}
    for name, args in calls:
        try:
            await tools[name](state, args)
        except (ToolError, TypeError):
            pass
    transcript = Transcript(final_text="Done.", output=[], tool_calls=[{"name": n, "arguments": a} for n, a in calls])
    return await env.verify(row, state, transcript)


# ---- verifier ------------------------------------------------------------------------------


def _two_task_moves(seed: int = 7):
    o = build_office(seed)
    a = next(t for t in o.tasks.values() if t["list_name"] != "Completed")
    b = next(t for t in o.tasks.values() if t["board"] != "Design" and t is not a)
    return [
        ("project_management_update_task", {"task_id": a["task_id"], "field": "list_name", "new_value": "Completed"}),
        ("project_management_update_task", {"task_id": b["task_id"], "field": "board", "new_value": "Design"}),
        (
            "calendar_create_event",
            {
                "event_name": "Kickoff",
                "participant_email": o.employees[1]["email"],
                "event_start": "2023-12-11 10:00:00",
                "duration": "30",
            },
        ),
        (
            "calendar_create_event",
            {
                "event_name": "Kickoff",
                "participant_email": o.employees[2]["email"],
                "event_start": "2023-12-11 10:00:00",
                "duration": "30",
            },
        ),
    ]


async def test_ground_truth_scores_one_for_every_generated_row():
    rows = generate(60, seed=11)
    assert {r["category"] for r in rows} >= {
        f"workplace_assistant_{d}"
        for d in ("email", "calendar", "project_management", "customer_relationship_manager", "analytics")
    }
    for row in rows:
        verdict = await score(row, ground_truth_calls(row["ground_truth"]))
        assert verdict.reward == 1.0, row["responses_create_params"]["input"][1]["content"]
        assert verdict.metrics["rows_off"] == 0 and set(verdict.components.values()) == {1.0}
        assert (await score(row, [])).reward == 0.0  # doing nothing is not doing the task


async def test_order_of_independent_calls_does_not_matter():
    calls = _two_task_moves()
    row = row_with(calls)
    assert (await score(row, calls)).reward == 1.0
    assert (await score(row, calls[::-1])).reward == 1.0  # created events get other ids: matched by content


async def test_extra_read_only_and_refused_calls_do_not_matter():
    calls = _two_task_moves()
    row = row_with(calls)
    o = build_office(7)
    a = first(o.tasks)
    reads = [
        ("project_management_search_tasks", {"task_name": a["task_name"]}),
        ("project_management_get_task_information_by_id", {"task_id": a["task_id"], "field": "board"}),
        ("company_directory_find_email_address", {"name": "a"}),
        ("calendar_search_events", {"query": "Kickoff"}),
        ("analytics_total_visits_count", {}),
        ("calendar_delete_event", {"event_id": "99999999"}),  # refused: changes nothing
        ("email_send_email", {"recipient": "nobody"}),
    ]  # bad arguments: changes nothing
    verdict = await score(row, reads[:3] + calls[:2] + reads[3:] + calls[2:])
    assert verdict.reward == 1.0 and verdict.metrics["mutating_calls"] == 6 and verdict.metrics["read_calls"] == 5


async def test_wrong_missing_or_extra_mutations_score_zero():
    calls = _two_task_moves()
    row = row_with(calls)
    wrong_value = [calls[0], ("project_management_update_task", {**calls[1][1], "new_value": "Back end"}), *calls[2:]]
    wrong_record = [("project_management_update_task", {**calls[0][1], "task_id": "00000005"}), *calls[1:]]
    wrong_person = [*calls[:3], ("calendar_create_event", {**calls[3][1], "participant_email": "x@atlas.com"})]
    extra = [*calls, ("email_delete_email", {"email_id": "00000000"})]
    for attempt in (calls[1:], calls[:3], wrong_value, wrong_record, wrong_person, extra, calls + calls[2:3]):
        verdict = await score(row, attempt)
        assert verdict.reward == 0.0 and verdict.metrics["rows_off"] > 0
    verdict = await score(row, extra)
    assert verdict.components["email"] == 0.0 and verdict.components["project_management"] == 1.0


async def test_text_matches_in_any_case_but_not_in_another_format():
    """NeMo Gym's comparison: text case-insensitively, values as written (it stores a time as given)."""
    o = build_office(7)
    e = first(o.events)
    move = {"event_id": e["event_id"], "field": "event_start", "new_value": "2023-12-08 15:00:00"}
    send = {"recipient": "raj@atlas.com", "subject": "Hi", "body": "See you"}
    row = row_with([("calendar_update_event", move), ("email_send_email", send)])
    rename = {"event_id": e["event_id"], "field": "event_name", "new_value": e["event_name"].upper()}
    variant = [
        ("email_send_email", {"recipient": "RAJ@atlas.com", "subject": "hi", "body": "SEE YOU"}),
        ("calendar_update_event", rename),  # the same name in capitals: no change as NeMo Gym compares
        ("calendar_update_event", move),
    ]
    assert (await score(row, variant)).reward == 1.0
    for other in (
        {**move, "new_value": "2023-12-08T15:00"},  # the same time, written otherwise
        {**move, "event_id": int(e["event_id"])},  # an id that is not text: refused, as NeMo Gym refuses it
    ):
        verdict = await score(row, [("email_send_email", send), ("calendar_update_event", other)])
        assert verdict.reward == 0.0 and verdict.components["calendar"] == 0.0 and verdict.components["email"] == 1.0
    spaced = await score(row, [("calendar_update_event", move), ("email_send_email", {**send, "body": "See  you"})])
    assert spaced.reward == 0.0


async def test_a_failing_read_in_the_ground_truth_is_skipped_not_a_broken_row():
    """NeMo Gym's rows hold reads that fail (fetching an email the row has just deleted): skipped, as there."""
    o = build_office(7)
    gone = first(o.emails)["email_id"]
    truth = [
        ("email_delete_email", {"email_id": gone}),
        ("email_get_email_information_by_id", {"email_id": gone, "field": "subject"}),
        ("project_management_search_tasks", {}),
    ]
    verdict = await score(row_with(truth), truth[:1])
    assert verdict.reward == 1.0 and verdict.metrics["skipped_truth_calls"] == 2
    assert (await score(row_with(truth), [])).reward == 0.0


def test_the_fast_comparison_counts_what_the_snapshots_differ_in():
    """rows_off skips records both offices hold unchanged; it must count what comparing whole snapshots counts."""
    calls = _two_task_moves()
    for attempt in (calls, calls[::-1], calls[1:], [*calls, ("email_delete_email", {"email_id": "00000003"})], []):
        a, b = build_office(7), build_office(7)
        for name, args in calls:
            call(b, name, args)
        for name, args in attempt:
            call(a, name, args)
        want = {
            d: sum(((snapshot(a)[d] - snapshot(b)[d]) + (snapshot(b)[d] - snapshot(a)[d])).values()) for d in TABLES
        }
        assert rows_off(a, b) == rows_off(b, a) == want


async def test_verifier_replays_the_transcript_when_the_state_is_not_an_office():
    calls = _two_task_moves()
    row = row_with(calls)
    transcript = Transcript("", [], [{"name": n, "arguments": a} for n, a in calls])
    assert (await ENV.score(row, None, transcript)).reward == 1.0
    assert (await ENV.score(row, None, Transcript("", [], transcript.tool_calls[:1]))).reward == 0.0


@pytest.mark.parametrize(
    "truth",
    [
        None,
        "not json",
        [{"arguments": "{}"}],
        [{"name": "calendar_delete_event", "arguments": '{"event_id": "99999999"}'}],
        [{"name": "no_such_tool", "arguments": "{}"}],
    ],
)
async def test_a_broken_ground_truth_raises_instead_of_scoring_zero(truth):
    row = ENV.check_row({"responses_create_params": {"input": "Do it."}, "seed": 7, "ground_truth": truth})
    with pytest.raises(BadGroundTruth):
        await ENV.verify(row, ENV.new_state(row), Transcript("", [], []))


def test_nemo_gym_style_ground_truth_loads():
    """NeMo Gym rows carry `arguments` as a JSON string (also accepted: an object, or the whole list as a string)."""
    calls = [
        {
            "name": "customer_relationship_manager_update_customer",
            "arguments": '{"customer_id": "00000005", "field": "assigned_to_email", "new_value": "x@atlas.com"}',
        }
    ]
    parsed = ground_truth_calls(calls)
    assert parsed == [
        (
            "customer_relationship_manager_update_customer",
            {"customer_id": "00000005", "field": "assigned_to_email", "new_value": "x@atlas.com"},
        )
    ]
    assert ground_truth_calls(json.dumps(calls)) == parsed
    assert ground_truth_calls([{"name": calls[0]["name"], "arguments": parsed[0][1]}]) == parsed


# ---- generation ----------------------------------------------------------------------------


def test_generation_is_deterministic_by_seed():
    assert generate(25, seed=5) == generate(25, seed=5)
    assert generate(25, seed=5) != generate(25, seed=6)
    assert snapshot(build_office(3)) == snapshot(build_office(3)) != snapshot(build_office(4))
    office = build_office(3)
    call(office, "email_delete_email", {"email_id": "00000000"})
    assert "00000000" in build_office(3).emails  # every rollout gets a fresh office


def test_rows_are_nemo_gym_shaped():
    rows = generate(30, seed=2)
    for i, row in enumerate(rows):
        params = row["responses_create_params"]
        assert [m["role"] for m in params["input"]] == ["system", "user"]
        assert "2023-11-30" in params["input"][0]["content"]
        assert [t["name"] for t in params["tools"]] == OFFICE_TOOLS.names()
        assert row["agent_ref"] == {"type": "responses_api_agents", "name": "workplace_assistant"}
        assert row["id"] == i and row["environment_name"] == "workplace_assistant"
        assert row["category"].startswith("workplace_assistant_") and isinstance(row["seed"], int)
        for c in row["ground_truth"]:
            assert c["name"] in MUTATING and isinstance(json.loads(c["arguments"]), dict)
    assert sum(len(r["ground_truth"]) > 1 for r in generate(200, seed=2)) > 5  # multi-call requests exist
    small = generate(30, seed=2, prompt_tools="task")
    for row, full in zip(small, rows):
        names = {t["name"] for t in row["responses_create_params"]["tools"]}
        assert {c["name"] for c in row["ground_truth"]} <= names and len(names) <= 4
        assert row["ground_truth"] == full["ground_truth"]


def test_registered_and_configurable():
    env = load_env("workplace_assistant", {"prompt_tools": "task"})
    assert isinstance(env, WorkplaceAssistant) and env.agent.loop == "tool_use" and env.agent.max_steps == 10
    assert len(env.generate(3, seed=1)[0]["responses_create_params"]["tools"]) <= 4
    with pytest.raises(ValueError, match="prompt_tools"):
        WorkplaceAssistant(prompt_tools="some")


# ---- the agent loop, with a scripted policy ------------------------------------------------


async def _loop(tokenizer, row, script):
    from farm.schema import Task
    from workers.loops.agent import AgentContext
    from workers.loops.loop import AgentLoop

    agent = AgentLoop.over_tokens(ENV, ScriptedPolicy(tokenizer, script), tokenizer)
    task = Task.new(run_id="wa", agent="workplace_assistant", row=row, reply_to="x")
    return await agent.run(task, AgentContext(worker_id="test", settings=None))


async def test_the_agent_loop_scores_multi_step_tool_use(tokenizer):
    row = next(r for r in generate(40, seed=4) if len(r["ground_truth"]) > 1)
    calls = ground_truth_calls(row["ground_truth"])
    lookup = (
        "project_management_search_tasks" if "project" in row["category"] else "company_directory_find_email_address"
    )
    script = [
        hermes(lookup, {}),  # a read first
        "<tool_call>{not json</tool_call>",  # a malformed call: an error result
        "".join(hermes(n, a) for n, a in reversed(calls)),  # the changes, in another order
        "Done.",
    ]
    rollout = await _loop(tokenizer, row, script)
    assert rollout.status.value == "ok" and rollout.reward == 1.0, rollout.metrics
    assert rollout.metrics["tool_calls"] == 1 + len(calls) and rollout.metrics["bad_tool_calls"] == 1
    assert rollout.metrics["mutating_calls"] == len(calls) and rollout.metrics["turns"] == 4
    outputs = [o["output"] for o in rollout.output if o["type"] == "function_call_output"]
    assert outputs[1].startswith("Error: invalid JSON") and all(not o.startswith("Error") for o in outputs[2:])

    wrong = await _loop(tokenizer, row, [hermes(*calls[0]), "Done."])  # only part of the job
    assert wrong.status.value == "ok" and wrong.reward == 0.0


async def test_a_broken_row_fails_the_rollout_as_a_verifier_error(tokenizer):
    from farm.errors import RolloutFailure

    row = {
        **generate(1, seed=4)[0],
        "ground_truth": [{"name": "calendar_delete_event", "arguments": '{"event_id": "99999999"}'}],
    }
    with pytest.raises(RolloutFailure, match="does not replay") as info:
        await _loop(tokenizer, row, ["Done."])
    assert info.value.kind == "verifier"


# ---- real rollouts -------------------------------------------------------------------------


@pytest.mark.vllm
@pytest.mark.slow
def test_rollouts_through_a_worker_against_real_vllm(settings, vllm, model_dir, tmp_path):
    """A few real rollouts through Redis, a `farm worker` process and vLLM (SmolLM2: the pipeline, not the score).

    Rows carry only the tools their request needs (prompt_tools="task"): the full list does not
    fit SmolLM2's 1024-token context. The agent is configured with shorter turns to keep it quick.
    """
    config = tmp_path / "farm.yaml"
    config.write_text(
        "agents:\n  workplace_assistant:\n    env: workplace_assistant\n    max_steps: 4\n"
        "    sampling: {max_tokens: 96}\n    env_options: {prompt_tools: task}\n"
    )
    rows = generate(4, seed=3, prompt_tools="task")
    got = run_through_worker(
        settings,
        vllm,
        model_dir,
        "workplace_assistant",
        rows,
        sampling=lambda i: Sampling(temperature=0.7, max_tokens=96, seed=i),
        FARM_CONFIG=str(config),
    )
    assert len(got) == 4
    for r in got:
        assert r.status.value in ("ok", "truncated"), r.error
        assert r.reward in (0.0, 1.0)
        assert set(r.reward_components) == {
            "email",
            "calendar",
            "project_management",
            "customer_relationship_manager",
            "analytics",
        }
        assert {"mutating_calls", "read_calls", "expected_calls", "rows_off", "tool_calls"} <= set(r.metrics)
        n = len(r.trace.completion())
        assert n > 0 and len(r.trace.completion_logprobs()) == n
        assert r.worker_id.startswith("workplace_assistant@")
