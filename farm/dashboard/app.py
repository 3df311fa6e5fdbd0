"""`farm dashboard`: a web UI and a Prometheus endpoint over the farm's Redis (FastAPI).

It reads Redis only, and writes only when a person requeues or purges dead letters. Those
write actions need the dashboard token (`dashboard_token`: FARM_DASHBOARD_TOKEN or
`farm dashboard --token-file`); without one configured they are disabled. They are POST
forms carrying a CSRF token that must match the page's cookie. Pages are rendered by Jinja2
with autoescaping and served with a strict Content-Security-Policy (scripts and styles from
this server only), so model output, tool results and reasons show as text, never as markup.

This module only assembles the app: the lifespan and the dependencies are in
farm.dashboard.deps, the routes in one router per concern (routes_pages, routes_api,
routes_actions, and metrics for /metrics); here are the headers every response carries,
the one-line 503 an unreachable Redis becomes, and errors answered as pages to a browser and as
JSON to everything else.
"""

from __future__ import annotations

from functools import partial
from http import HTTPStatus
from typing import Awaitable, Callable, Optional

import redis
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from farm.dashboard import metrics, routes_actions, routes_agent, routes_api, routes_find, routes_pages, routes_runs
from farm.dashboard.deps import CSRF_COOKIE, HERE, lifespan
from farm.errors import TransportError
from farm.settings import Settings

__all__ = ["CSP", "CSRF_COOKIE", "create_app"]

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)


async def security_headers(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    resp = await call_next(request)
    resp.headers["Content-Security-Policy"] = CSP
    resp.headers["X-Content-Type-Options"] = "nosniff"
    resp.headers["Referrer-Policy"] = "no-referrer"
    return resp


async def redis_down(request: Request, exc: Exception) -> Response:
    """503: a page for a person (its script keeps trying, so the page recovers), one line for the rest."""
    if _for_a_person(request):
        return _answer(request, 503, f"farm dashboard: {exc}")
    return PlainTextResponse(f"farm dashboard: {exc}", status_code=503)


def _for_a_person(request: Request) -> bool:
    """A browser asking for a page (not the JSON API, /metrics or a script): it gets a page back."""
    path = request.url.path
    machine = path.startswith(("/api/", "/metrics", "/healthz", "/static/"))
    return not machine and "text/html" in request.headers.get("accept", "")


def _answer(request: Request, status: int, detail: str, headers: Optional[dict] = None) -> Response:
    if _for_a_person(request):
        page = request.state.pages
        resp = page(request, "error.html", status=status, phrase=HTTPStatus(status).phrase, detail=detail)
        resp.status_code = status
        return resp
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    return _answer(request, exc.status_code, str(exc.detail), getattr(exc, "headers", None))


async def bad_request(request: Request, exc: Exception) -> Response:
    """A query or form value of the wrong type (`?minutes=abc`): 400, naming the field."""
    assert isinstance(exc, RequestValidationError)
    said = "; ".join(f"{'.'.join(str(x) for x in e.get('loc', ())[1:])}: {e.get('msg', '')}" for e in exc.errors())
    return _answer(request, 400, f"bad request: {said}")


def create_app(settings: Settings, r: Optional[redis.Redis] = None) -> FastAPI:
    """The dashboard over `settings`' Redis and namespace (`r`: a client to use, and leave open, instead of its own).

    Its Redis client exists between startup and shutdown (run it under uvicorn, or `with TestClient(app)`).
    """
    app = FastAPI(
        title="farm dashboard", docs_url=None, redoc_url=None, openapi_url=None, lifespan=partial(lifespan, settings, r)
    )
    app.middleware("http")(security_headers)
    app.add_exception_handler(TransportError, redis_down)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, bad_request)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    routers = (routes_pages, routes_agent, routes_find, routes_runs, routes_api, routes_actions, metrics)
    for module in routers:
        app.include_router(module.router)
    return app
