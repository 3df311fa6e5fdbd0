"""The office's calendar tools, as NeMo Gym's (names, arguments, results, refusals).

As in NeMo Gym, an event's start and duration are stored as given once they parse (a start of
"2023-12-08T15:00" stays so, and compares unequal to "2023-12-08 15:00:00"), the participant's
address is lowercased, and nothing enforces the 9am-6pm rule the system prompt states.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Optional

from envs.workplace.checks import contains, lowered, minutes, paginate, parse_time, pattern, timestamp
from envs.workplace.office import EVENT_FIELDS, Office, ToolError, lookup
from envs.workplace.toolset import STAMP, TOOLS, WRITES

UPDATABLE = EVENT_FIELDS[1:]
BAD_START = "Invalid event_start format. Expected YYYY-MM-DD HH:MM:SS."


def _event_id(value: Any) -> str:
    if not (isinstance(value, str) and len(value) == 8 and value.isdigit()):
        raise ToolError("Invalid event ID format. Expected 8-digit ID.")
    return value


@TOOLS.tool(
    "Returns the event for a given ID.",
    event_id="8-digit ID of the event",
    field="Field to return. Available fields are: " + ", ".join(f"'{f}'" for f in EVENT_FIELDS),
)
def calendar_get_event_information_by_id(office: Office, event_id: str, field: str) -> dict:
    if not event_id:
        raise ToolError("Event ID not provided.")
    if not field:
        raise ToolError("Field not provided.")
    key = _event_id(event_id)
    if field not in EVENT_FIELDS:
        raise ToolError(f"Invalid field. Available fields are: {', '.join(EVENT_FIELDS)}")
    record = lookup(office.events, key)
    if record is None:
        raise ToolError("Event not found.")
    if field not in record:
        raise ToolError("Field not found.")
    return {field: record[field]}


@TOOLS.tool(
    "Returns the events for a given query with pagination support.",
    query="Query to search for. Terms will be matched in the event_name and participant_email fields",
    time_min=f"Lower bound (inclusive) for an event's end time to filter by. {STAMP}",
    time_max=f"Upper bound (inclusive) for an event's start time to filter by. {STAMP}",
    page="Page number of results to return",
    page_size="Number of events per page",
)
def calendar_search_events(
    office: Office,
    query: str = "",
    time_min: Optional[str] = None,
    time_max: Optional[str] = None,
    page: int = 1,
    page_size: int = 5,
) -> Any:
    """As NeMo Gym's: both bounds apply to the event's start, the query is one case-insensitive pattern."""
    lo = timestamp(time_min, "Invalid time_min format. Expected YYYY-MM-DD HH:MM:SS.") if time_min else None
    hi = timestamp(time_max, "Invalid time_max format. Expected YYYY-MM-DD HH:MM:SS.") if time_max else None
    term = pattern(query, "query")
    found = [
        e
        for e in office.events.values()
        if contains(term, e.get("event_name")) or contains(term, e.get("participant_email"))
    ]
    starts = [(parse_time(e.get("event_start")) or datetime.min, e) for e in found]
    kept = [e for t, e in starts if (lo is None or t >= lo) and (hi is None or t <= hi)]
    if not kept:
        return "No events found."
    when = {id(e): t for t, e in starts}
    kept.sort(key=lambda e: when[id(e)], reverse=True)  # latest first; ties keep table order, as NeMo Gym's sort
    return paginate(kept, page, page_size, "events")


@TOOLS.tool(
    "Creates a new event.",
    meta=WRITES,
    event_name="Name of the event",
    participant_email="Email of the participant",
    event_start=f"Start time of the event. {STAMP}",
    duration="Duration of the event in minutes",
)
def calendar_create_event(
    office: Office, event_name: str, participant_email: str, event_start: str, duration: str
) -> str:
    for value, what in ((event_name, "Event name"), (participant_email, "Participant email")):
        if not value:
            raise ToolError(f"{what} not provided.")
    if not event_start:
        raise ToolError("Event start not provided.")
    if not duration:
        raise ToolError("Event duration not provided.")
    timestamp(event_start, BAD_START)
    minutes(duration)
    person = lowered(participant_email, "participant_email")
    fields = {"event_name": event_name, "participant_email": person, "event_start": event_start, "duration": duration}
    return office.create("events", "event_id", fields)


@TOOLS.tool("Deletes an event.", meta=WRITES, event_id="8-digit ID of the event")
def calendar_delete_event(office: Office, event_id: str) -> str:
    if event_id:
        _event_id(event_id)
    return office.delete("events", event_id, "Event")


@TOOLS.tool(
    "Updates an event.",
    meta=WRITES,
    event_id="8-digit ID of the event",
    field="Field to update. Available fields are: " + ", ".join(f"'{f}'" for f in UPDATABLE),
    new_value="New value for the field",
)
def calendar_update_event(office: Office, event_id: str, field: str, new_value: str) -> str:
    if not event_id or not field or not new_value:
        raise ToolError("Event ID, field, or new value not provided.")
    key = _event_id(event_id)
    if field not in UPDATABLE:
        raise ToolError(f"Invalid field. Available fields are: {', '.join(UPDATABLE)}")
    if field == "event_start":
        timestamp(new_value, BAD_START)
    elif field == "duration":
        minutes(new_value)
    record = lookup(office.events, key)
    if record is None:
        raise ToolError("Event not found.")
    record[field] = lowered(new_value, "new_value") if field == "participant_email" else new_value
    return "Event updated successfully."
