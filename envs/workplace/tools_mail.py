"""The office's company directory and email tools, as NeMo Gym's (names, arguments, results, refusals)."""

from __future__ import annotations

from typing import Any, Optional

from envs.workplace.checks import contains, lowered, one_field, paginate, parse_time, pattern, timestamp
from envs.workplace.office import EMAIL_FIELDS, NOW_TEXT, Office, ToolError, lookup
from envs.workplace.toolset import DATE, FARM_ONLY, TOOLS, WRITES

EMAIL_FIELDS_NOTE = ", ".join(f"'{f}'" for f in EMAIL_FIELDS)


@TOOLS.tool(
    "Finds all email addresses containing the given name (case-insensitive search).",
    name="Name or partial name to search for in email addresses",
)
def company_directory_find_email_address(office: Office, name: str = "") -> list[str]:
    if name is None or name == "":
        raise ToolError("Name not provided.")
    term = pattern(lowered(name, "name"), "name")
    return [e["email"] for e in office.employees if contains(term, e["email"])]


@TOOLS.tool(
    "Returns the name, department and title of an employee.",
    meta=FARM_ONLY,
    email="Email address of the employee",
)
def company_directory_get_employee_information(office: Office, email: str) -> dict:
    address = lowered(email, "email").strip()
    for e in office.employees:
        if e["email"].lower() == address:
            return {k: v for k, v in e.items() if v is not None}
    raise ToolError(f"no employee with email {address!r}")


@TOOLS.tool(
    "Retrieves specific details of an email by its ID.",
    email_id="Unique ID of the email",
    field=f"Specific field to return. Available fields: {EMAIL_FIELDS_NOTE}",
)
def email_get_email_information_by_id(office: Office, email_id: str, field: str) -> dict:
    if not email_id:
        raise ToolError("Email ID not provided.")
    if not field:
        raise ToolError("Field not provided.")
    record = lookup(office.emails, email_id)
    available = ", ".join(record) if record else ""
    return one_field(record, field, "Email not found.", f"Field '{field}' not found. Available fields: {available}")


def _sent(record: dict) -> Any:
    return parse_time(record["sent_datetime"]) or parse_time(NOW_TEXT)


@TOOLS.tool(
    "Searches for emails matching the given query across subject, body, or sender fields. The function matches "
    "an email if all words in the query appear in any of these fields.",
    query="Search query, matching terms in subject, body, or sender/recipient fields",
    date_min=f"Lower date limit for the email's sent date (inclusive). {DATE}",
    date_max=f"Upper date limit for the email's sent date (inclusive). {DATE}",
    page="Page number of results to return",
    page_size="Number of emails per page",
)
def email_search_emails(
    office: Office,
    query: str = "",
    date_min: Optional[str] = None,
    date_max: Optional[str] = None,
    page: int = 1,
    page_size: int = 5,
) -> Any:
    words = lowered(query, "query").split()
    found = [
        m
        for m in office.emails.values()
        if all(w in f"{m['subject']} {m['body']} {m['sender/recipient']}".lower() for w in words)
    ]
    found.sort(key=_sent, reverse=True)  # newest first; ties keep table order
    for bound, keep in ((date_min, lambda d, b: d >= b), (date_max, lambda d, b: d <= b)):
        if bound and found:  # as NeMo Gym's: a bound is read only when there is something to filter
            unread = f"Error searching emails: Unknown datetime string format, unable to parse: {bound}"
            day = timestamp(bound, unread).date()
            found = [m for m in found if keep(_sent(m).date(), day)]
    if not found:
        return "No emails found."
    return paginate(found, page, page_size, "emails")


def _recipient(value: Any) -> str:
    address = lowered(value, "recipient")
    if "@" not in address or "." not in address:
        raise ToolError("Invalid recipient email address.")
    return address


def _send(office: Office, recipient: str, subject: Any, body: Any) -> str:
    fields = {
        "inbox/outbox": "outbox",
        "sender/recipient": recipient,
        "subject": subject,
        "sent_datetime": NOW_TEXT,
        "body": body,
    }
    return office.create("emails", "email_id", fields, pad=False)


@TOOLS.tool(
    "Sends an email to the specified recipient.",
    meta=WRITES,
    recipient="Email address of the recipient",
    subject="Subject line of the email",
    body="Body content of the email",
)
def email_send_email(office: Office, recipient: str, subject: str, body: str) -> str:
    if not recipient or not subject or not body:
        raise ToolError("Recipient, subject, or body not provided.")
    _send(office, _recipient(recipient), subject, body)
    return "Email sent successfully."


@TOOLS.tool("Deletes an email by its ID.", meta=WRITES, email_id="Unique ID of the email to be deleted")
def email_delete_email(office: Office, email_id: str) -> str:
    return office.delete("emails", email_id, "Email")


@TOOLS.tool(
    "Forwards an email to the specified recipient.",
    meta=WRITES,
    email_id="Unique ID of the email to be forwarded",
    recipient="Email address of the recipient",
)
def email_forward_email(office: Office, email_id: str, recipient: str) -> str:
    if not email_id or not recipient:
        raise ToolError("Email ID or recipient not provided.")
    to = _recipient(recipient)
    record = lookup(office.emails, email_id)
    if record is None:
        raise ToolError("Email not found.")
    email_send_email(office, to, f"FW: {record['subject']}", record["body"])
    return "Email forwarded successfully."


@TOOLS.tool(
    "Replies to an email by its ID.",
    meta=WRITES,
    email_id="Unique ID of the email to be replied",
    body="Body content of the email",
)
def email_reply_email(office: Office, email_id: str, body: str) -> str:
    if not email_id or not body:
        raise ToolError("Email ID or body not provided.")
    record = lookup(office.emails, email_id)
    if record is None:
        raise ToolError("Email not found.")
    email_send_email(office, record["sender/recipient"], f"RE: {record['subject']}", body)
    return "Email replied successfully."
