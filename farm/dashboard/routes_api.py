"""The dashboard's JSON: the overview the pages refresh from, an agent's per-minute history, /healthz."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from farm.dashboard import data, data_agent
from farm.dashboard.deps import Config, Read

router = APIRouter()


@router.get("/api/overview")
def overview_api(read: Read) -> JSONResponse:
    return JSONResponse(read(data.overview))


@router.get("/api/history/{agent}")
def history_api(agent: str, read: Read, settings: Config, minutes: int = 180) -> JSONResponse:
    return JSONResponse(read(data_agent.series, read.agent(agent), max(1, min(minutes, settings.history_ttl_s // 60))))


@router.get("/healthz")
def health(read: Read) -> JSONResponse:
    """200 while Redis answers a PING; 503 (the app's TransportError handler) while it does not."""
    read(lambda r, k: r.ping())
    return JSONResponse({"ok": True})
