"""The office behind workplace_assistant: its tables, how new records are numbered, and what the verifier compares.

Five databases as in NeMo Gym's workplace_assistant (email, calendar, analytics, project
management, CRM) plus the company directory, each record a dict with NeMo Gym's columns in NeMo
Gym's order. An Office comes from NeMo Gym's own tables (tables.py: its CSVs, ids kept as
written there, e.g. "00000373") or is seeded from a number (seeded.py: the shipped generator's
offices, in the same formats); the tools (tools_*.py) behave the same on either. "Now" is fixed
at NeMo Gym's 2023-11-30 23:59:00.

New records are numbered as NeMo Gym numbers them, so ids the model reads back agree with
NeMo Gym's: one more than the table's largest id compared as text, zero-padded to 8 digits;
emails are not padded ("00000499" is followed by "500").

`snapshot(office)` is what the verifier compares (`rows_off` counts where two offices' snapshots
differ, skipping records both hold unchanged), with NeMo Gym's rules: every mutable table;
text compared case-insensitively except `status`, `list_name` and `board`; a value that is not
text (a number where the schema asks for a string) compares as missing, as NeMo Gym's
lowercasing makes it. One deliberate difference, which changes none of NeMo Gym's published
expectations: NeMo Gym compares tables row by row in order, so two creations made in the other
order (whose ids swap) fail there; here a record a tool created is matched by its content, its
id and its place left out, and the order of independent calls never matters.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Optional

NOW = datetime(2023, 11, 30, 23, 59, 0)
NOW_TEXT = "2023-11-30 23:59:00"  # NeMo Gym's str(HARDCODED_CURRENT_TIME): sent emails carry it

LISTS = ["Backlog", "In Progress", "In Review", "Completed"]
BOARDS = ["Back end", "Front end", "Design"]
STATUSES = ["Qualified", "Won", "Lost", "Lead", "Proposal"]
PRODUCTS = ["Software", "Hardware", "Services", "Consulting", "Training"]
TRAFFIC_SOURCES = ["direct", "referral", "search engine", "social media"]
PLOT_VALUES = [
    "total_visits",
    "session_duration_seconds",
    "user_engaged",
    "visits_direct",
    "visits_referral",
    "visits_search_engine",
    "visits_social_media",
]
PLOT_TYPES = ["bar", "line", "scatter", "histogram"]

# NeMo Gym's columns, in its CSVs' order.
EMAIL_FIELDS = ["email_id", "inbox/outbox", "sender/recipient", "subject", "sent_datetime", "body"]
EVENT_FIELDS = ["event_id", "event_name", "participant_email", "event_start", "duration"]
TASK_FIELDS = ["task_id", "task_name", "assigned_to_email", "list_name", "due_date", "board"]
CUSTOMER_FIELDS = [
    "customer_id",
    "assigned_to_email",
    "customer_name",
    "customer_email",
    "customer_phone",
    "last_contact_date",
    "product_interest",
    "status",
    "follow_up_by",
    "notes",
]

# Mutable tables, keyed by the domain name used in reward components; value: (attribute, id field).
TABLES: dict[str, tuple[str, Optional[str]]] = {
    "email": ("emails", "email_id"),
    "calendar": ("events", "event_id"),
    "project_management": ("tasks", "task_id"),
    "customer_relationship_manager": ("customers", "customer_id"),
    "analytics": ("plots", None),  # NeMo Gym's plots table: one column, file_path
}
CASE_KEPT = {"status", "list_name", "board"}  # NeMo Gym compares these as written, other text case-insensitively
CREATED = "<created>"


class ToolError(ValueError):
    """A call the office refuses (NeMo Gym's refusal text as the message); it changes nothing.
    The agent loop returns the message to the model."""


@dataclass
class Office:
    employees: list[dict]  # {"email", "name", ...}: the company directory ("me" first in a seeded office)
    emails: dict[str, dict]  # every table: id -> record, in table order
    events: dict[str, dict]
    tasks: dict[str, dict]
    customers: dict[str, dict]
    visits: list[dict]  # no tool changes a visit in place (one replaces the list), so copies share it
    plots: dict[str, dict] = field(default_factory=dict)
    created: dict[str, set] = field(default_factory=dict)  # per table attribute: keys the tools added

    @property
    def user(self) -> dict:
        """The employee the assistant works for in a seeded office ("me" in its requests)."""
        return self.employees[0]

    @classmethod
    def from_rows(
        cls,
        *,
        directory: list[str],
        emails: list[dict],
        events: list[dict],
        tasks: list[dict],
        customers: list[dict],
        visits: list[dict],
    ) -> "Office":
        """An office from table rows as NeMo Gym's CSVs hold them (records keyed by their id column)."""
        return cls(
            employees=[{"email": e, "name": name_of(e)} for e in directory],
            emails={r["email_id"]: dict(r) for r in emails},
            events={r["event_id"]: dict(r) for r in events},
            tasks={r["task_id"]: dict(r) for r in tasks},
            customers={r["customer_id"]: dict(r) for r in customers},
            visits=[dict(v) for v in visits],
        )

    def copy(self) -> "Office":
        """A fresh office for one rollout: records copied (their values are immutable), visits shared."""
        tables = {attr: {k: dict(r) for k, r in getattr(self, attr).items()} for attr, _ in TABLES.values()}
        return Office(
            employees=self.employees,
            visits=self.visits,
            created={attr: set(keys) for attr, keys in self.created.items()},
            **tables,
        )

    def new_id(self, attr: str, *, pad: bool = True) -> str:
        """NeMo Gym's next id: the largest id (compared as text) plus one; emails unpadded, "1" in an empty mailbox."""
        table = getattr(self, attr)
        if not table:
            if pad:
                raise ToolError(f"cannot number a new record: the {attr} table is empty")
            return "1"
        try:
            top = int(max(table))
        except ValueError:
            raise ToolError(f"cannot number a new record after id {max(table)!r}") from None
        return str(top + 1).zfill(8) if pad else str(top + 1)

    def add(self, attr: str, key: str, record: dict) -> None:
        """A created record, in the table's column order (absent columns None, as NeMo Gym's concat fills them)."""
        table = getattr(self, attr)
        template = next(iter(table.values()), None)
        if template is not None:
            record = {**{k: record.get(k) for k in template}, **{k: v for k, v in record.items() if k not in template}}
        table[key] = record
        self.created.setdefault(attr, set()).add(key)

    def remove(self, attr: str, key: str) -> None:
        del getattr(self, attr)[key]
        self.created.get(attr, set()).discard(key)

    def create(self, attr: str, id_column: str, fields: dict, *, pad: bool = True) -> str:
        """NeMo Gym's create tools: a record numbered by `new_id`, its id also in `id_column`; returns the id."""
        key = self.new_id(attr, pad=pad)
        self.add(attr, key, {id_column: key, **fields})
        return key

    def delete(self, attr: str, key: str, noun: str) -> str:
        """NeMo Gym's delete tools: the record with this id removed, or their refusals naming the `noun`."""
        if not key:
            raise ToolError(f"{noun} ID not provided.")
        if lookup(getattr(self, attr), key) is None:
            raise ToolError(f"{noun} not found.")
        self.remove(attr, key)
        return f"{noun} deleted successfully."


def name_of(address: str) -> str:
    """'aisha.chen@atlas.com' -> 'Aisha Chen' (NeMo Gym's directory has addresses only)."""
    return " ".join(part.capitalize() for part in address.split("@")[0].split("."))


def lookup(table: dict, key: Any) -> Optional[dict]:
    """The record with this id, or None; an id that is not text matches nothing (as in NeMo Gym's tables of text)."""
    return table.get(key) if isinstance(key, str) else None


def _compared(name: str, value: Any) -> Any:
    if name in CASE_KEPT:
        return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)
    return value.lower() if isinstance(value, str) else None


def _row(record: dict, id_field: Optional[str], created: bool) -> tuple:
    return tuple((k, CREATED if created and k == id_field else _compared(k, v)) for k, v in sorted(record.items()))


def snapshot(office: Office) -> dict[str, Counter]:
    """Each mutable table as a multiset of rows as NeMo Gym compares them; created records without their id."""
    out = {}
    for domain, (attr, id_field) in TABLES.items():
        made = office.created.get(attr, set())
        out[domain] = Counter(_row(r, id_field, key in made) for key, r in getattr(office, attr).items())
    return out


def rows_off(a: Office, b: Office) -> dict[str, int]:
    """Per domain, how many rows are in one office's table and not the other's, as snapshot() compares
    them (0: the same). Records both offices hold unchanged under the same id are skipped first,
    so the cost follows the changes, not the tables' size (NeMo Gym's hold about 1,300 records)."""
    out = {}
    for domain, (attr, id_field) in TABLES.items():
        made = a.created.get(attr, set()) | b.created.get(attr, set())
        sides = []
        for mine, theirs, created in ((a, b, a.created.get(attr, set())), (b, a, b.created.get(attr, set()))):
            other = getattr(theirs, attr)
            sides.append(
                Counter(
                    _row(r, id_field, key in created)
                    for key, r in getattr(mine, attr).items()
                    if key in made or other.get(key) != r
                )
            )
        out[domain] = sum(((sides[0] - sides[1]) + (sides[1] - sides[0])).values())
    return out
