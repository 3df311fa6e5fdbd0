"""The office behind workplace_assistant: its tables, the seeded data, and the snapshot the verifier compares.

Five databases mirror NeMo Gym's workplace_assistant sandbox (email, calendar, analytics,
project management, CRM) plus the company directory, and the tools keep its names and
arguments, so its rows' tool lists and ground-truth call lists mean the same thing here (two
read-only tools are ours: company_directory_get_employee_information, analytics_count_records). The
data is ours: `build_office(seed)` makes a small, deterministic office from a seed (unique
employee first names, event names, task names, customer names and email subjects, so a
request can name any record without ambiguity). "Now" is fixed, as in NeMo Gym's prompts.

A tool validates every argument before it changes anything, so a refused call (ToolError,
returned to the model as the tool's result by the agent loop) leaves the office as it was.
Lenient where meaning is unambiguous (enum case, a datetime without seconds, an id as an
integer), strict where it is not (dates that do not parse, unknown employees, meetings
outside 9am-6pm).

`snapshot(office)` is what the verifier compares: every mutable table as a multiset of
normalised rows, where seeded records keep their id and created ones are matched by content
(their ids depend on creation order, which should not matter).
"""

from __future__ import annotations

import copy
import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from functools import lru_cache

NOW = datetime(2023, 11, 30, 23, 59, 0)
COMPANY_DOMAIN = "atlas.com"
DAY_START, DAY_END = 9 * 60, 18 * 60  # meetings must fit in 9am-6pm

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

EVENT_FIELDS = ["event_name", "participant_email", "event_start", "duration"]
TASK_FIELDS = ["task_name", "assigned_to_email", "list_name", "due_date", "board"]
CUSTOMER_FIELDS = [
    "customer_name",
    "assigned_to_email",
    "customer_email",
    "customer_phone",
    "last_contact_date",
    "product_interest",
    "status",
    "notes",
    "follow_up_by",
]
# Mutable tables, keyed by the domain name used in reward components; value: (attribute, id field).
TABLES = {
    "email": ("emails", "email_id"),
    "calendar": ("events", "event_id"),
    "project_management": ("tasks", "task_id"),
    "customer_relationship_manager": ("customers", "customer_id"),
    "analytics": ("plots", "plot_id"),
}
CASE_KEPT = {"status", "list_name", "board"}  # compared as written (canonical); other strings case-insensitively

FIRST = [
    "Raj",
    "Carlos",
    "Amy",
    "Nadia",
    "Chen",
    "Fatima",
    "Olga",
    "Kofi",
    "Lena",
    "Marco",
    "Priya",
    "Tomas",
    "Yuki",
    "Dmitri",
    "Sofia",
    "Hannah",
    "Jamal",
    "Ines",
    "Luca",
    "Mei",
    "Omar",
    "Zara",
    "Ravi",
    "Elena",
]
LAST = [
    "Patel",
    "Garcia",
    "Smith",
    "Khan",
    "Wang",
    "Ali",
    "Ivanova",
    "Mensah",
    "Berg",
    "Rossi",
    "Sharma",
    "Novak",
    "Tanaka",
    "Petrov",
    "Costa",
    "Muller",
    "Brown",
    "Silva",
    "Moreau",
    "Lin",
    "Haddad",
    "Okafor",
]
DEPARTMENTS = [
    ("Engineering", "Software Engineer"),
    ("Sales", "Account Executive"),
    ("Design", "Product Designer"),
    ("Marketing", "Marketing Manager"),
    ("Support", "Support Specialist"),
]
CUSTOMER_FIRST = [
    "Quinn",
    "Avery",
    "Jordan",
    "Riley",
    "Morgan",
    "Casey",
    "Harper",
    "Rowan",
    "Emerson",
    "Parker",
    "Sage",
    "Reese",
    "Blake",
    "Drew",
    "Finley",
    "Hayden",
    "Kendall",
    "Logan",
    "Peyton",
    "Skyler",
]
CUSTOMER_LAST = [
    "Adams",
    "Baker",
    "Clark",
    "Davis",
    "Evans",
    "Foster",
    "Grant",
    "Hughes",
    "Irwin",
    "Jensen",
    "Keller",
    "Lopez",
    "Meyer",
    "Nolan",
    "Owens",
    "Price",
    "Reyes",
    "Stone",
    "Turner",
    "Walsh",
]
TASK_VERBS = ["Develop", "Design", "Test", "Document", "Refactor", "Review", "Deploy", "Optimize"]
TASK_OBJECTS = [
    "prototype for report generation",
    "login page",
    "payment API",
    "search feature",
    "onboarding flow",
    "dashboard widgets",
    "email templates",
    "data export",
    "mobile layout",
    "caching layer",
    "user settings page",
    "notification service",
]
EVENT_TOPICS = [
    "Sprint planning",
    "Budget review",
    "Product demo",
    "Design sync",
    "Customer call",
    "Roadmap review",
    "Code review",
    "Quarterly review",
    "Hiring debrief",
    "Team lunch",
    "Marketing sync",
    "Retrospective",
]
EMAIL_TOPICS = [
    "Task Update on {task}",
    "Question about {task}",
    "Feedback on {task}",
    "Meeting notes: {event}",
    "Follow-up: {event}",
    "Lead update: {customer}",
    "Contract for {customer}",
]
EMAIL_BODIES = [
    "Here is the latest status, let me know what you think.",
    "Can we discuss this tomorrow?",
    "I have attached the notes from our last conversation.",
    "Please review when you get a chance.",
    "Quick update: things are on track.",
    "We may need more time on this one.",
]


class ToolError(ValueError):
    """A call the office refuses; the agent loop returns the message to the model."""


@dataclass
class Office:
    employees: list[dict]
    emails: dict[str, dict]
    events: dict[str, dict]
    tasks: dict[str, dict]
    customers: dict[str, dict]
    visits: list[dict]
    plots: dict[str, dict] = field(default_factory=dict)
    seeded: dict[str, frozenset] = field(default_factory=dict)  # ids present before any tool ran, per attribute
    next_id: dict[str, int] = field(default_factory=dict)

    @property
    def user(self) -> dict:
        """The employee the assistant works for ("me" in requests)."""
        return self.employees[0]

    def new_id(self, table: str) -> str:
        n = self.next_id.get(table, 0)
        self.next_id[table] = n + 1
        return f"{n:08d}"


# ---- seeding -------------------------------------------------------------------------------


def build_office(seed: int = 0) -> Office:
    """A fresh office, the same for the same seed (seeded once, then copied)."""
    return copy.deepcopy(_seeded(int(seed)))


@lru_cache(maxsize=64)
def _seeded(seed: int) -> Office:
    rng = random.Random(f"office-{seed}")
    employees = []
    for first, last in zip(rng.sample(FIRST, 12), rng.choices(LAST, k=12)):
        dept, title = rng.choice(DEPARTMENTS)
        employees.append(
            {
                "name": f"{first} {last}",
                "email": f"{first}.{last}@{COMPANY_DOMAIN}".lower(),
                "department": dept,
                "title": title,
            }
        )
    staff = [e["email"] for e in employees[1:]]
    office = Office(employees=employees, emails={}, events={}, tasks={}, customers={}, visits=[])

    task_names = rng.sample([f"{v} {o}" for v in TASK_VERBS for o in TASK_OBJECTS], 24)
    for name in task_names:
        tid = office.new_id("tasks")
        due = date(2023, 11, 1) + timedelta(days=rng.randrange(75))
        office.tasks[tid] = {
            "task_id": tid,
            "task_name": name,
            "assigned_to_email": rng.choice(staff),
            "list_name": rng.choice(LISTS),
            "due_date": due.isoformat(),
            "board": rng.choice(BOARDS),
        }

    pairs = rng.sample([(t, p) for t in EVENT_TOPICS for p in staff], 28)
    for topic, person in pairs:
        eid = office.new_id("events")
        day = date(2023, 11, 20) + timedelta(days=rng.randrange(40))
        while day.weekday() >= 5:
            day += timedelta(days=1)
        duration = rng.choice([30, 30, 60, 60, 90])
        start = rng.randrange(DAY_START, DAY_END - duration + 1, 30)
        office.events[eid] = {
            "event_id": eid,
            "event_name": topic,
            "participant_email": person,
            "event_start": f"{day.isoformat()} {start // 60:02d}:{start % 60:02d}:00",
            "duration": str(duration),
        }

    names = rng.sample([f"{f} {last}" for f in CUSTOMER_FIRST for last in CUSTOMER_LAST], 24)
    for name in names:
        cid = office.new_id("customers")
        first, last = name.split()
        contact = date(2023, 9, 1) + timedelta(days=rng.randrange(90))
        office.customers[cid] = {
            "customer_id": cid,
            "customer_name": name,
            "assigned_to_email": rng.choice(staff),
            "customer_email": f"{first}.{last}@example.com".lower(),
            "customer_phone": f"{rng.randrange(200, 999)}-555-{rng.randrange(1000, 9999)}",
            "last_contact_date": contact.isoformat(),
            "product_interest": rng.choice(PRODUCTS),
            "status": rng.choice(STATUSES),
            "notes": "",
            "follow_up_by": (contact + timedelta(days=30)).isoformat(),
        }

    subjects: set[str] = set()
    events = list(office.events.values())
    customers = [c["customer_name"] for c in office.customers.values()]
    while len(subjects) < 30:
        subjects.add(
            rng.choice(EMAIL_TOPICS).format(
                task=rng.choice(task_names), event=rng.choice(events)["event_name"], customer=rng.choice(customers)
            )
        )
    # sorted first: a set iterates in hash order, which changes from process to process
    for i, subject in enumerate(sorted(sorted(subjects), key=lambda s: rng.random())):
        mid = office.new_id("emails")
        sent = datetime(2023, 11, 1, 8) + timedelta(minutes=rng.randrange(29 * 24 * 60))
        office.emails[mid] = {
            "email_id": mid,
            "inbox/outbox": "inbox" if i < 22 else "outbox",
            "sender/recipient": rng.choice(staff),
            "subject": subject,
            "sent_datetime": sent.strftime("%Y-%m-%d %H:%M:%S"),
            "body": rng.choice(EMAIL_BODIES),
        }

    day = date(2023, 10, 1)
    while day <= NOW.date():
        for _ in range(rng.randrange(1, 5)):
            office.visits.append(
                {
                    "date_of_visit": day.isoformat(),
                    "visitor_id": f"{rng.randrange(16**6):06x}",
                    "page_views": rng.randrange(1, 12),
                    "session_duration_seconds": rng.randrange(10, 900),
                    "traffic_source": rng.choice(TRAFFIC_SOURCES),
                    "user_engaged": rng.random() < 0.4,
                }
            )
        day += timedelta(days=1)
    office.seeded = {attr: frozenset(getattr(office, attr)) for attr, _ in TABLES.values()}
    return office


def snapshot(office: Office) -> dict[str, Counter]:
    """Each mutable table as a multiset of normalised rows; created records lose their (order-dependent) id."""
    out = {}
    for domain, (attr, id_field) in TABLES.items():
        rows = Counter()
        for key, record in getattr(office, attr).items():
            items = []
            for k, v in sorted(record.items()):
                if k == id_field and key not in office.seeded.get(attr, ()):
                    v = "<created>"
                elif isinstance(v, str) and k not in CASE_KEPT:
                    v = " ".join(v.lower().split())
                items.append((k, v))
            rows[tuple(items)] += 1
        out[domain] = rows
    return out
