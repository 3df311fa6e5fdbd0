"""workplace_assistant against NeMo Gym's published expectations, on NeMo Gym's own tables.

Everything of NeMo Gym's comes from its `nemo-gym==0.4.0` wheel through tests/nemo_gym_data.py
(downloaded into .cache/, never committed); its code is not run here, its expectations are
written as data:

(a) resources_servers/workplace_assistant/tests/test_app.py: its 28 distinct tests (29
    functions; one name is defined twice, so the first never runs). Each mocks one table; here
    that table is swapped into NeMo Gym's tables, the same call is made, and NeMo Gym's
    expected output (or reward) must come out.
(b) data/example.jsonl: every row's ground truth replays with nothing rejected; the rows' 27
    tool schemas are the farm's.
(c) data/example_rollouts.jsonl: 5 recorded rollouts with NeMo Gym's reward. They come without
    their rows (no ground truth, and none of example.jsonl's prompts), so each ground truth is
    written from WorkBench's published query template (NeMo Gym's workplace data is WorkBench's:
    github.com/olly-styles/WorkBench, scripts/data_generation/query_answer_generation), computed
    on NeMo Gym's tables. The farm's reward must be the recorded one, and every tool output the
    rollouts recorded must be what the farm's tool returns.
(d) one recorded rollout through a real worker process and Redis, its calls made by a scripted
    policy server: the reward NeMo Gym recorded.

`pytest -s tests/test_env_workplace_nemo_gym.py -k agreement` prints the agreement counts.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest
from nemo_gym_data import jsonl, tables_dir
from test_env_workplace_nemo_gym_cases import PUBLISHED, Refused

from envs.sdk import Transcript
from envs.workplace import WorkplaceAssistant, load_tables
from envs.workplace.office import NOW, ToolError, name_of
from envs.workplace.tools import FARM_ONLY, TOOLS, call

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env():
    return WorkplaceAssistant(tables=str(tables_dir()))


def office_with(mocked: dict):
    """NeMo Gym's tables with the test's mocked tables in place (as its patched read_csv gives them)."""
    o = load_tables(tables_dir())
    for table, rows in mocked.items():
        if table == "directory":
            o.employees = [{"email": e, "name": name_of(e)} for e in rows]
        elif table == "visits":  # the analytics tool's reset_state reads user_engaged as == "True"
            o.visits = [{**r, "user_engaged": r.get("user_engaged") == "True"} for r in rows]
        else:
            id_field = {"emails": "email_id", "events": "event_id", "tasks": "task_id", "customers": "customer_id"}
            setattr(o, table, {r[id_field[table]]: dict(r) for r in rows})
    return o


def outcome(office, name: str, arguments: dict):
    """What a call gives: the tool's result, or Refused(its message)."""
    try:
        return call(office, name, arguments)
    except (ToolError, TypeError) as exc:
        return Refused(str(exc))


def shown(result) -> object:
    """The text or value the model is given (a refusal's message, as NeMo Gym returns its refusals as output)."""
    return result.gist if isinstance(result, Refused) else result


class OnOffice(WorkplaceAssistant):
    """The environment on one given office (a test's mocked tables), fresh for every use."""

    def __init__(self, office):
        super().__init__()
        self.office = office

    def new_state(self, row):
        return self.office.copy()


def agrees(case: dict) -> bool:
    """Whether the farm gives what NeMo Gym's test expects, for every call and the reward."""
    o = office_with(case["mock"])
    for name, arguments, expected in case["calls"]:
        got = outcome(o, name, arguments)
        if isinstance(expected, Refused):
            if not (isinstance(got, Refused) and expected.gist in got.gist):
                return False
        elif shown(got) != expected:
            return False
    if "reward" in case:
        transcript = Transcript("", [], [{"name": n, "arguments": a} for n, a, _ in case["calls"]])
        row = {"responses_create_params": {"input": "x"}, "ground_truth": case["truth"]}
        env = OnOffice(office_with(case["mock"]))
        return asyncio.run(env.score(row, None, transcript)).reward == case["reward"]
    return True


@pytest.mark.parametrize("case", PUBLISHED, ids=[c["test"] for c in PUBLISHED])
def test_nemo_gyms_published_tool_expectations(case):
    assert agrees(case), case["test"]


def _near_miss(expected):
    if isinstance(expected, Refused):
        return Refused(expected.gist + "!")
    if isinstance(expected, dict):
        return {**expected, "extra": 1}
    return expected[:-1] if isinstance(expected, list) else f"{expected} "


def test_negative_control_a_near_miss_expectation_disagrees():
    """The comparison can fail: every published case, its last expected output off by a little
    (or its reward flipped), disagrees."""
    for case in PUBLISHED:
        name, arguments, expected = case["calls"][-1]
        assert not agrees({**case, "calls": [*case["calls"][:-1], (name, arguments, _near_miss(expected))]})
        if "reward" in case:
            assert not agrees({**case, "reward": 1.0 - case["reward"]}), case["test"]


def test_nemo_gyms_tables_load_once_and_each_rollout_gets_a_copy(tmp_path):
    from envs.sdk import RowError
    from envs.workplace.tables import TablesError, _loaded

    env = WorkplaceAssistant(tables=str(tables_dir()))
    misses = _loaded.cache_info().misses
    first = env.new_state(env.check_row({"responses_create_params": {"input": "x"}}))
    assert len(first.emails) == 500 and "00000373" in first.emails and len(first.employees) == 20
    assert first.customers["00000189"]["customer_phone"] is None  # an empty cell
    call(first, "email_delete_email", {"email_id": "00000373"})
    again = env.new_state(env.check_row({"responses_create_params": {"input": "x"}}))
    assert "00000373" in again.emails and _loaded.cache_info().misses == misses  # no file read per rollout
    seeded = env.check_row({"responses_create_params": {"input": "x"}, "seed": 3})
    assert "00000373" not in env.new_state(seeded).emails  # a row's own seed wins over the option
    plain = WorkplaceAssistant()
    by_row = plain.check_row({"responses_create_params": {"input": "x"}, "tables": str(tables_dir())})
    assert plain.new_state(by_row).emails == again.emails  # a row may point at the tables itself
    with pytest.raises(RowError, match="lacks NeMo Gym's workplace table"):
        plain.check_row({"responses_create_params": {"input": "x"}, "tables": str(tmp_path)})
    with pytest.raises(TablesError, match="processed/emails.csv"):
        WorkplaceAssistant(tables=str(tmp_path))


# ---- (b) example.jsonl ----------------------------------------------------------------------


def test_every_example_row_replays_and_scores_its_own_ground_truth_one(env):
    rows = jsonl("example.jsonl")
    assert len(rows) == 5
    for row in rows:
        truth = [{"name": c["name"], "arguments": json.loads(c["arguments"])} for c in row["ground_truth"]]
        right = asyncio.run(env.score(row, None, Transcript("", [], truth)))
        assert right.reward == 1.0 and right.metrics["skipped_truth_calls"] == 0, row["id"]
        assert asyncio.run(env.score(row, None, Transcript("", [], []))).reward == 0.0, row["id"]


def test_the_rows_tool_schemas_are_the_farms():
    rows = jsonl("example.jsonl")
    theirs = rows[0]["responses_create_params"]["tools"]
    assert all(r["responses_create_params"]["tools"] == theirs for r in rows)
    assert [t["name"] for t in theirs] == [n for n in TOOLS.names() if n not in FARM_ONLY]
    for tool in theirs:
        ours = TOOLS[tool["name"]]
        assert ours.description == tool["description"], tool["name"]
        assert ours.parameters["required"] == tool["parameters"]["required"], tool["name"]
        assert list(ours.parameters["properties"]) == list(tool["parameters"]["properties"]), tool["name"]
        for arg, prop in tool["parameters"]["properties"].items():
            mine = ours.parameters["properties"][arg]
            assert (mine["type"], mine["description"]) == (prop["type"], prop["description"]), (tool["name"], arg)


# ---- (c) example_rollouts.jsonl ---------------------------------------------------------------


def _prompt(rollout: dict) -> str:
    return next(m["content"] for m in rollout["responses_create_params"]["input"] if m["role"] == "user")


def rollout_truth(prompt: str) -> list[tuple[str, dict]]:
    """The ground truth of a recorded rollout, by WorkBench's template for its query, on NeMo Gym's tables."""
    o = load_tables(tables_dir())
    if prompt == "Create a bar chart of total visits since November 30":
        last_day = max(v["date_of_visit"] for v in o.visits)  # the template's date_max: the data's last day
        plot = {"time_min": "2023-11-30", "time_max": last_day, "value_to_plot": "total_visits", "plot_type": "bar"}
        return [("analytics_create_plot", plot)]
    if prompt.startswith("We need to move all customers that haven't responded to a proposal for the consulting"):
        cutoff = str(NOW - timedelta(weeks=3))  # move_unresponsive_customers_to_lost: contacted before 3 weeks ago
        stale = [
            c["customer_id"]
            for c in o.customers.values()
            if c["status"] == "Proposal" and c["product_interest"] == "Consulting" and c["last_contact_date"] < cutoff
        ]
        return [
            (
                "customer_relationship_manager_update_customer",
                {"customer_id": c, "field": "status", "new_value": "Lost"},
            )
            for c in stale
        ]
    if prompt == "Delete Casey Wilson from the crm":
        (cid,) = [c["customer_id"] for c in o.customers.values() if c["customer_name"] == "Casey Wilson"]
        return [("customer_relationship_manager_delete_customer", {"customer_id": cid})]
    if prompt == "Add Dakota Thomas as a new lead in the crm and assign them to Nadia":
        lead = {"customer_name": "Dakota Thomas", "assigned_to_email": "nadia.moreau@atlas.com", "status": "Lead"}
        return [("customer_relationship_manager_add_customer", lead)]
    if prompt == "Delete my last email from kofi":
        from_kofi = [m for m in o.emails.values() if m["sender/recipient"] == "kofi.mensah@atlas.com"]
        newest = max(from_kofi, key=lambda m: m["sent_datetime"])["email_id"]
        assert newest == "00000259"  # WorkBench's published answer to this very query
        return [("email_delete_email", {"email_id": newest})]
    raise AssertionError(f"no ground truth written for {prompt!r}")


def nemo_row(rollout: dict, truth: list[tuple[str, dict]]) -> dict:
    """The rollout's row in NeMo Gym's format (its prompt and tools as recorded, the ground truth above)."""
    return {
        "responses_create_params": rollout["responses_create_params"],
        "agent_ref": {"type": "responses_api_agents", "name": "workplace_assistant"},
        "ground_truth": [{"name": n, "arguments": json.dumps(a)} for n, a in truth],
        "id": 0,
        "category": "workplace_assistant",
        "environment_name": "workplace_assistant",
    }


def recorded_calls(rollout: dict) -> list[dict]:
    return [
        {"name": o["name"], "arguments": json.loads(o["arguments"])}
        for o in rollout["response"]["output"]
        if o["type"] == "function_call"
    ]


def rollout_agreement(env) -> tuple[int, int, int, int]:
    """(rewards agreeing, rollouts, recorded tool outputs agreeing, outputs)."""
    rewards = outputs = outputs_agree = 0
    rollouts = jsonl("example_rollouts.jsonl")
    for rollout in rollouts:
        row = nemo_row(rollout, rollout_truth(_prompt(rollout)))
        verdict = asyncio.run(env.score(row, None, Transcript("", [], recorded_calls(rollout))))
        rewards += verdict.reward == rollout["reward"]
        o = load_tables(tables_dir())
        made = {x["call_id"]: x for x in rollout["response"]["output"] if x["type"] == "function_call"}
        for item in rollout["response"]["output"]:
            if item["type"] == "function_call_output":
                c = made[item["call_id"]]
                got = outcome(o, c["name"], json.loads(c["arguments"]))
                outputs += 1
                outputs_agree += json.loads(item["output"]) == {"output": shown(got)}
    return rewards, len(rollouts), outputs_agree, outputs


def test_the_recorded_rollouts_score_as_nemo_gym_recorded_them(env):
    assert rollout_agreement(env) == (5, 5, 8, 8)


def test_negative_control_the_same_calls_against_other_ground_truth(env):
    """The check can fail: one more change in the ground truth and no rollout scores 1; the 0-rollout's
    own calls as ground truth score it 1."""
    extra = ("email_delete_email", {"email_id": "00000000"})
    for rollout in jsonl("example_rollouts.jsonl"):
        calls = recorded_calls(rollout)
        row = nemo_row(rollout, [*rollout_truth(_prompt(rollout)), extra])
        assert asyncio.run(env.score(row, None, Transcript("", [], calls))).reward == 0.0
        own = nemo_row(rollout, [(c["name"], c["arguments"]) for c in calls])
        assert asyncio.run(env.score(own, None, Transcript("", [], calls))).reward == 1.0


def test_agreement_counts(env):
    published = sum(agrees(case) for case in PUBLISHED)
    rewards, rollouts, outputs_agree, outputs = rollout_agreement(env)
    print(f"\nNeMo Gym's published tool expectations (tests/test_app.py): {published}/{len(PUBLISHED)} agree")
    print(f"NeMo Gym's recorded rollouts (example_rollouts.jsonl): rewards {rewards}/{rollouts} agree, ")
    print(f"  recorded tool outputs {outputs_agree}/{outputs} agree")
    assert (published, rewards, outputs_agree) == (len(PUBLISHED), rollouts, outputs)


# ---- (d) through a worker ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "prompt", ["Delete my last email from kofi", "Create a bar chart of total visits since November 30"]
)
def test_a_recorded_rollout_through_a_worker_earns_nemo_gyms_reward(prompt, settings, tokenizer, model_dir, tmp_path):
    """A NeMo Gym row (its prompt and 27 tools as recorded) through Redis and a real `farm worker`
    configured with NeMo Gym's tables; the policy is workers/policy/stub emitting the recorded
    calls (a fake: no model makes a given call sequence on demand), one per turn, then an answer."""
    from helpers.policies import hermes
    from helpers.workers import run_through_worker

    from workers.policy.stub import Script, StubProcess

    rollout = next(r for r in jsonl("example_rollouts.jsonl") if _prompt(r) == prompt)
    row = nemo_row(rollout, rollout_truth(prompt))
    turns = [hermes(c["name"], c["arguments"]) for c in recorded_calls(rollout)] + ["Done."]
    script = Script(token_replies=[tokenizer.encode(t) + [tokenizer.eos_id] for t in turns], max_model_len=32768)
    config = tmp_path / "farm.yaml"
    agent = "agents:\n  workplace_assistant:\n    env: workplace_assistant\n"
    config.write_text(f"{agent}    env_options: {{tables: '{tables_dir()}'}}\n")
    stub = StubProcess(script, latency_s=0.0, workdir=tmp_path).start()
    try:
        [result] = run_through_worker(
            settings, stub, model_dir, "workplace_assistant", [row], timeout_s=120, FARM_CONFIG=str(config)
        )
    finally:
        stub.stop()
    assert result.status.value == "ok", result.error
    assert result.reward == rollout["reward"], result.metrics
    assert result.metrics["tool_calls"] == len(turns) - 1 and result.metrics["tool_errors"] == 0
    outputs = [o["output"] for o in result.output if o["type"] == "function_call_output"]
    recorded = [
        json.loads(o["output"])["output"] for o in rollout["response"]["output"] if o["type"] == "function_call_output"
    ]
    assert [o if isinstance(r, str) else json.loads(o) for o, r in zip(outputs, recorded)] == recorded
