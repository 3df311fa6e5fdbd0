"""The dashboard's HTML pages: the overview, the workers, one sampled rollout, one dead letter.

An agent's charts are in routes_agent, the lists of rollouts and dead letters (and finding them) in
routes_find, the runs in routes_runs.

All of them read only; the dead-letter pages carry the forms that post to farm.dashboard.routes_actions.
"""

from __future__ import annotations

import json
import time

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse

from farm import deadletters
from farm.dashboard import data
from farm.dashboard.deps import Config, Page, Read

router = APIRouter(default_response_class=HTMLResponse)


@router.get("/")
def overview_page(request: Request, read: Read, page: Page) -> HTMLResponse:
    return page(request, "overview.html", view=read(data.overview))


@router.get("/workers")
def workers_page(request: Request, read: Read, page: Page) -> HTMLResponse:
    return page(request, "workers.html", workers=read(data.workers), now=time.time())


@router.get("/rollouts/{agent}/{entry_id}")
def rollout_page(request: Request, agent: str, entry_id: str, read: Read, page: Page, settings: Config) -> HTMLResponse:
    found = read(data.rollout, read.agent(agent), entry_id, max_entry_bytes=settings.max_entry_bytes)
    if found is None:
        raise HTTPException(404, f"no sampled rollout {entry_id} for {agent}")
    return page(request, "rollout.html", agent=agent, r=found)


@router.get("/dead/{agent}/{letter_id}")
def letter_page(request: Request, agent: str, letter_id: str, read: Read, page: Page, settings: Config) -> HTMLResponse:
    letter = read(deadletters.show_dead, read.agent(agent), letter_id, max_entry_bytes=settings.max_entry_bytes)
    if letter is None:
        raise HTTPException(404, f"no dead letter {letter_id} for {agent}")
    task = json.dumps(letter.get("task"), indent=2, default=str)
    return page(request, "letter.html", agent=agent, x=letter, task=task)
