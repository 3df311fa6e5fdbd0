"""workplace_assistant: the office's tools, the end-state verifier, the generator, and real rollouts."""

from __future__ import annotations

import asyncio
import json

import pytest

from envs.sdk import ToolArgumentError, Transcript, load_env
from envs.workplace import BadGroundTruth, WorkplaceAssistant, generate
from envs.workplace.office import ToolError, build_office, snapshot
from envs.workplace.replay import ground_truth_calls
from envs.workplace.tasks import responses_tool
from envs.workplace.tools import MUTATING, call
from envs.workplace.tools import TOOLS as OFFICE_TOOLS
from farm.schema import Sampling

from conftest import ScriptedPolicy, hermes, run_through_worker

ENV = WorkplaceAssistant()
TOOLS = {t.name: t for t in ENV.tools()}


def run(office, tool_name, /, **arguments):
    """Call a tool the way the agent loop does: the Tool (arguments checked) over the rollout's state."""
    return asyncio.run(TOOLS[tool_name](office, arguments))


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


# ---- tools ---------------------------------------------------------------------------------


def test_at_least_twenty_tools_with_valid_json_schemas():
    tools = ENV.tools()
    assert len(tools) >= 20 and len({t.name for t in tools}) == len(tools)
    domains = {t.name.split("_")[0] for t in tools}
    assert {"company", "email", "calendar", "analytics", "project", "customer"} <= domains
    for t in tools:
        p = t.parameters
        assert p["type"] == "object" and isinstance(p["properties"], dict) and t.description
        assert set(p["required"]) <= set(p["properties"]), t.name
        for prop in p["properties"].values():
            assert prop["type"] in ("string", "integer") and prop["description"]
        json.dumps(t.schema())
        r = responses_tool(t.name)
        assert r["type"] == "function" and r["name"] == t.name and r["parameters"] == p
    assert len(MUTATING) >= 10


def test_email_tools_change_the_mailbox():
    o = build_office(7)
    inbox = next(m for m in o.emails.values() if m["inbox/outbox"] == "inbox")
    n = len(o.emails)
    found = run(o, "email_search_emails", query=inbox["subject"], page_size=50)
    assert inbox["email_id"] in [m["email_id"] for m in found]
    assert run(o, "email_get_email_information_by_id", email_id=inbox["email_id"], field="subject") == {
        "subject": inbox["subject"]
    }
    run(o, "email_send_email", recipient="Someone@Example.com", subject="Hi", body="Hello there")
    run(o, "email_reply_email", email_id=inbox["email_id"], body="Thanks!")
    run(o, "email_forward_email", email_id=inbox["email_id"], recipient=o.employees[3]["email"])
    new = list(o.emails.values())[-3:]
    assert [m["inbox/outbox"] for m in new] == ["outbox"] * 3
    assert new[0]["sender/recipient"] == "someone@example.com" and new[0]["body"] == "Hello there"
    assert new[1]["sender/recipient"] == inbox["sender/recipient"] and new[1]["subject"] == "Re: " + inbox["subject"]
    assert new[2]["subject"] == "FW: " + inbox["subject"] and new[2]["body"] == inbox["body"]
    run(o, "email_delete_email", email_id=inbox["email_id"])
    assert inbox["email_id"] not in o.emails and len(o.emails) == n + 2


def test_calendar_tools_change_events():
    o = build_office(7)
    e = first(o.events)
    assert e in run(o, "calendar_search_events", query=f"{e['event_name']} {e['participant_email']}", page_size=50)
    run(o, "calendar_update_event", event_id=e["event_id"], field="event_start", new_value="2023-12-08 15:00")
    assert o.events[e["event_id"]]["event_start"] == "2023-12-08 15:00:00"  # seconds filled in
    run(o, "calendar_update_event", event_id=int(e["event_id"]), field="duration", new_value="30")
    assert o.events[e["event_id"]]["duration"] == "30"  # an integer id works too
    out = run(
        o,
        "calendar_create_event",
        event_name="Kickoff",
        participant_email=o.employees[2]["email"],
        event_start="2023-12-11 09:00:00",
        duration=60,
    )
    created = list(o.events.values())[-1]
    assert created["event_id"] in out and created["duration"] == "60" and created["event_name"] == "Kickoff"
    run(o, "calendar_delete_event", event_id=created["event_id"])
    assert created["event_id"] not in o.events


def test_project_tools_change_tasks():
    o = build_office(7)
    t = first(o.tasks)
    who = o.employees[4]["email"]
    assert t in run(o, "project_management_search_tasks", task_name=t["task_name"].upper())
    run(o, "project_management_update_task", task_id=t["task_id"], field="list_name", new_value="in review")
    run(o, "project_management_update_task", task_id=t["task_id"], field="assigned_to_email", new_value=who)
    assert o.tasks[t["task_id"]]["list_name"] == "In Review" and o.tasks[t["task_id"]]["assigned_to_email"] == who
    run(
        o,
        "project_management_create_task",
        task_name="Ship it",
        assigned_to_email=who,
        list_name="Backlog",
        due_date="2023-12-20",
        board="design",
    )
    created = list(o.tasks.values())[-1]
    assert created["board"] == "Design" and created["task_name"] == "Ship it"
    assert created in run(o, "project_management_search_tasks", assigned_to_email=who, board="Design")
    run(o, "project_management_delete_task", task_id=t["task_id"])
    assert t["task_id"] not in o.tasks


def test_crm_tools_change_customers():
    o = build_office(7)
    c = first(o.customers)
    assert c in run(o, "customer_relationship_manager_search_customers", customer_name=c["customer_name"].lower())
    run(
        o,
        "customer_relationship_manager_update_customer",
        customer_id=c["customer_id"],
        field="status",
        new_value="won",
    )
    assert o.customers[c["customer_id"]]["status"] == "Won"
    run(
        o,
        "customer_relationship_manager_add_customer",
        customer_name="Alex Morgan",
        assigned_to_email=o.employees[1]["email"],
        status="Lead",
        product_interest="training",
    )
    added = list(o.customers.values())[-1]
    assert added["customer_name"] == "Alex Morgan" and added["product_interest"] == "Training"
    assert added["customer_phone"] is None
    run(o, "customer_relationship_manager_delete_customer", customer_id=c["customer_id"])
    assert c["customer_id"] not in o.customers


def test_directory_and_analytics():
    o = build_office(7)
    me = o.user
    assert run(o, "company_directory_find_email_address", name=me["name"].split()[0]) == [me["email"]]
    assert run(o, "company_directory_get_employee_information", email=me["email"].upper())["name"] == me["name"]
    total = run(o, "analytics_total_visits_count", time_min="2023-10-01", time_max="2023-10-31")["total_visits"]
    assert total == sum(v["date_of_visit"].startswith("2023-10") for v in o.visits) > 0
    by_source = [
        run(o, "analytics_traffic_source_count", time_min="2023-10-01", time_max="2023-10-31", traffic_source=s)[
            "visits"
        ]
        for s in ("direct", "referral", "search engine", "social media")
    ]
    assert sum(by_source) == total
    assert 0 <= run(o, "analytics_engaged_users_count")["engaged_users"] <= len(o.visits)
    assert run(o, "analytics_get_average_session_duration")["average_session_duration_seconds"] > 0
    by_status = run(o, "analytics_count_records", table="customers", group_by="status")
    assert sum(by_status.values()) == len(o.customers) and set(by_status) <= {
        "Qualified",
        "Won",
        "Lost",
        "Lead",
        "Proposal",
    }
    assert run(o, "analytics_count_records", table="tasks", group_by="list_name")["Backlog"] == len(
        run(o, "project_management_search_tasks", list_name="backlog")
    )
    visitor = o.visits[0]["visitor_id"]
    assert o.visits[0] in run(o, "analytics_get_visitor_information_by_id", visitor_id=visitor)
    path = run(
        o,
        "analytics_create_plot",
        time_min="2023-10-01",
        time_max="2023-10-07",
        value_to_plot="total_visits",
        plot_type="bar",
    )
    assert path.endswith(".png") and first(o.plots)["file_path"] == path


@pytest.mark.parametrize(
    "name,arguments,message",
    [
        (
            "calendar_create_event",
            {
                "event_name": "X",
                "participant_email": "a@atlas.com",
                "event_start": "2023-12-08 17:30:00",
                "duration": "60",
            },
            "must not start before 9am",
        ),
        (
            "calendar_create_event",
            {"event_name": "X", "participant_email": "a@atlas.com", "event_start": "next friday", "duration": "60"},
            "YYYY-MM-DD HH:MM:SS",
        ),
        ("calendar_update_event", {"event_id": "00000001", "field": "room", "new_value": "B"}, "field must be one of"),
        ("calendar_delete_event", {"event_id": "99999999"}, "no record with event_id '99999999'"),
        ("email_send_email", {"recipient": "raj", "subject": "s", "body": "b"}, "must be an email address"),
        ("email_reply_email", {"email_id": "abc", "body": "b"}, "numeric id"),
        (
            "project_management_update_task",
            {"task_id": "00000000", "field": "list_name", "new_value": "Doing"},
            "must be one of 'Backlog'",
        ),
        (
            "project_management_create_task",
            {
                "task_name": "T",
                "assigned_to_email": "ghost@atlas.com",
                "list_name": "Backlog",
                "due_date": "2023-12-01",
                "board": "Design",
            },
            "not in the company directory",
        ),
        (
            "project_management_update_task",
            {"task_id": "00000000", "field": "due_date", "new_value": "12/01/2023"},
            "YYYY-MM-DD",
        ),
        (
            "customer_relationship_manager_add_customer",
            {"customer_name": "A", "assigned_to_email": "ghost@atlas.com", "status": "Lead"},
            "not in the company directory",
        ),
        (
            "customer_relationship_manager_add_customer",
            {"customer_name": "A", "assigned_to_email": "x@atlas.com", "status": "Lead", "age": 3},
            "unknown argument `age`",
        ),
        (
            "analytics_create_plot",
            {"time_min": "2023-10-01", "time_max": "2023-10-02", "value_to_plot": "sales", "plot_type": "bar"},
            "value_to_plot must be one of",
        ),
        ("email_search_emails", {"query": "x", "page": 0}, "page and page_size must be >= 1"),
        ("email_send_email", {"recipient": "a@b.com", "subject": 3, "body": "b"}, "subject must be a string"),
        ("analytics_count_records", {"table": "tasks", "group_by": "status"}, "field must be one of 'task_name'"),
    ],
)
def test_invalid_arguments_give_clear_errors_and_change_nothing(name, arguments, message):
    o = build_office(7)
    before = snapshot(o)
    with pytest.raises((ToolError, ToolArgumentError), match=message.replace("(", r"\(").replace(")", r"\)")):
        run(o, name, **arguments)
    assert snapshot(o) == before


async def test_errors_reach_the_model_as_tool_results():
    """Through the agent loop's own tool dispatch: refused and malformed calls become result strings."""
    from workers.env_calls import call_tool
    from workers.loop import PolicyAgent

    agent = PolicyAgent(ENV, policy=None, tokenizer=None)

    def dispatch(name, arguments, state, metrics):
        return call_tool(agent.tools, name, arguments, state, agent.settings.tool_timeout_s, metrics)

    state, metrics = build_office(7), {"tool_errors": 0, "bad_tool_calls": 0}
    out = await dispatch("calendar_delete_event", {"event_id": "99999999"}, state, metrics)
    assert out.startswith("Error:") and "no record with event_id '99999999'" in out
    out = await dispatch("email_send_email", {"to": "a@b.com", "subject": "s", "body": "b"}, state, metrics)
    assert out.startswith("Error: bad arguments for email_send_email") and "unknown argument `to`" in out
    out = await dispatch("email_send_email", {"subject": "s", "body": "b"}, state, metrics)
    assert "missing required argument `recipient`" in out
    assert metrics["tool_errors"] == 3
    out = await dispatch("company_directory_find_email_address", {"name": state.user["name"]}, state, metrics)
    assert json.loads(out) == [state.user["email"]]


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


async def test_case_and_format_variants_of_the_same_change_still_match():
    o = build_office(7)
    e = first(o.events)
    row = row_with(
        [
            (
                "calendar_update_event",
                {"event_id": e["event_id"], "field": "event_start", "new_value": "2023-12-08 15:00:00"},
            ),
            ("email_send_email", {"recipient": "raj@atlas.com", "subject": "Hi", "body": "See you"}),
        ]
    )
    variant = [
        ("email_send_email", {"recipient": "RAJ@atlas.com", "subject": "hi", "body": "See  you"}),
        (
            "calendar_update_event",
            {"event_id": int(e["event_id"]), "field": "event_start", "new_value": "2023-12-08T15:00"},
        ),
    ]
    assert (await score(row, variant)).reward == 1.0


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
    from workers.agent import AgentContext
    from workers.loop import PolicyAgent

    agent = PolicyAgent(ENV, ScriptedPolicy(tokenizer, script), tokenizer)
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
