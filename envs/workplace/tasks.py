"""workplace_assistant's requests and their ground truth, generated offline from a seeded office.

Each template picks records of the office and writes a request ("Reschedule my 'Budget review'
meeting with Raj to Friday, December 8 at 3pm") together with the calls that carry it out.
Rows follow NeMo Gym's workplace_assistant: the tools as Responses-style function tools,
`ground_truth` as a list of {name, arguments (a JSON string)}, `id`, `category`,
`environment_name`; plus `seed`, the office to build (0 when absent).
"""

from __future__ import annotations

import json
import random
from datetime import date, timedelta
from typing import Callable, Literal, Optional

from envs.workplace.office import (
    BOARDS,
    DAY_END,
    DAY_START,
    LISTS,
    NOW,
    PLOT_TYPES,
    PLOT_VALUES,
    PRODUCTS,
    STATUSES,
    Office,
    build_office,
)
from envs.workplace.replay import replay
from envs.workplace.tools import TOOLS, call

ENV_NAME = "workplace_assistant"
PromptTools = Literal["all", "task"]

SEND_SUBJECTS = ["Project kickoff", "Status update", "Lunch on Friday", "Quarterly goals", "Offsite agenda"]
SEND_BODIES = [
    "Can we meet next week to go over this?",
    "Please send me your notes by Monday.",
    "Thanks for your help on this!",
    "Let me know if you have any questions.",
]
REPLIES = [
    "Thanks for the update - I will get back to you tomorrow.",
    "Sounds good, let's proceed.",
    "Thanks, I'll take a look today.",
    "Can we move this to next week?",
]
NEW_EVENTS = ["Project kickoff", "Onboarding", "Client workshop", "Architecture review", "Planning session"]
NEW_TASKS = [
    "Prepare release notes",
    "Audit access logs",
    "Update style guide",
    "Migrate build pipeline",
    "Write integration tests",
]
NEW_CUSTOMERS = ["Alex Morgan", "Jamie Fox", "Robin Hale", "Taylor Reed", "Charlie Dunn", "Sam Ortiz"]


def system_prompt(office: Office) -> str:
    return (
        f"Today's date is {NOW:%A}, {NOW:%Y-%m-%d} and the current time is {NOW:%H:%M:%S}. Remember the "
        "current date and time when answering queries. Meetings must not start before 9am or end after 6pm. "
        f"You assist {office.user['name']} ({office.user['email']}); carry out requests with the tools."
    )


# ---- requests and their ground truth -------------------------------------------------------
# A template picks records from the office and returns (request, calls, lookups, domain):
# the calls that carry the request out, and the read tools a model needs to find the ids.

Calls = list[tuple[str, dict]]
Template = Callable[[Office, random.Random], Optional[tuple[str, Calls, list[str], str]]]


def _first(office: Office, email: str) -> str:
    return next(e["name"].split()[0] for e in office.employees if e["email"] == email)


def _staff(office: Office, rng: random.Random, k: int = 1, exclude: tuple = ()) -> list[dict]:
    return rng.sample([e for e in office.employees[1:] if e["email"] not in exclude], k)


def _workday(rng: random.Random) -> date:
    while True:
        d = NOW.date() + timedelta(days=rng.randrange(1, 30))
        if d.weekday() < 5:
            return d


def _slot(rng: random.Random, minutes: int) -> int:
    return rng.randrange(DAY_START, DAY_END - minutes + 1, 30)


def _when(d: date, start: int) -> tuple[str, str]:
    """(phrase, stamp) of a day and minute of day: ('Friday, December 8 at 3pm', '2023-12-08 15:00:00')."""
    h, m = divmod(start, 60)
    clock = f"{(h - 1) % 12 + 1}{':%02d' % m if m else ''}{'am' if h < 12 else 'pm'}"
    return f"{d:%A}, {d:%B} {d.day} at {clock}", f"{d.isoformat()} {h:02d}:{m:02d}:00"


def reply_email(o, rng):
    m = rng.choice([m for m in o.emails.values() if m["inbox/outbox"] == "inbox"])
    body = rng.choice(REPLIES)
    return (
        f"Reply to {_first(o, m['sender/recipient'])}'s email about '{m['subject']}' with '{body}'",
        [("email_reply_email", {"email_id": m["email_id"], "body": body})],
        ["email_search_emails"],
        "email",
    )


def forward_email(o, rng):
    m = rng.choice([m for m in o.emails.values() if m["inbox/outbox"] == "inbox"])
    to = _staff(o, rng, exclude=(m["sender/recipient"],))[0]
    return (
        f"Forward the email from {_first(o, m['sender/recipient'])} about '{m['subject']}' to {to['name'].split()[0]}",
        [("email_forward_email", {"email_id": m["email_id"], "recipient": to["email"]})],
        ["email_search_emails", "company_directory_find_email_address"],
        "email",
    )


def delete_email(o, rng):
    m = rng.choice([m for m in o.emails.values() if m["inbox/outbox"] == "inbox"])
    return (
        f"Delete the email from {_first(o, m['sender/recipient'])} about '{m['subject']}'",
        [("email_delete_email", {"email_id": m["email_id"]})],
        ["email_search_emails"],
        "email",
    )


def send_email(o, rng):
    to, subject, body = _staff(o, rng)[0], rng.choice(SEND_SUBJECTS), rng.choice(SEND_BODIES)
    return (
        f"Send an email to {to['name'].split()[0]} with the subject '{subject}' and the body '{body}'",
        [("email_send_email", {"recipient": to["email"], "subject": subject, "body": body})],
        ["company_directory_find_email_address"],
        "email",
    )


def _upcoming(o: Office) -> list[dict]:
    return [e for e in o.events.values() if e["event_start"] > f"{NOW:%Y-%m-%d %H:%M:%S}"]


def reschedule_event(o, rng):
    e = rng.choice(_upcoming(o))
    phrase, stamp = _when(_workday(rng), _slot(rng, int(e["duration"])))
    if stamp == e["event_start"]:
        return None
    return (
        f"Reschedule my '{e['event_name']}' meeting with {_first(o, e['participant_email'])} to {phrase}",
        [("calendar_update_event", {"event_id": e["event_id"], "field": "event_start", "new_value": stamp})],
        ["calendar_search_events"],
        "calendar",
    )


def cancel_event(o, rng):
    e = rng.choice(_upcoming(o))
    return (
        f"Cancel my '{e['event_name']}' meeting with {_first(o, e['participant_email'])}",
        [("calendar_delete_event", {"event_id": e["event_id"]})],
        ["calendar_search_events"],
        "calendar",
    )


def change_duration(o, rng):
    e = rng.choice(_upcoming(o))
    h, m = map(int, e["event_start"][11:16].split(":"))
    options = [d for d in (30, 45, 60, 90, 120) if h * 60 + m + d <= DAY_END and str(d) != e["duration"]]
    if not options:
        return None
    minutes = rng.choice(options)
    return (
        f"Make my '{e['event_name']}' meeting with {_first(o, e['participant_email'])} {minutes} minutes long",
        [("calendar_update_event", {"event_id": e["event_id"], "field": "duration", "new_value": str(minutes)})],
        ["calendar_search_events"],
        "calendar",
    )


def create_event(o, rng):
    who, name, minutes = _staff(o, rng)[0], rng.choice(NEW_EVENTS), rng.choice([30, 60])
    phrase, stamp = _when(_workday(rng), _slot(rng, minutes))
    return (
        f"Schedule a {minutes}-minute meeting called '{name}' with {who['name'].split()[0]} on {phrase}",
        [
            (
                "calendar_create_event",
                {"event_name": name, "participant_email": who["email"], "event_start": stamp, "duration": str(minutes)},
            )
        ],
        ["company_directory_find_email_address"],
        "calendar",
    )


def create_two_events(o, rng):
    a, b = _staff(o, rng, 2)
    name = rng.choice(NEW_EVENTS)
    phrase, stamp = _when(_workday(rng), _slot(rng, 30))
    return (
        f"Set up 30-minute '{name}' meetings on {phrase} with {a['name'].split()[0]} and with "
        f"{b['name'].split()[0]}, one meeting each",
        [
            (
                "calendar_create_event",
                {"event_name": name, "participant_email": p["email"], "event_start": stamp, "duration": "30"},
            )
            for p in (a, b)
        ],
        ["company_directory_find_email_address"],
        "calendar",
    )


def move_task(o, rng):
    t = rng.choice(list(o.tasks.values()))
    target = rng.choice([x for x in LISTS if x != t["list_name"]])
    return (
        f"Move the task '{t['task_name']}' to the '{target}' list",
        [("project_management_update_task", {"task_id": t["task_id"], "field": "list_name", "new_value": target})],
        ["project_management_search_tasks"],
        "project_management",
    )


def reassign_task(o, rng):
    t = rng.choice(list(o.tasks.values()))
    who = _staff(o, rng, exclude=(t["assigned_to_email"],))[0]
    return (
        f"Reassign the task '{t['task_name']}' to {who['name'].split()[0]}",
        [
            (
                "project_management_update_task",
                {"task_id": t["task_id"], "field": "assigned_to_email", "new_value": who["email"]},
            )
        ],
        ["project_management_search_tasks", "company_directory_find_email_address"],
        "project_management",
    )


def push_due_date(o, rng):
    t = rng.choice(list(o.tasks.values()))
    due = (date.fromisoformat(t["due_date"]) + timedelta(days=rng.randrange(3, 15))).isoformat()
    return (
        f"Push the due date of the task '{t['task_name']}' to {due}",
        [("project_management_update_task", {"task_id": t["task_id"], "field": "due_date", "new_value": due})],
        ["project_management_search_tasks"],
        "project_management",
    )


def create_task(o, rng):
    who, name, board, lst = _staff(o, rng)[0], rng.choice(NEW_TASKS), rng.choice(BOARDS), rng.choice(LISTS[:2])
    due = _workday(rng).isoformat()
    return (
        f"Create a task '{name}' for {who['name'].split()[0]} on the {board} board in the '{lst}' list, due {due}",
        [
            (
                "project_management_create_task",
                {
                    "task_name": name,
                    "assigned_to_email": who["email"],
                    "list_name": lst,
                    "due_date": due,
                    "board": board,
                },
            )
        ],
        ["company_directory_find_email_address"],
        "project_management",
    )


def delete_task(o, rng):
    t = rng.choice(list(o.tasks.values()))
    return (
        f"Delete the task '{t['task_name']}'",
        [("project_management_delete_task", {"task_id": t["task_id"]})],
        ["project_management_search_tasks"],
        "project_management",
    )


def move_all_tasks(o, rng):
    groups: dict[tuple, list] = {}
    for t in o.tasks.values():
        groups.setdefault((t["assigned_to_email"], t["board"], t["list_name"]), []).append(t)
    many = [k for k, v in groups.items() if len(v) >= 2 and k[2] != "Completed"]
    if not many:
        return None
    who, board, lst = rng.choice(sorted(many))
    target = LISTS[LISTS.index(lst) + 1]
    return (
        f"Move all of {_first(o, who)}'s tasks on the {board} board from '{lst}' to '{target}'",
        [
            ("project_management_update_task", {"task_id": t["task_id"], "field": "list_name", "new_value": target})
            for t in groups[(who, board, lst)]
        ],
        ["project_management_search_tasks", "company_directory_find_email_address"],
        "project_management",
    )


def reassign_customer(o, rng):
    c = rng.choice(list(o.customers.values()))
    who = _staff(o, rng, exclude=(c["assigned_to_email"],))[0]
    return (
        f"Reassign customer {c['customer_name']} to {who['name'].split()[0]} in the CRM",
        [
            (
                "customer_relationship_manager_update_customer",
                {"customer_id": c["customer_id"], "field": "assigned_to_email", "new_value": who["email"]},
            )
        ],
        ["customer_relationship_manager_search_customers", "company_directory_find_email_address"],
        "customer_relationship_manager",
    )


def customer_status(o, rng):
    c = rng.choice(list(o.customers.values()))
    status = rng.choice([s for s in STATUSES if s != c["status"]])
    return (
        f"Change the status of customer {c['customer_name']} to {status}",
        [
            (
                "customer_relationship_manager_update_customer",
                {"customer_id": c["customer_id"], "field": "status", "new_value": status},
            )
        ],
        ["customer_relationship_manager_search_customers"],
        "customer_relationship_manager",
    )


def add_customer(o, rng):
    name, who, status, product = (
        rng.choice(NEW_CUSTOMERS),
        _staff(o, rng)[0],
        rng.choice(["Lead", "Qualified"]),
        rng.choice(PRODUCTS),
    )
    address = name.lower().replace(" ", ".") + "@example.com"
    return (
        f"Add {name} ({address}) to the CRM as a new {status} customer interested in {product}, assigned to "
        f"{who['name'].split()[0]}",
        [
            (
                "customer_relationship_manager_add_customer",
                {
                    "customer_name": name,
                    "assigned_to_email": who["email"],
                    "status": status,
                    "customer_email": address,
                    "product_interest": product,
                },
            )
        ],
        ["company_directory_find_email_address"],
        "customer_relationship_manager",
    )


def delete_customer(o, rng):
    c = rng.choice(list(o.customers.values()))
    return (
        f"Delete customer {c['customer_name']} from the CRM",
        [("customer_relationship_manager_delete_customer", {"customer_id": c["customer_id"]})],
        ["customer_relationship_manager_search_customers"],
        "customer_relationship_manager",
    )


def reassign_all_customers(o, rng):
    groups: dict[tuple, list] = {}
    for c in o.customers.values():
        groups.setdefault((c["assigned_to_email"], c["status"]), []).append(c)
    many = sorted(k for k, v in groups.items() if len(v) >= 2)
    if not many:
        return None
    owner, status = rng.choice(many)
    who = _staff(o, rng, exclude=(owner,))[0]
    return (
        f"Reassign all of {_first(o, owner)}'s customers with status '{status}' to {who['name'].split()[0]}",
        [
            (
                "customer_relationship_manager_update_customer",
                {"customer_id": c["customer_id"], "field": "assigned_to_email", "new_value": who["email"]},
            )
            for c in groups[(owner, status)]
        ],
        ["customer_relationship_manager_search_customers", "company_directory_find_email_address"],
        "customer_relationship_manager",
    )


def _date_range(rng: random.Random) -> tuple[str, str]:
    start = date(2023, 10, 1) + timedelta(days=rng.randrange(45))
    return start.isoformat(), (start + timedelta(days=rng.randrange(3, 15))).isoformat()


def create_plot(o, rng):
    lo, hi = _date_range(rng)
    value, kind = rng.choice(PLOT_VALUES), rng.choice(PLOT_TYPES)
    return (
        f"Make a {kind} plot of {value} from {lo} to {hi}",
        [("analytics_create_plot", {"time_min": lo, "time_max": hi, "value_to_plot": value, "plot_type": kind})],
        [],
        "analytics",
    )


def email_visit_count(o, rng):
    lo, hi = _date_range(rng)
    who = _staff(o, rng)[0]
    tool, key, label = rng.choice(
        [
            ("analytics_engaged_users_count", "engaged_users", "Engaged users"),
            ("analytics_total_visits_count", "total_visits", "Total visits"),
        ]
    )
    n = call(o, tool, {"time_min": lo, "time_max": hi})[key]
    return (
        f"Email {who['name'].split()[0]} the number of {label.lower()} from {lo} to {hi}, with the subject "
        f"'{label}' and the body '{label}: <the number>'",
        [("email_send_email", {"recipient": who["email"], "subject": label, "body": f"{label}: {n}"})],
        [tool, "company_directory_find_email_address"],
        "analytics",
    )


def email_customer_count(o, rng):
    who, status = _staff(o, rng)[0], rng.choice(STATUSES)
    n = call(o, "analytics_count_records", {"table": "customers", "group_by": "status"}).get(status, 0)
    return (
        f"Email {who['name'].split()[0]} how many CRM customers have the status '{status}', with the subject "
        f"'Customer count' and the body '{status} customers: <the number>'",
        [
            (
                "email_send_email",
                {"recipient": who["email"], "subject": "Customer count", "body": f"{status} customers: {n}"},
            )
        ],
        ["analytics_count_records", "company_directory_find_email_address"],
        "analytics",
    )


TEMPLATES: list[Template] = [
    reply_email,
    forward_email,
    delete_email,
    send_email,
    reschedule_event,
    cancel_event,
    change_duration,
    create_event,
    create_two_events,
    move_task,
    reassign_task,
    push_due_date,
    create_task,
    delete_task,
    move_all_tasks,
    reassign_customer,
    customer_status,
    add_customer,
    delete_customer,
    reassign_all_customers,
    create_plot,
    email_visit_count,
    email_customer_count,
]


def responses_tool(name: str) -> dict:
    return {**TOOLS[name].response_schema(), "strict": False}


def generate(size: int, seed: int = 0, prompt_tools: PromptTools = "all") -> list[dict]:
    """`size` rows, deterministic by seed; every ground truth is checked to replay on its office."""
    rng = random.Random(seed)
    rows = []
    while len(rows) < size:
        office_seed = rng.randrange(2**31)
        office = build_office(office_seed)
        made = rng.choice(TEMPLATES)(office, rng)
        if made is None:
            continue
        request, calls, lookups, domain = made
        replay(office, calls, strict=True)
        names = TOOLS.names() if prompt_tools == "all" else sorted({*lookups, *(n for n, _ in calls)})
        rows.append(
            {
                "responses_create_params": {
                    "input": [
                        {"role": "system", "content": system_prompt(office)},
                        {"role": "user", "content": request},
                    ],
                    "tools": [responses_tool(n) for n in names],
                },
                "agent_ref": {"type": "responses_api_agents", "name": ENV_NAME},
                "ground_truth": [{"name": n, "arguments": json.dumps(a)} for n, a in calls],
                "id": len(rows),
                "category": f"{ENV_NAME}_{domain}",
                "environment_name": ENV_NAME,
                "seed": office_seed,
            }
        )
    return rows
