"""The runs: a page per run (collections, evaluations, trainings)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter(default_response_class=HTMLResponse)
