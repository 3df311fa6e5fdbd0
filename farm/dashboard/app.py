"""`farm dashboard`: a web UI and a Prometheus endpoint over the farm's Redis (FastAPI).

It reads Redis only, and writes only when a person requeues or purges dead letters. Those
write actions need the dashboard token (`dashboard_token`: FARM_DASHBOARD_TOKEN or
`farm dashboard --token-file`); without one configured they are disabled. They are POST
forms carrying a CSRF token that must match the page's cookie. Pages are rendered by Jinja2
with autoescaping and served with a strict Content-Security-Policy (scripts and styles from
this server only), so model output, tool results and reasons show as text, never as markup.
"""

from __future__ import annotations

import hmac
import json
import secrets
import time
from pathlib import Path
from typing import Any, Optional
from urllib.parse import quote

import redis
from fastapi import FastAPI, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from farm import deadletters
from farm.connection import connect_sync
from farm.dashboard import data
from farm.dashboard.charts import line_chart
from farm.dashboard.metrics import registry
from farm.errors import TransportError
from farm.settings import Settings
from farm.transport import errors, redact

HERE = Path(__file__).parent
CSRF_COOKIE = "farm_csrf"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)


def create_app(settings: Settings, r: Optional[redis.Redis] = None) -> FastAPI:
    """The dashboard over `settings`' Redis and namespace (`r`: a client to use instead of a new one)."""
    app = FastAPI(title="farm dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    templates = Jinja2Templates(directory=HERE / "templates")
    client = r or connect_sync(settings)
    keys, where = settings.keys, f"Redis {redact(settings.redis_url)}, namespace {settings.namespace!r}"
    token = settings.dashboard_token

    def read(fn, *args, **kwargs):
        with errors(settings.redis_url):
            return fn(client, keys, *args, **kwargs)

    def page(request: Request, name: str, **context: Any) -> HTMLResponse:
        csrf = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(24)
        resp = templates.TemplateResponse(
            request, name, {"where": where, "csrf": csrf, "writes": token is not None, **context}
        )
        resp.set_cookie(CSRF_COOKIE, csrf, httponly=True, samesite="strict")
        return resp

    @app.middleware("http")
    async def headers(request: Request, call_next):
        resp = await call_next(request)
        resp.headers["Content-Security-Policy"] = CSP
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["Referrer-Policy"] = "no-referrer"
        return resp

    @app.exception_handler(TransportError)
    async def redis_down(request: Request, exc: TransportError):
        return PlainTextResponse(f"farm dashboard: {exc}", status_code=503)

    @app.get("/", response_class=HTMLResponse)
    def overview_page(request: Request):
        return page(request, "overview.html", view=read(data.overview))

    @app.get("/api/overview")
    def overview_api():
        return JSONResponse(read(data.overview))

    @app.get("/agents/{agent}", response_class=HTMLResponse)
    def agent_page(request: Request, agent: str, minutes: int = 180):
        minutes = max(5, min(minutes, settings.history_ttl_s // 60))
        s = read(data.series, agent, minutes)
        pts, mins = s["points"], [p["minute"] for p in s["points"]]
        kinds = sorted({k for p in pts for k in p["failures_by_kind"]})
        charts = [
            line_chart(
                "rollouts per minute", mins, {"done": [p["done"] for p in pts], "failed": [p["failed"] for p in pts]}
            ),
            line_chart("failures by kind", mins, {k: [p["failures_by_kind"].get(k, 0) for p in pts] for k in kinds}),
            line_chart(
                "reward", mins, {"mean": [p["mean_reward"] for p in pts], "pass rate": [p["pass_rate"] for p in pts]}
            ),
            line_chart(
                "latency (s)",
                mins,
                {"p50": [p["latency_p50_s"] for p in pts], "p99": [p["latency_p99_s"] for p in pts]},
            ),
            line_chart("queue depth", mins, {"tasks": [p["depth"] for p in pts]}),
        ]
        return page(request, "agent.html", agent=agent, minutes=minutes, charts=charts)

    @app.get("/api/history/{agent}")
    def history_api(agent: str, minutes: int = 180):
        return JSONResponse(read(data.series, agent, max(1, min(minutes, settings.history_ttl_s // 60))))

    @app.get("/workers", response_class=HTMLResponse)
    def workers_page(request: Request):
        return page(request, "workers.html", workers=read(data.workers), now=time.time())

    @app.get("/rollouts/{agent}", response_class=HTMLResponse)
    def rollouts_page(request: Request, agent: str):
        found = read(data.rollouts, agent, max_entry_bytes=settings.max_entry_bytes)
        return page(request, "rollouts.html", agent=agent, rollouts=found)

    @app.get("/rollouts/{agent}/{entry_id}", response_class=HTMLResponse)
    def rollout_page(request: Request, agent: str, entry_id: str):
        found = read(data.rollout, agent, entry_id, max_entry_bytes=settings.max_entry_bytes)
        if found is None:
            raise HTTPException(404, f"no sampled rollout {entry_id} for {agent}")
        return page(request, "rollout.html", agent=agent, r=found)

    add_dead_letters(app, settings, read, page)

    @app.get("/metrics")
    def metrics():
        return Response(generate_latest(registry(lambda: read(data.overview))), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    def health():
        read(lambda r, k: r.ping())
        return {"ok": True}

    return app


def add_dead_letters(app: FastAPI, settings: Settings, read, page) -> None:
    """The dead-letter browser and its two write actions (token, CSRF cookie, POST only)."""
    token = settings.dashboard_token

    @app.get("/dead/{agent}", response_class=HTMLResponse)
    def dead_page(request: Request, agent: str, done: str = ""):
        letters = read(deadletters.list_dead, agent, 100, max_entry_bytes=settings.max_entry_bytes)
        total = read(deadletters.count_dead, agent)
        dropped = int(read(lambda r, k: r.hget(k.stats(agent), "dead_dropped")) or 0)
        return page(request, "dead.html", agent=agent, letters=letters, total=total, dropped=dropped, done=done)

    @app.get("/dead/{agent}/{letter_id}", response_class=HTMLResponse)
    def letter_page(request: Request, agent: str, letter_id: str):
        letter = read(deadletters.show_dead, agent, letter_id, max_entry_bytes=settings.max_entry_bytes)
        if letter is None:
            raise HTTPException(404, f"no dead letter {letter_id} for {agent}")
        task = json.dumps(letter.get("task"), indent=2, default=str)
        return page(request, "letter.html", agent=agent, x=letter, task=task)

    def authorise(request: Request, csrf: str, given: str) -> None:
        if token is None:
            raise HTTPException(403, "write actions are disabled: set dashboard_token (FARM_DASHBOARD_TOKEN)")
        cookie = request.cookies.get(CSRF_COOKIE, "")
        if not cookie or not hmac.compare_digest(cookie, csrf):
            raise HTTPException(403, "the form is stale or not from this dashboard (CSRF check): reload the page")
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise HTTPException(403, "wrong dashboard token")

    @app.post("/dead/{agent}/{action}")
    def dead_action(
        request: Request,
        agent: str,
        action: str,
        csrf: str = Form(""),
        token_: str = Form("", alias="token"),
        ids: list[str] = Form(default=[]),
        every: str = Form("", alias="all"),
    ):
        authorise(request, csrf, token_)
        if action not in ("requeue", "purge"):
            raise HTTPException(404, f"no action {action!r}")
        chosen = None if every == "yes" else ids
        fn = deadletters.requeue if action == "requeue" else deadletters.purge
        n = read(fn, agent, chosen)
        said = f"{'requeued' if action == 'requeue' else 'purged'} {n}"
        return RedirectResponse(f"/dead/{quote(agent)}?done={quote(said)}", status_code=303)
