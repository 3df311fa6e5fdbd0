"""The office's tools: NeMo Gym's workplace_assistant names and arguments, over one rollout's Office.

Declared with the SDK's Toolset: the schema comes from each signature and the argument notes
in its decorator; `meta["mutates"]` marks the tools that change the office (MUTATING).
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import Any, Optional

from envs.sdk import Toolset
from envs.workplace.checks import (
    _address,
    _check_hours,
    _choice,
    _date,
    _datetime,
    _employee,
    _field,
    _minutes,
    _page,
    _range,
    _record,
    _text,
)
from envs.workplace.office import (
    BOARDS,
    CUSTOMER_FIELDS,
    EVENT_FIELDS,
    LISTS,
    NOW,
    PLOT_TYPES,
    PLOT_VALUES,
    PRODUCTS,
    STATUSES,
    TASK_FIELDS,
    TRAFFIC_SOURCES,
    Office,
    ToolError,
)

TOOLS = Toolset(check_types=False)  # the checks below accept ids as numbers, enum values in any case
WRITES = {"mutates": True}  # meta of the tools that change the office

DATE = "Format: YYYY-MM-DD"
STAMP = "Format: YYYY-MM-DD HH:MM:SS"


@TOOLS.tool(
    "Finds all email addresses containing the given name (case-insensitive search).",
    name=("Name or partial name to search for in email addresses"),
)
def company_directory_find_email_address(office: Office, name: str = "") -> list[str]:
    needle = _text(name, "name", empty=True).lower().replace(" ", ".")
    return [e["email"] for e in office.employees if needle in e["email"]]


@TOOLS.tool("Returns the name, department and title of an employee.", email=("Email address of the employee"))
def company_directory_get_employee_information(office: Office, email: str) -> dict:
    address = _address(email, "email")
    for e in office.employees:
        if e["email"] == address:
            return dict(e)
    raise ToolError(f"no employee with email {address!r}")


@TOOLS.tool(
    "Retrieves specific details of an email by its ID.",
    email_id=("Unique ID of the email"),
    field=(
        "Specific field to return (omit for all). Available fields: 'email_id', 'inbox/outbox', "
        "'sender/recipient', 'subject', 'sent_datetime', 'body'"
    ),
)
def email_get_email_information_by_id(office: Office, email_id: str, field: Optional[str] = None) -> dict:
    record = _record(office.emails, email_id, "email_id")
    return dict(record) if field is None else {field: record[_field(field, list(record))]}


@TOOLS.tool(
    "Searches for emails matching the given query across subject, body, or sender fields. An email matches "
    "if all words in the query appear in any of these fields. Newest first.",
    query=("Search query, matching terms in subject, body, or sender/recipient fields"),
    date_min=(f"Lower date limit for the email's sent date (inclusive). {DATE}"),
    date_max=(f"Upper date limit for the email's sent date (inclusive). {DATE}"),
    page=("Page number of results to return"),
    page_size=("Number of emails per page"),
)
def email_search_emails(
    office: Office,
    query: str = "",
    date_min: Optional[str] = None,
    date_max: Optional[str] = None,
    page: int = 1,
    page_size: int = 5,
) -> list[dict]:
    words = _text(query, "query", empty=True).lower().split()
    lo, hi = _range(date_min, date_max)
    found = [
        m
        for m in office.emails.values()
        if all(w in f"{m['subject']} {m['body']} {m['sender/recipient']}".lower() for w in words)
        and lo <= m["sent_datetime"][:10] <= hi
    ]
    found.sort(key=lambda m: m["sent_datetime"], reverse=True)
    return [dict(m) for m in _page(found, page, page_size)]


def _send(office: Office, recipient: str, subject: str, body: str) -> str:
    mid = office.new_id("emails")
    office.emails[mid] = {
        "email_id": mid,
        "inbox/outbox": "outbox",
        "sender/recipient": recipient,
        "subject": subject,
        "sent_datetime": NOW.strftime("%Y-%m-%d %H:%M:%S"),
        "body": body,
    }
    return mid


@TOOLS.tool(
    "Sends an email to the specified recipient.",
    meta=WRITES,
    recipient=("Email address of the recipient"),
    subject=("Subject line of the email"),
    body=("Body content of the email"),
)
def email_send_email(office: Office, recipient: str, subject: str, body: str) -> str:
    to, subject, body = _address(recipient, "recipient"), _text(subject, "subject"), _text(body, "body")
    return f"Email sent (email_id {_send(office, to, subject, body)})."


@TOOLS.tool("Deletes an email by its ID.", meta=WRITES, email_id=("Unique ID of the email to be deleted"))
def email_delete_email(office: Office, email_id: str) -> str:
    record = _record(office.emails, email_id, "email_id")
    del office.emails[record["email_id"]]
    return f"Email {record['email_id']} deleted."


@TOOLS.tool(
    "Forwards an email to the specified recipient.",
    meta=WRITES,
    email_id=("Unique ID of the email to be forwarded"),
    recipient=("Email address of the recipient"),
)
def email_forward_email(office: Office, email_id: str, recipient: str) -> str:
    record, to = _record(office.emails, email_id, "email_id"), _address(recipient, "recipient")
    return f"Email forwarded (email_id {_send(office, to, 'FW: ' + record['subject'], record['body'])})."


@TOOLS.tool(
    "Replies to an email by its ID.",
    meta=WRITES,
    email_id=("Unique ID of the email to be replied"),
    body=("Body content of the email"),
)
def email_reply_email(office: Office, email_id: str, body: str) -> str:
    record, body = _record(office.emails, email_id, "email_id"), _text(body, "body")
    mid = _send(office, record["sender/recipient"], "Re: " + record["subject"], body)
    return f"Reply sent (email_id {mid})."


@TOOLS.tool(
    "Returns the event for a given ID.",
    event_id=("8-digit ID of the event"),
    field=(
        "Field to return (omit for all). Available fields are: 'event_id', 'event_name', "
        "'participant_email', 'event_start', 'duration'"
    ),
)
def calendar_get_event_information_by_id(office: Office, event_id: str, field: Optional[str] = None) -> dict:
    record = _record(office.events, event_id, "event_id")
    return dict(record) if field is None else {field: record[_field(field, list(record))]}


@TOOLS.tool(
    "Returns the events for a given query with pagination support, earliest first.",
    query=("Query to search for. Terms will be matched in the event_name and participant_email fields"),
    time_min=(f"Lower bound (inclusive) for an event's end time to filter by. {STAMP}"),
    time_max=(f"Upper bound (inclusive) for an event's start time to filter by. {STAMP}"),
    page=("Page number of results to return"),
    page_size=("Number of events per page"),
)
def calendar_search_events(
    office: Office,
    query: str = "",
    time_min: Optional[str] = None,
    time_max: Optional[str] = None,
    page: int = 1,
    page_size: int = 5,
) -> list[dict]:
    words = _text(query, "query", empty=True).lower().split()
    lo = _datetime(time_min, "time_min") if time_min is not None else ""
    hi = _datetime(time_max, "time_max") if time_max is not None else "~"

    def end(e: dict) -> str:
        t = datetime.strptime(e["event_start"], "%Y-%m-%d %H:%M:%S") + timedelta(minutes=int(e["duration"]))
        return t.strftime("%Y-%m-%d %H:%M:%S")

    found = [
        e
        for e in office.events.values()
        if all(w in f"{e['event_name']} {e['participant_email']}".lower() for w in words)
        and end(e) >= lo
        and e["event_start"] <= hi
    ]
    found.sort(key=lambda e: e["event_start"])
    return [dict(e) for e in _page(found, page, page_size)]


@TOOLS.tool(
    "Creates a new event.",
    meta=WRITES,
    event_name=("Name of the event"),
    participant_email=("Email of the participant"),
    event_start=(f"Start time of the event. {STAMP}"),
    duration=("Duration of the event in minutes"),
)
def calendar_create_event(
    office: Office, event_name: str, participant_email: str, event_start: str, duration: str
) -> str:
    name, person = _text(event_name, "event_name"), _address(participant_email, "participant_email")
    start, minutes = _datetime(event_start, "event_start"), _minutes(duration, "duration")
    _check_hours(start, minutes)
    eid = office.new_id("events")
    office.events[eid] = {
        "event_id": eid,
        "event_name": name,
        "participant_email": person,
        "event_start": start,
        "duration": minutes,
    }
    return f"Event created (event_id {eid})."


@TOOLS.tool("Deletes an event.", meta=WRITES, event_id=("8-digit ID of the event"))
def calendar_delete_event(office: Office, event_id: str) -> str:
    record = _record(office.events, event_id, "event_id")
    del office.events[record["event_id"]]
    return f"Event {record['event_id']} deleted."


@TOOLS.tool(
    "Updates an event.",
    meta=WRITES,
    event_id=("8-digit ID of the event"),
    field=("Field to update. Available fields are: 'event_name', 'participant_email', 'event_start', 'duration'"),
    new_value=("New value for the field"),
)
def calendar_update_event(office: Office, event_id: str, field: str, new_value: str) -> str:
    record, name = _record(office.events, event_id, "event_id"), _field(field, EVENT_FIELDS)
    value = {"event_name": _text, "participant_email": _address, "event_start": _datetime, "duration": _minutes}[name](
        new_value, "new_value"
    )
    updated = {**record, name: value}
    _check_hours(updated["event_start"], updated["duration"])
    record.update(updated)
    return f"Event {record['event_id']} updated: {name} = {value}."


def _visits(office: Office, time_min: Any, time_max: Any) -> list[dict]:
    lo, hi = _range(time_min, time_max)
    return [v for v in office.visits if lo <= v["date_of_visit"] <= hi]


RANGE = dict(time_min=(f"Start date of the time range. {DATE}"), time_max=(f"End date of the time range. {DATE}"))


@TOOLS.tool("Returns the analytics data for a given visitor ID.", visitor_id=("ID of the visitor"))
def analytics_get_visitor_information_by_id(office: Office, visitor_id: str) -> list[dict]:
    key = _text(visitor_id, "visitor_id").lower()
    found = [dict(v) for v in office.visits if v["visitor_id"] == key]
    if not found:
        raise ToolError(f"no visitor with visitor_id {key!r}")
    return found


@TOOLS.tool(
    "Plots the analytics data for a given time range and value.",
    meta=WRITES,
    **RANGE,
    value_to_plot=("Value to plot. Available values are: " + ", ".join(f"'{v}'" for v in PLOT_VALUES)),
    plot_type=("Type of plot. Can be 'bar', 'line', 'scatter' or 'histogram'"),
)
def analytics_create_plot(office: Office, time_min: str, time_max: str, value_to_plot: str, plot_type: str) -> str:
    lo, hi = _date(time_min, "time_min"), _date(time_max, "time_max")
    value, kind = _choice(value_to_plot, "value_to_plot", PLOT_VALUES), _choice(plot_type, "plot_type", PLOT_TYPES)
    path = f"plots/{lo}_{hi}_{value}_{kind}.png"
    pid = office.new_id("plots")
    office.plots[pid] = {
        "plot_id": pid,
        "file_path": path,
        "time_min": lo,
        "time_max": hi,
        "value_to_plot": value,
        "plot_type": kind,
    }
    return path


@TOOLS.tool("Returns the total number of visits within a specified time range.", **RANGE)
def analytics_total_visits_count(
    office: Office, time_min: Optional[str] = None, time_max: Optional[str] = None
) -> dict:
    return {"total_visits": len(_visits(office, time_min, time_max))}


@TOOLS.tool("Returns the number of engaged users within a specified time range.", **RANGE)
def analytics_engaged_users_count(
    office: Office, time_min: Optional[str] = None, time_max: Optional[str] = None
) -> dict:
    return {"engaged_users": sum(v["user_engaged"] for v in _visits(office, time_min, time_max))}


@TOOLS.tool(
    "Returns the number of visits from a specific traffic source within a specified time range.",
    **RANGE,
    traffic_source=(
        "Traffic source to filter the visits. Available values are: " + ", ".join(f"'{s}'" for s in TRAFFIC_SOURCES)
    ),
)
def analytics_traffic_source_count(
    office: Office, time_min: Optional[str] = None, time_max: Optional[str] = None, traffic_source: Optional[str] = None
) -> dict:
    visits = _visits(office, time_min, time_max)
    if traffic_source is not None:
        source = _choice(traffic_source, "traffic_source", TRAFFIC_SOURCES)
        visits = [v for v in visits if v["traffic_source"] == source]
    return {"visits": len(visits)}


@TOOLS.tool("Returns the average session duration in seconds within a specified time range.", **RANGE)
def analytics_get_average_session_duration(
    office: Office, time_min: Optional[str] = None, time_max: Optional[str] = None
) -> dict:
    visits = _visits(office, time_min, time_max)
    mean = sum(v["session_duration_seconds"] for v in visits) / len(visits) if visits else 0.0
    return {"average_session_duration_seconds": round(mean, 2)}


@TOOLS.tool(
    "Counts CRM customers or project tasks grouped by one of their fields (e.g. customers by 'status', "
    "tasks by 'list_name' or 'assigned_to_email').",
    table=("What to count: 'customers' or 'tasks'"),
    group_by=("Field to group the counts by"),
)
def analytics_count_records(office: Office, table: str, group_by: str) -> dict:
    name = _choice(table, "table", ["customers", "tasks"])
    key = _field(group_by, CUSTOMER_FIELDS if name == "customers" else TASK_FIELDS)
    return dict(sorted(Counter(str(r[key]) for r in getattr(office, name).values()).items()))


@TOOLS.tool(
    "Returns the task information for a given ID.",
    task_id=("8-digit ID of the task"),
    field=(
        "Field to return (omit for all). Available fields are: 'task_id', 'task_name', "
        "'assigned_to_email', 'list_name', 'due_date', 'board'"
    ),
)
def project_management_get_task_information_by_id(office: Office, task_id: str, field: Optional[str] = None) -> dict:
    record = _record(office.tasks, task_id, "task_id")
    return dict(record) if field is None else {field: record[_field(field, list(record))]}


@TOOLS.tool(
    "Searches for tasks based on the given parameters (all given ones must match).",
    task_name=("Name or part of the name of the task"),
    assigned_to_email=("Email address of the person assigned to the task"),
    list_name=("Name of the list the task belongs to"),
    due_date=(f"Due date of the task. {DATE}"),
    board=("Name of the board the task belongs to"),
)
def project_management_search_tasks(
    office: Office,
    task_name: Optional[str] = None,
    assigned_to_email: Optional[str] = None,
    list_name: Optional[str] = None,
    due_date: Optional[str] = None,
    board: Optional[str] = None,
) -> list[dict]:
    checks = []
    if task_name is not None:
        checks.append(lambda t, v=_text(task_name, "task_name").lower(): v in t["task_name"].lower())
    if assigned_to_email is not None:
        checks.append(lambda t, v=_address(assigned_to_email, "assigned_to_email"): t["assigned_to_email"] == v)
    if list_name is not None:
        checks.append(lambda t, v=_choice(list_name, "list_name", LISTS): t["list_name"] == v)
    if due_date is not None:
        checks.append(lambda t, v=_date(due_date, "due_date"): t["due_date"] == v)
    if board is not None:
        checks.append(lambda t, v=_choice(board, "board", BOARDS): t["board"] == v)
    return [dict(t) for t in office.tasks.values() if all(c(t) for c in checks)]


@TOOLS.tool(
    "Creates a new task.",
    meta=WRITES,
    task_name=("Name of the task"),
    assigned_to_email=("Email address of the person assigned to the task"),
    list_name=("Name of the list the task belongs to. One of: " + ", ".join(f"'{x}'" for x in LISTS)),
    due_date=(f"Due date of the task. {DATE}"),
    board=("Name of the board the task belongs to. One of: " + ", ".join(f"'{x}'" for x in BOARDS)),
)
def project_management_create_task(
    office: Office, task_name: str, assigned_to_email: str, list_name: str, due_date: str, board: str
) -> str:
    record = {
        "task_name": _text(task_name, "task_name"),
        "assigned_to_email": _employee(office, assigned_to_email, "assigned_to_email"),
        "list_name": _choice(list_name, "list_name", LISTS),
        "due_date": _date(due_date, "due_date"),
        "board": _choice(board, "board", BOARDS),
    }
    tid = office.new_id("tasks")
    office.tasks[tid] = {"task_id": tid, **record}
    return f"Task created (task_id {tid})."


@TOOLS.tool("Deletes a task by ID.", meta=WRITES, task_id=("8-digit ID of the task"))
def project_management_delete_task(office: Office, task_id: str) -> str:
    record = _record(office.tasks, task_id, "task_id")
    del office.tasks[record["task_id"]]
    return f"Task {record['task_id']} deleted."


@TOOLS.tool(
    "Updates a task by ID.",
    meta=WRITES,
    task_id=("8-digit ID of the task"),
    field=("Field to update. Available fields are: " + ", ".join(f"'{x}'" for x in TASK_FIELDS)),
    new_value=("New value for the field"),
)
def project_management_update_task(office: Office, task_id: str, field: str, new_value: str) -> str:
    record, name = _record(office.tasks, task_id, "task_id"), _field(field, TASK_FIELDS)
    check = {
        "task_name": _text,
        "due_date": _date,
        "assigned_to_email": lambda v, n: _employee(office, v, n),
        "list_name": lambda v, n: _choice(v, n, LISTS),
        "board": lambda v, n: _choice(v, n, BOARDS),
    }[name]
    record[name] = check(new_value, "new_value")
    return f"Task {record['task_id']} updated: {name} = {record[name]}."


def _customer_value(office: Office, name: str, value: Any, label: str) -> str:
    if name in ("last_contact_date", "follow_up_by"):
        return _date(value, label)
    if name == "assigned_to_email":
        return _employee(office, value, label)
    if name == "customer_email":
        return _address(value, label)
    if name == "status":
        return _choice(value, label, STATUSES)
    if name == "product_interest":
        return _choice(value, label, PRODUCTS)
    return _text(value, label, empty=name == "notes")


@TOOLS.tool(
    "Searches for customers based on the given parameters with pagination support.",
    page=("Page number of results to return"),
    page_size=("Number of customers per page"),
    assigned_to_email=("Email address of the person assigned to the customer"),
    customer_name=("Name or part of the name of the customer"),
    customer_email=("Email address of the customer"),
    product_interest=("Product interest of the customer"),
    status=("Current status of the customer"),
    last_contact_date_min=(f"Minimum last contact date. {DATE}"),
    last_contact_date_max=(f"Maximum last contact date. {DATE}"),
    follow_up_by_min=(f"Minimum follow up date. {DATE}"),
    follow_up_by_max=(f"Maximum follow up date. {DATE}"),
)
def customer_relationship_manager_search_customers(
    office: Office,
    customer_name: Optional[str] = None,
    assigned_to_email: Optional[str] = None,
    customer_email: Optional[str] = None,
    product_interest: Optional[str] = None,
    status: Optional[str] = None,
    last_contact_date_min: Optional[str] = None,
    last_contact_date_max: Optional[str] = None,
    follow_up_by_min: Optional[str] = None,
    follow_up_by_max: Optional[str] = None,
    page: int = 1,
    page_size: int = 5,
) -> list[dict]:
    checks = []
    if customer_name is not None:
        checks.append(lambda c, v=_text(customer_name, "customer_name").lower(): v in c["customer_name"].lower())
    for name, value in (
        ("assigned_to_email", assigned_to_email),
        ("customer_email", customer_email),
        ("product_interest", product_interest),
        ("status", status),
    ):
        if value is not None:
            checks.append(lambda c, k=name, v=_customer_value(office, name, value, name): c[k] == v)
    for name, lo, hi in (
        ("last_contact_date", last_contact_date_min, last_contact_date_max),
        ("follow_up_by", follow_up_by_min, follow_up_by_max),
    ):
        if lo is not None:
            checks.append(lambda c, k=name, v=_date(lo, f"{name}_min"): c[k] >= v)
        if hi is not None:
            checks.append(lambda c, k=name, v=_date(hi, f"{name}_max"): c[k] <= v)
    found = [dict(c) for c in office.customers.values() if all(check(c) for check in checks)]
    return _page(found, page, page_size)


@TOOLS.tool(
    "Updates a customer record by ID.",
    meta=WRITES,
    customer_id=("ID of the customer"),
    field=("Field to update. Available fields are: " + ", ".join(f"'{x}'" for x in CUSTOMER_FIELDS)),
    new_value=("New value for the field"),
)
def customer_relationship_manager_update_customer(office: Office, customer_id: str, field: str, new_value: str) -> str:
    record, name = _record(office.customers, customer_id, "customer_id"), _field(field, CUSTOMER_FIELDS)
    record[name] = _customer_value(office, name, new_value, "new_value")
    return f"Customer {record['customer_id']} updated: {name} = {record[name]}."


@TOOLS.tool(
    "Adds a new customer record.",
    meta=WRITES,
    customer_name=("Name of the customer"),
    assigned_to_email=("Email address of the person assigned to the customer"),
    status=("Current status of the customer. One of: " + ", ".join(f"'{x}'" for x in STATUSES)),
    customer_email=("Email address of the customer"),
    customer_phone=("Phone number of the customer"),
    last_contact_date=(f"The last date the customer was contacted. {DATE}"),
    product_interest=("Product interest of the customer. One of: " + ", ".join(f"'{x}'" for x in PRODUCTS)),
    notes=("Notes about the customer"),
    follow_up_by=(f"Date for the next follow up. {DATE}"),
)
def customer_relationship_manager_add_customer(
    office: Office,
    customer_name: str,
    assigned_to_email: str,
    status: str,
    customer_email: Optional[str] = None,
    customer_phone: Optional[str] = None,
    last_contact_date: Optional[str] = None,
    product_interest: Optional[str] = None,
    notes: Optional[str] = None,
    follow_up_by: Optional[str] = None,
) -> str:
    given = {
        "customer_name": customer_name,
        "assigned_to_email": assigned_to_email,
        "status": status,
        "customer_email": customer_email,
        "customer_phone": customer_phone,
        "last_contact_date": last_contact_date,
        "product_interest": product_interest,
        "notes": notes,
        "follow_up_by": follow_up_by,
    }
    record = {
        name: _customer_value(office, name, given[name], name) if given.get(name) is not None else None
        for name in CUSTOMER_FIELDS
    }
    cid = office.new_id("customers")
    office.customers[cid] = {"customer_id": cid, **record}
    return f"Customer added (customer_id {cid})."


@TOOLS.tool("Deletes a customer record by ID.", meta=WRITES, customer_id=("ID of the customer"))
def customer_relationship_manager_delete_customer(office: Office, customer_id: str) -> str:
    record = _record(office.customers, customer_id, "customer_id")
    del office.customers[record["customer_id"]]
    return f"Customer {record['customer_id']} deleted."


MUTATING = frozenset(tool.name for tool in TOOLS if tool.meta.get("mutates"))


def call(office: Office, name: str, arguments: dict) -> Any:
    """Run one tool synchronously (what the verifier's replay and the generator use)."""
    if name not in TOOLS:
        raise ToolError(f"unknown tool {name!r}")
    tool = TOOLS[name]
    return tool.fn(office, **tool.check(arguments))
