"""Finding things: search by task, run or group id (/find), a task's attempts (/tasks/ID), a group's
rollouts side by side (/groups/ID), and an agent's sampled rollouts and dead letters, filtered and by
page (/rollouts/AGENT, /dead/AGENT). Read only, from farm.dashboard.data_find; a task or group with
nothing kept is a 404 page that says what was searched.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse

from farm.dashboard import data_find
from farm.dashboard.deps import Config, Page, Read

router = APIRouter(default_response_class=HTMLResponse)
PageNo = Annotated[int, Query(alias="page")]


def _filters(status: str, kind: str, run: str, reward_min: str, reward_max: str) -> data_find.Filters:
    try:
        return data_find.Filters.parse(status, kind, run, reward_min, reward_max)
    except ValueError as exc:
        raise HTTPException(400, f"bad filter: {exc}") from None


def _found(resp: HTMLResponse, anything: bool) -> HTMLResponse:
    if not anything:
        resp.status_code = 404
    return resp


@router.get("/find")
def find_page(request: Request, read: Read, page: Page, settings: Config, q: str = "") -> HTMLResponse:
    q = q.strip()
    if len(q) > data_find.MAX_QUERY:
        raise HTTPException(400, f"the search is {len(q):,} characters; ids are shorter than {data_find.MAX_QUERY:,}")
    found = read(data_find.find, q, max_entry_bytes=settings.max_entry_bytes) if q else None
    return page(request, "find.html", q=q, found=found, scan_limit=data_find.SCAN)


@router.get("/tasks/{task_id:path}")
def task_page(request: Request, task_id: str, read: Read, page: Page, settings: Config) -> HTMLResponse:
    found = read(data_find.task, task_id, max_entry_bytes=settings.max_entry_bytes)
    resp = page(request, "task.html", t=found, sample_every=settings.sample_every, scan_limit=data_find.SCAN)
    return _found(resp, bool(found["rollouts"] or found["letters"]))


@router.get("/groups/{group_id:path}")
def group_page(request: Request, group_id: str, read: Read, page: Page, settings: Config) -> HTMLResponse:
    found = read(data_find.group, group_id, max_entry_bytes=settings.max_entry_bytes)
    resp = page(request, "group.html", g=found, sample_every=settings.sample_every, scan_limit=data_find.SCAN)
    return _found(resp, bool(found["rows"]))


@router.get("/rollouts/{agent}")
def rollouts_page(
    request: Request,
    agent: str,
    read: Read,
    page: Page,
    settings: Config,
    status: str = "",
    kind: str = "",
    run: str = "",
    reward_min: str = "",
    reward_max: str = "",
    number: PageNo = 1,
    per_page: int = data_find.PER_PAGE,
) -> HTMLResponse:
    filters = _filters(status, kind, run, reward_min, reward_max)
    number, per_page = data_find.pages(number, per_page)
    found = read(
        data_find.rollout_list,
        read.agent(agent),
        filters,
        number,
        per_page,
        max_entry_bytes=settings.max_entry_bytes,
    )
    return page(
        request,
        "rollouts.html",
        agent=agent,
        found=found,
        f=filters,
        query=filters.query(),
        statuses=data_find.STATUSES,
        kinds=data_find.KINDS,
        scan_limit=data_find.SCAN,
    )


@router.get("/dead/{agent}")
def dead_page(
    request: Request,
    agent: str,
    read: Read,
    page: Page,
    settings: Config,
    done: str = "",
    kind: str = "",
    run: str = "",
    number: PageNo = 1,
    per_page: int = data_find.PER_PAGE,
) -> HTMLResponse:
    filters = _filters("", kind, run, "", "")
    number, per_page = data_find.pages(number, per_page)
    found = read(
        data_find.dead_list, read.agent(agent), filters, number, per_page, max_entry_bytes=settings.max_entry_bytes
    )
    dropped = int(read(lambda r, k: r.hget(k.stats(agent), "dead_dropped")) or 0)
    return page(
        request,
        "dead.html",
        agent=agent,
        found=found,
        letters=found["items"],
        total=found["total"],
        dropped=dropped,
        done=done,
        f=filters,
        query=filters.query(),
        kinds=data_find.KINDS,
        scan_limit=data_find.SCAN,
    )
