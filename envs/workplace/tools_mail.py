"""The office's company directory, email and calendar tools."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Optional

from envs.workplace.checks import (
    _address,
    _check_hours,
    _datetime,
    _field,
    _minutes,
    _page,
    _range,
    _record,
    _record_view,
    _text,
)
from envs.workplace.office import (
    EVENT_FIELDS,
    NOW,
    Office,
    ToolError,
)
from envs.workplace.toolset import DATE, STAMP, TOOLS, WRITES


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
    return _record_view(office.emails, email_id, "email_id", field)


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
    return _record_view(office.events, event_id, "event_id", field)


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
