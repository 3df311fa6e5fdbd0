"""The office's analytics, project management and CRM tools."""

from __future__ import annotations

from collections import Counter
from typing import Any, Optional

from envs.workplace.checks import (
    _address,
    _choice,
    _date,
    _employee,
    _field,
    _page,
    _range,
    _record,
    _record_view,
    _text,
)
from envs.workplace.office import (
    BOARDS,
    CUSTOMER_FIELDS,
    LISTS,
    PLOT_TYPES,
    PLOT_VALUES,
    PRODUCTS,
    STATUSES,
    TASK_FIELDS,
    TRAFFIC_SOURCES,
    Office,
    ToolError,
)
from envs.workplace.toolset import DATE, TOOLS, WRITES


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
    return _record_view(office.tasks, task_id, "task_id", field)


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
