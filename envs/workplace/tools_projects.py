"""The office's project-management tools, as NeMo Gym's (names, arguments, results, refusals).

As in NeMo Gym: a task can only be assigned to someone who already has one (its list of team
members), list and board names must be written exactly, due dates are stored as given, and the
search's text filters are case-insensitive patterns while the assignee must match exactly.
"""

from __future__ import annotations

from typing import Any, Optional

from envs.workplace.checks import EMAIL_PATTERN, contains, lowered, one_field, pattern, text
from envs.workplace.office import BOARDS, LISTS, TASK_FIELDS, Office, ToolError, lookup
from envs.workplace.toolset import TOOLS, WRITES

BAD_LIST = "List not valid. Please choose from: " + ", ".join(f"'{x}'" for x in LISTS) + "."
BAD_BOARD = "Board not valid. Please choose from: " + ", ".join(f"'{x}'" for x in BOARDS) + "."
BAD_ASSIGNEE = "Assignee email not valid. Please choose from the list of team members."


def _team(office: Office) -> set[str]:
    return {
        t["assigned_to_email"].lower() for t in office.tasks.values() if isinstance(t.get("assigned_to_email"), str)
    }


@TOOLS.tool(
    "Returns the task information for a given ID.",
    task_id="8-digit ID of the task",
    field="Field to return. Available fields are: " + ", ".join(f"'{f}'" for f in TASK_FIELDS),
)
def project_management_get_task_information_by_id(office: Office, task_id: str, field: str) -> dict:
    if not task_id:
        raise ToolError("Task ID not provided.")
    if not field:
        raise ToolError("Field not provided.")
    return one_field(lookup(office.tasks, task_id), field, "Task not found.", "Field not found.")


@TOOLS.tool(
    "Searches for tasks based on the given parameters.",
    task_name="Name of the task",
    assigned_to_email="Email address of the person assigned to the task",
    list_name="Name of the list the task belongs to",
    due_date="Due date of the task in YYYY-MM-DD format",
    board="Name of the board the task belongs to",
)
def project_management_search_tasks(
    office: Office,
    task_name: Optional[str] = None,
    assigned_to_email: Optional[str] = None,
    list_name: Optional[str] = None,
    due_date: Optional[str] = None,
    board: Optional[str] = None,
) -> list[dict]:
    """As NeMo Gym's: an empty argument is no filter; with none given the search is refused."""
    if not any([task_name, assigned_to_email, list_name, due_date, board]):
        raise ToolError("No search parameters provided.")
    if assigned_to_email and not EMAIL_PATTERN.match(text(assigned_to_email, "assigned_to_email")):
        raise ToolError("Invalid email format for assigned_to_email.")
    found = list(office.tasks.values())
    if assigned_to_email:  # matched whole, in any case
        who = lowered(assigned_to_email, "assigned_to_email")
        found = [
            t for t in found if isinstance(t.get("assigned_to_email"), str) and t["assigned_to_email"].lower() == who
        ]
    for name, value in (("task_name", task_name), ("list_name", list_name), ("due_date", due_date), ("board", board)):
        if value:  # matched as a case-insensitive pattern anywhere in the field
            term = pattern(value, name)
            found = [t for t in found if contains(term, t.get(name))]
    return [dict(t) for t in found]


@TOOLS.tool(
    "Creates a new task.",
    meta=WRITES,
    task_name="Name of the task",
    assigned_to_email="Email address of the person assigned to the task",
    list_name="Name of the list the task belongs to. One of: " + ", ".join(f"'{x}'" for x in LISTS),
    due_date="Due date of the task in YYYY-MM-DD format",
    board="Name of the board the task belongs to. One of: " + ", ".join(f"'{x}'" for x in BOARDS),
)
def project_management_create_task(
    office: Office, task_name: str, assigned_to_email: str, list_name: str, due_date: str, board: str
) -> str:
    if not all([task_name, assigned_to_email, list_name, due_date, board]):
        raise ToolError("Missing task details.")
    who = lowered(assigned_to_email, "assigned_to_email")
    if who not in _team(office):
        raise ToolError(BAD_ASSIGNEE)
    if list_name not in LISTS:
        raise ToolError(BAD_LIST)
    if board not in BOARDS:
        raise ToolError(BAD_BOARD)
    fields = {
        "task_name": task_name,
        "assigned_to_email": who,
        "list_name": list_name,
        "due_date": due_date,
        "board": board,
    }
    return office.create("tasks", "task_id", fields)


@TOOLS.tool("Deletes a task by ID.", meta=WRITES, task_id="8-digit ID of the task")
def project_management_delete_task(office: Office, task_id: str) -> str:
    return office.delete("tasks", task_id, "Task")


@TOOLS.tool(
    "Updates a task by ID.",
    meta=WRITES,
    task_id="8-digit ID of the task",
    field="Field to update. Available fields are: " + ", ".join(f"'{f}'" for f in TASK_FIELDS[1:]),
    new_value="New value for the field",
)
def project_management_update_task(office: Office, task_id: str, field: str, new_value: str) -> str:
    """The id column itself cannot be rewritten here (NeMo Gym would): it is the record's key."""
    if not task_id or not field or not new_value:
        raise ToolError("Task ID, field, or new value not provided.")
    value: Any = lowered(new_value, "new_value") if field == "assigned_to_email" else new_value
    if field == "board" and value not in BOARDS:
        raise ToolError(BAD_BOARD)
    if field == "list_name" and value not in LISTS:
        raise ToolError(BAD_LIST)
    if field == "assigned_to_email" and value not in _team(office):
        raise ToolError(BAD_ASSIGNEE)
    record = lookup(office.tasks, task_id)
    if record is None:
        raise ToolError("Task not found.")
    if not isinstance(field, str) or field not in record or field == "task_id":
        raise ToolError("Field not valid.")
    record[field] = value
    return "Task updated successfully."
