"""The dashboard's two write actions: requeue or purge an agent's dead letters.

POST only, and only past `authorise` (farm.dashboard.deps): the dashboard token and the form's
CSRF token; then a redirect (303) back to the dead-letter page saying how many it moved.
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, Depends, Form, HTTPException
from fastapi.responses import RedirectResponse

from farm import deadletters
from farm.dashboard.deps import Read, authorise

router = APIRouter(dependencies=[Depends(authorise)])


@router.post("/dead/{agent}/{action}")
def dead_action(
    agent: str,
    action: str,
    read: Read,
    ids: list[str] = Form(default=[]),
    every: str = Form("", alias="all"),
) -> RedirectResponse:
    if action not in ("requeue", "purge"):
        raise HTTPException(404, f"no action {action!r}")
    chosen = None if every == "yes" else ids
    n = read(deadletters.requeue if action == "requeue" else deadletters.purge, read.agent(agent), chosen)
    said = f"{'requeued' if action == 'requeue' else 'purged'} {n}"
    return RedirectResponse(f"/dead/{quote(agent)}?done={quote(said)}", status_code=303)
