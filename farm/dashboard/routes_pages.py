"""The dashboard's HTML pages: overview, an agent's charts, workers, sampled rollouts, dead letters.

All of them read only; the dead-letter pages carry the forms that post to farm.dashboard.routes_actions.
"""

from __future__ import annotations

import json
import time

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse

from farm import deadletters
from farm.dashboard import data
from farm.dashboard.charts import line_chart
from farm.dashboard.deps import Config, Page, Read

router = APIRouter(default_response_class=HTMLResponse)


@router.get("/")
def overview_page(request: Request, read: Read, page: Page) -> HTMLResponse:
    return page(request, "overview.html", view=read(data.overview))


@router.get("/agents/{agent}")
def agent_page(
    request: Request, agent: str, read: Read, page: Page, settings: Config, minutes: int = 180
) -> HTMLResponse:
    minutes = max(5, min(minutes, settings.history_ttl_s // 60))
    pts = read(data.series, read.agent(agent), minutes)["points"]
    mins = [p["minute"] for p in pts]
    kinds = sorted({k for p in pts for k in p["failures_by_kind"]})
    charts = [
        line_chart("rollouts per minute", mins, {k: [p[k] for p in pts] for k in ("done", "failed", "cancelled")}),
        line_chart("failures by kind", mins, {k: [p["failures_by_kind"].get(k, 0) for p in pts] for k in kinds}),
        line_chart(
            "reward", mins, {"mean": [p["mean_reward"] for p in pts], "pass rate": [p["pass_rate"] for p in pts]}
        ),
        line_chart(
            "latency (s, estimated from bins)",
            mins,
            {"p50": [p["latency_p50_s"] for p in pts], "p99": [p["latency_p99_s"] for p in pts]},
        ),
        line_chart("queue depth", mins, {"tasks": [p["depth"] for p in pts]}),
    ]
    return page(request, "agent.html", agent=agent, minutes=minutes, charts=charts)


@router.get("/workers")
def workers_page(request: Request, read: Read, page: Page) -> HTMLResponse:
    return page(request, "workers.html", workers=read(data.workers), now=time.time())


@router.get("/rollouts/{agent}")
def rollouts_page(request: Request, agent: str, read: Read, page: Page, settings: Config) -> HTMLResponse:
    found = read(data.rollouts, read.agent(agent), max_entry_bytes=settings.max_entry_bytes)
    return page(request, "rollouts.html", agent=agent, rollouts=found)


@router.get("/rollouts/{agent}/{entry_id}")
def rollout_page(request: Request, agent: str, entry_id: str, read: Read, page: Page, settings: Config) -> HTMLResponse:
    found = read(data.rollout, read.agent(agent), entry_id, max_entry_bytes=settings.max_entry_bytes)
    if found is None:
        raise HTTPException(404, f"no sampled rollout {entry_id} for {agent}")
    return page(request, "rollout.html", agent=agent, r=found)


@router.get("/dead/{agent}")
def dead_page(request: Request, agent: str, read: Read, page: Page, settings: Config, done: str = "") -> HTMLResponse:
    letters = read(deadletters.list_dead, read.agent(agent), 100, max_entry_bytes=settings.max_entry_bytes)
    total = read(deadletters.count_dead, agent)
    dropped = int(read(lambda r, k: r.hget(k.stats(agent), "dead_dropped")) or 0)
    return page(request, "dead.html", agent=agent, letters=letters, total=total, dropped=dropped, done=done)


@router.get("/dead/{agent}/{letter_id}")
def letter_page(request: Request, agent: str, letter_id: str, read: Read, page: Page, settings: Config) -> HTMLResponse:
    letter = read(deadletters.show_dead, read.agent(agent), letter_id, max_entry_bytes=settings.max_entry_bytes)
    if letter is None:
        raise HTTPException(404, f"no dead letter {letter_id} for {agent}")
    task = json.dumps(letter.get("task"), indent=2, default=str)
    return page(request, "letter.html", agent=agent, x=letter, task=task)
