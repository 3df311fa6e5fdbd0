"""What the dashboard's routes get through `Depends`, and the lifespan that builds it.

The lifespan opens the Redis client at startup and closes it at shutdown (a client the caller
passed to `create_app` stays the caller's to close); it hands the routes, through the lifespan
state, the settings, a `Reader` over that client and the `Pages` renderer, so no route closes
over anything and the app holds no client before it starts. `authorise` guards the write
actions: the dashboard token, and a CSRF token in the form that must match the cookie `Pages`
set (double submit), both compared in constant time.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Optional, TypeVar

import redis
from fastapi import Depends, FastAPI, Form, HTTPException, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from farm.connection import connect_sync
from farm.keys import text
from farm.settings import Settings
from farm.transport import errors, redact

HERE = Path(__file__).parent
CSRF_COOKIE = "farm_csrf"
T = TypeVar("T")


@dataclass(frozen=True)
class Reader:
    """Calls `fn(client, keys, ...)` against the farm's Redis, its errors mapped to TransportError."""

    client: redis.Redis
    settings: Settings

    def __call__(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        with errors(self.settings.redis_url):
            return fn(self.client, self.settings.keys, *args, **kwargs)

    def agent(self, name: str) -> str:
        """`name` if the namespace knows that agent (it has had tasks or workers), else a 404 that
        names the agents it knows: an unknown name is a typo, not an agent with nothing yet."""
        known = sorted(text(a) for a in self(lambda r, k: r.smembers(k.agents())))
        if name not in known:
            raise HTTPException(
                404,
                f"no agent {name!r} in namespace {self.settings.namespace!r}; "
                f"known: {', '.join(known) if known else 'none yet'}",
            )
        return name


@dataclass(frozen=True)
class Pages:
    """Renders a page (Jinja2, autoescaped) and gives the browser its CSRF cookie."""

    templates: Jinja2Templates
    where: str
    writes: bool

    @classmethod
    def of(cls, settings: Settings) -> Pages:
        where = f"Redis {redact(settings.redis_url)}, namespace {settings.namespace!r}"
        return cls(Jinja2Templates(directory=HERE / "templates"), where, settings.dashboard_token is not None)

    def __call__(self, request: Request, name: str, **context: Any) -> HTMLResponse:
        csrf = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(24)
        resp = self.templates.TemplateResponse(
            request, name, {"where": self.where, "csrf": csrf, "writes": self.writes, **context}
        )
        resp.set_cookie(CSRF_COOKIE, csrf, httponly=True, samesite="strict")
        return resp


@asynccontextmanager
async def lifespan(settings: Settings, lent: Optional[redis.Redis], app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    """The app's resources from startup to shutdown (bind the first two with functools.partial)."""
    client = lent if lent is not None else connect_sync(settings)
    try:
        yield {"settings": settings, "reader": Reader(client, settings), "pages": Pages.of(settings)}
    finally:
        if lent is None:
            client.close()


def get_settings(request: Request) -> Settings:
    return request.state.settings


def get_reader(request: Request) -> Reader:
    return request.state.reader


def get_pages(request: Request) -> Pages:
    return request.state.pages


Config = Annotated[Settings, Depends(get_settings)]
Read = Annotated[Reader, Depends(get_reader)]
Page = Annotated[Pages, Depends(get_pages)]


def authorise(
    request: Request, settings: Config, csrf: Annotated[str, Form()] = "", token: Annotated[str, Form()] = ""
) -> None:
    """A write action's check: writes enabled, the form from this dashboard, the right token."""
    if settings.dashboard_token is None:
        raise HTTPException(403, "write actions are disabled: set dashboard_token (FARM_DASHBOARD_TOKEN)")
    cookie = request.cookies.get(CSRF_COOKIE, "")
    if not cookie or not hmac.compare_digest(cookie, csrf):
        raise HTTPException(403, "the form is stale or not from this dashboard (CSRF check): reload the page")
    if not hmac.compare_digest(token.encode(), settings.dashboard_token.encode()):
        raise HTTPException(403, "wrong dashboard token")
