"""Lists of an agent's sampled rollouts and dead letters."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from farm import deadletters
from farm.dashboard import data
from farm.dashboard.deps import Config, Page, Read

router = APIRouter(default_response_class=HTMLResponse)


@router.get("/rollouts/{agent}")
def rollouts_page(request: Request, agent: str, read: Read, page: Page, settings: Config) -> HTMLResponse:
    found = read(data.rollouts, read.agent(agent), max_entry_bytes=settings.max_entry_bytes)
    return page(request, "rollouts.html", agent=agent, rollouts=found)


@router.get("/dead/{agent}")
def dead_page(request: Request, agent: str, read: Read, page: Page, settings: Config, done: str = "") -> HTMLResponse:
    letters = read(deadletters.list_dead, read.agent(agent), 100, max_entry_bytes=settings.max_entry_bytes)
    total = read(deadletters.count_dead, agent)
    dropped = int(read(lambda r, k: r.hget(k.stats(agent), "dead_dropped")) or 0)
    return page(request, "dead.html", agent=agent, letters=letters, total=total, dropped=dropped, done=done)
