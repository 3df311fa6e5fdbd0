"""workplace_assistant's tools on a seeded office: what each changes, returns and refuses (NeMo Gym's semantics).

NeMo Gym's own published expectations, on its own tables, are in test_env_workplace_nemo_gym.py.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from envs.sdk import ToolArgumentError
from envs.workplace import WorkplaceAssistant
from envs.workplace.office import NOW_TEXT, ToolError, snapshot
from envs.workplace.seeded import build_office
from envs.workplace.tasks import responses_tool
from envs.workplace.tools import FARM_ONLY, MUTATING

ENV = WorkplaceAssistant()
TOOLS = {t.name: t for t in ENV.tools()}


def run(office, tool_name, /, **arguments):
    """Call a tool the way the agent loop does: the Tool (arguments checked) over the rollout's state."""
    return asyncio.run(TOOLS[tool_name](office, arguments))


def first(table: dict) -> dict:
    return next(iter(table.values()))


def test_nemo_gyms_27_tools_and_two_of_the_farms_with_valid_json_schemas():
    tools = ENV.tools()
    assert len(tools) == 29 and len({t.name for t in tools}) == 29
    assert FARM_ONLY == {"company_directory_get_employee_information", "analytics_count_records"}
    assert not FARM_ONLY & MUTATING and len(MUTATING) == 14
    for t in tools:
        p = t.parameters
        assert p["type"] == "object" and isinstance(p["properties"], dict) and t.description
        assert set(p["required"]) <= set(p["properties"]), t.name
        for prop in p["properties"].values():
            assert prop["type"] in ("string", "integer") and prop["description"]
        json.dumps(t.schema())
        r = responses_tool(t.name)
        assert r["type"] == "function" and r["name"] == t.name and r["parameters"] == p


def test_email_tools_change_the_mailbox():
    o = build_office(7)
    inbox = next(m for m in o.emails.values() if m["inbox/outbox"] == "inbox")
    n = len(o.emails)
    found = run(o, "email_search_emails", query=inbox["subject"], page_size=50)
    assert inbox in found["emails"] and found["pagination"]["page"] == 1
    got = run(o, "email_get_email_information_by_id", email_id=inbox["email_id"], field="subject")
    assert got == {"subject": inbox["subject"]}
    assert (
        run(o, "email_send_email", recipient="Some.One@Example", subject="Hi", body="Hello")
        == "Email sent successfully."
    )
    assert run(o, "email_reply_email", email_id=inbox["email_id"], body="Thanks!") == "Email replied successfully."
    to = o.employees[3]["email"]
    assert run(o, "email_forward_email", email_id=inbox["email_id"], recipient=to) == "Email forwarded successfully."
    new = list(o.emails.values())[-3:]
    assert [m["email_id"] for m in new] == ["30", "31", "32"]  # NeMo Gym's numbering: max + 1, unpadded for emails
    assert {m["inbox/outbox"] for m in new} == {"outbox"} and {m["sent_datetime"] for m in new} == {NOW_TEXT}
    assert new[0]["sender/recipient"] == "some.one@example" and new[0]["body"] == "Hello"  # no TLD needed
    assert new[1]["sender/recipient"] == inbox["sender/recipient"] and new[1]["subject"] == "RE: " + inbox["subject"]
    assert new[2]["subject"] == "FW: " + inbox["subject"] and new[2]["body"] == inbox["body"]
    assert run(o, "email_delete_email", email_id=inbox["email_id"]) == "Email deleted successfully."
    assert inbox["email_id"] not in o.emails and len(o.emails) == n + 2
    assert run(o, "email_search_emails", query="no such words anywhere") == "No emails found."


def test_calendar_tools_change_events():
    o = build_office(7)
    e = first(o.events)
    found = run(o, "calendar_search_events", query=e["event_name"], page_size=50)["events"]
    assert e in found and found == sorted(found, key=lambda x: x["event_start"], reverse=True)  # latest first
    update = dict(event_id=e["event_id"], field="event_start", new_value="2023-12-08 15:00")
    assert run(o, "calendar_update_event", **update) == "Event updated successfully."
    assert o.events[e["event_id"]]["event_start"] == "2023-12-08 15:00"  # stored as written, as NeMo Gym does
    made = run(
        o,
        "calendar_create_event",
        event_name="Kickoff",
        participant_email="Raj@Atlas.com",
        event_start="2023-12-11 07:00:00",  # before 9am: the prompt's rule, which no tool enforces
        duration="60",
    )
    assert made == "00000028" and o.events[made]["participant_email"] == "raj@atlas.com"
    assert o.events[made]["duration"] == "60" and o.events[made]["event_name"] == "Kickoff"
    assert run(o, "calendar_delete_event", event_id=made) == "Event deleted successfully." and made not in o.events


def test_project_tools_change_tasks():
    o = build_office(7)
    t = first(o.tasks)
    who = next(x["assigned_to_email"] for x in o.tasks.values() if x["assigned_to_email"] != t["assigned_to_email"])
    assert t in run(o, "project_management_search_tasks", task_name=t["task_name"].upper(), list_name="")
    run(o, "project_management_update_task", task_id=t["task_id"], field="list_name", new_value="In Review")
    run(o, "project_management_update_task", task_id=t["task_id"], field="assigned_to_email", new_value=who.upper())
    assert o.tasks[t["task_id"]]["list_name"] == "In Review" and o.tasks[t["task_id"]]["assigned_to_email"] == who
    made = run(
        o,
        "project_management_create_task",
        task_name="Ship it",
        assigned_to_email=who,
        list_name="Backlog",
        due_date="next week",  # stored as given, as NeMo Gym does
        board="Design",
    )
    assert made == "00000024" and o.tasks[made]["due_date"] == "next week"
    assert o.tasks[made] in run(o, "project_management_search_tasks", assigned_to_email=who, board="design")
    assert run(o, "project_management_delete_task", task_id=t["task_id"]) == "Task deleted successfully."
    assert t["task_id"] not in o.tasks
    everyone = {e["email"] for e in o.employees[1:]}
    assert {x["assigned_to_email"] for x in build_office(7).tasks.values()} == everyone  # all can be assigned


def test_crm_tools_change_customers():
    o = build_office(7)
    c = first(o.customers)
    found = run(o, "customer_relationship_manager_search_customers", customer_name=c["customer_name"].lower())
    assert found["customers"] == [c] and found["pagination"]["total_customers"] == 1
    for bound in (c["last_contact_date"][:10], c["last_contact_date"]):  # a date with or without its time
        got = run(o, "customer_relationship_manager_search_customers", last_contact_date_min=bound, page_size=50)
        assert c in got["customers"]
    change = dict(customer_id=c["customer_id"], field="status", new_value="Won")
    assert run(o, "customer_relationship_manager_update_customer", **change) == "Customer updated successfully."
    assert o.customers[c["customer_id"]]["status"] == "Won"
    made = run(
        o,
        "customer_relationship_manager_add_customer",
        customer_name="Alex Morgan",
        assigned_to_email=o.employees[1]["email"],
        status="Lead",
        customer_email="Alex.Morgan@Nanolabs",
    )
    assert made == "00000024" and list(o.customers[made]) == list(c)  # the table's column order
    added = o.customers[made]
    assert (
        added["customer_email"] == "alex.morgan@nanolabs" and added["customer_phone"] is None and added["notes"] == ""
    )
    assert run(o, "customer_relationship_manager_delete_customer", customer_id=c["customer_id"]).endswith(
        "successfully."
    )
    assert c["customer_id"] not in o.customers


def test_directory_and_analytics():
    o = build_office(7)
    me = o.user
    assert run(o, "company_directory_find_email_address", name=me["name"].split()[0].upper()) == [me["email"]]
    assert run(o, "company_directory_get_employee_information", email=me["email"].upper())["name"] == me["name"]
    october = [v for v in o.visits if v["date_of_visit"].startswith("2023-10")]
    total = run(o, "analytics_total_visits_count", time_min="2023-10-01", time_max="2023-10-31")
    assert list(total) == sorted({v["date_of_visit"] for v in october}) and sum(total.values()) == len(october)
    by_source = [
        run(o, "analytics_traffic_source_count", time_min="2023-10-01", time_max="2023-10-31", traffic_source=s)
        for s in ("direct", "referral", "search engine", "social media")
    ]
    assert [sum(day[d] for day in by_source) for d in total] == list(total.values())
    engaged = run(o, "analytics_engaged_users_count")
    assert sum(engaged.values()) == sum(v["user_engaged"] for v in o.visits)
    day = october[0]["date_of_visit"]
    mean = run(o, "analytics_get_average_session_duration", time_min=day, time_max=day)
    same_day = [int(v["session_duration_seconds"]) for v in o.visits if v["date_of_visit"] == day]
    assert mean == {day: sum(same_day) / len(same_day)}
    by_status = run(o, "analytics_count_records", table="customers", group_by="status")
    assert sum(by_status.values()) == len(o.customers)
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
    assert path == "plots/2023-10-01_2023-10-07_total_visits_bar.png" and list(o.plots.values()) == [
        {"file_path": path}
    ]


EVENT = {"event_name": "X", "participant_email": "a@b", "event_start": "2023-12-01 10:00", "duration": "60"}
TEAM = next(iter(build_office(7).tasks.values()))["assigned_to_email"]  # someone who has a task
TASK = {"task_name": "T", "assigned_to_email": TEAM, "list_name": "Backlog", "due_date": "1", "board": "Design"}
PLOT = {"time_min": "2023-10-01", "time_max": "2023-10-02", "value_to_plot": "total_visits", "plot_type": "bar"}
CUSTOMER = {"customer_name": "A", "assigned_to_email": "x@atlas.com", "status": "Lead"}
E1, T0, C1 = {"event_id": "00000001"}, {"task_id": "00000000"}, {"customer_id": "00000001"}
REFUSALS = [  # (tool, arguments, the start of NeMo Gym's message, or the SDK's for arguments that do not fit)
    ("calendar_create_event", {**EVENT, "event_start": "next friday"}, "Invalid event_start format. Expected YYYY-"),
    ("calendar_create_event", {**EVENT, "duration": "1h"}, "Invalid duration format. Expected a number of minutes."),
    ("calendar_update_event", {**E1, "field": "duration", "new_value": "0"}, "Duration must be a positive number"),
    ("calendar_update_event", {**E1, "field": "room", "new_value": "B"}, "Invalid field. Available fields are: event_"),
    ("calendar_delete_event", {"event_id": "99999999"}, "Event not found."),
    ("calendar_delete_event", {"event_id": 5}, "Invalid event ID format. Expected 8-digit ID."),
    ("email_send_email", {"recipient": "raj", "subject": "s", "body": "b"}, "Invalid recipient email address."),
    ("email_send_email", {"recipient": "r@a.c", "subject": "", "body": "b"}, "Recipient, subject, or body not"),
    ("email_reply_email", {"email_id": 7, "body": "b"}, "Email not found."),
    ("email_get_email_information_by_id", {"email_id": "00000001", "field": "to"}, "Field 'to' not found. Available"),
    ("email_search_emails", {"query": "", "page_size": 0}, "page_size must be at least 1"),
    ("project_management_update_task", {**T0, "field": "list_name", "new_value": "in review"}, "List not valid. "),
    ("project_management_update_task", {**T0, "field": "task_id", "new_value": "00000099"}, "Field not valid."),
    ("project_management_create_task", {**TASK, "assigned_to_email": "ghost@atlas.com"}, "Assignee email not valid."),
    ("project_management_create_task", {**TASK, "board": "design"}, "Board not valid. Please choose from: 'Back end'"),
    ("project_management_search_tasks", {"task_name": ""}, "No search parameters provided."),
    ("project_management_search_tasks", {"assigned_to_email": "raj@atlas"}, "Invalid email format for assigned_to_"),
    ("customer_relationship_manager_update_customer", {**C1, "field": "status", "new_value": "won"}, "Status not"),
    ("customer_relationship_manager_add_customer", {**CUSTOMER, "assigned_to_email": ""}, "Please provide all"),
    ("customer_relationship_manager_add_customer", {**CUSTOMER, "age": 3}, "unknown argument `age`"),
    ("customer_relationship_manager_search_customers", {"page": 2}, "No search parameters provided. Please provide"),
    ("analytics_create_plot", {**PLOT, "value_to_plot": "sales"}, "Value to plot must be one of 'total_visits', "),
    ("analytics_create_plot", {**PLOT, "plot_type": "Bar"}, "Plot type must be one of 'bar', 'line', 'scatter', or"),
    ("company_directory_find_email_address", {}, "Name not provided."),
    ("analytics_count_records", {"table": "tasks", "group_by": "status"}, "group_by must be one of 'task_name'"),
]  # fmt: skip


@pytest.mark.parametrize("name,arguments,message", REFUSALS)
def test_refusals_give_nemo_gyms_message_and_change_nothing(name, arguments, message):
    o = build_office(7)
    before = snapshot(o)
    with pytest.raises((ToolError, ToolArgumentError)) as info:
        run(o, name, **arguments)
    assert str(info.value).startswith(message) if isinstance(info.value, ToolError) else message in str(info.value)
    assert snapshot(o) == before


async def test_errors_reach_the_model_as_tool_results():
    """Through the agent loop's own tool dispatch: refused and malformed calls become result strings."""
    from workers.loops.env_calls import call_tool
    from workers.loops.loop import AgentLoop

    agent = AgentLoop.over_tokens(ENV, client=None, tokenizer=None)

    def dispatch(name, arguments, state, metrics):
        return call_tool(agent.tools, name, arguments, state, agent.settings.tool_timeout_s, metrics)

    state, metrics = build_office(7), {"tool_errors": 0, "bad_tool_calls": 0}
    out = await dispatch("calendar_delete_event", {"event_id": "99999999"}, state, metrics)
    assert out.startswith("Error:") and out.endswith("Event not found.")
    out = await dispatch("email_send_email", {"to": "a@b.com", "subject": "s", "body": "b"}, state, metrics)
    assert out.startswith("Error: bad arguments for email_send_email") and "unknown argument `to`" in out
    out = await dispatch("email_send_email", {"subject": "s", "body": "b"}, state, metrics)
    assert "missing required argument `recipient`" in out
    assert metrics["tool_errors"] == 3
    out = await dispatch("company_directory_find_email_address", {"name": state.user["name"]}, state, metrics)
    assert json.loads(out) == [] and metrics["tool_errors"] == 3  # a full name is no part of an address
    out = await dispatch("email_delete_email", {"email_id": "00000001"}, state, metrics)
    assert out == "Email deleted successfully."  # text results reach the model as written
