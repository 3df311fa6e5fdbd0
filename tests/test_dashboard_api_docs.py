"""docs/dashboard.md names every JSON API route the dashboard registers (and /healthz, /metrics and
the write routes), each with its query parameters: a route added without its line on the page fails
here. Read from the app itself (FastAPI's own route listing), no server started."""

import re
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the dashboard extra (FastAPI) is not installed")

from fastapi import FastAPI  # noqa: E402
from fastapi.openapi.utils import get_openapi  # noqa: E402

from farm.dashboard.app import create_app  # noqa: E402
from farm.settings import load_settings  # noqa: E402

PAGE = Path(__file__).resolve().parent.parent / "docs" / "dashboard.md"
MACHINE = ("/healthz", "/metrics")


def api_section(page: str) -> str:
    match = re.search(r"^## The JSON API\n(.*?)(?=^## )", page, re.S | re.M)
    assert match, "docs/dashboard.md has no '## The JSON API' section"
    return match.group(1)


def routes(app: FastAPI) -> dict[tuple[str, str], list[str]]:
    """(method, path) of each route the docs must name: /api/..., /healthz, /metrics and every
    write (non-GET) route, with its query and form parameters."""
    spec = get_openapi(title="farm dashboard", version="0", routes=app.routes)
    out = {}
    for path, operations in spec["paths"].items():
        for method, op in operations.items():
            if path.startswith("/api/") or path in MACHINE or method != "get":
                params = [p["name"] for p in op.get("parameters", []) if p["in"] == "query"]
                body = op.get("requestBody", {}).get("content", {})
                for content in body.values():
                    ref = content["schema"].get("$ref", "").rsplit("/", 1)[-1]
                    params += list(spec["components"]["schemas"].get(ref, {}).get("properties", {}))
                out[(method.upper(), path)] = params
    return out


def undocumented(app: FastAPI, page: str) -> list[str]:
    section = api_section(page)
    missing = []
    for (method, path), params in routes(app).items():
        if f"`{method} {path}`" not in section:
            missing.append(f"{method} {path}")
        missing += [f"{method} {path}: parameter {name}" for name in params if f"`{name}" not in section]
    return missing


@pytest.fixture(scope="module")
def app() -> FastAPI:
    return create_app(load_settings(env={}))


def test_every_api_route_and_its_parameters_are_on_the_page(app):
    found = routes(app)
    assert ("GET", "/api/overview") in found and ("GET", "/api/history/{agent}") in found
    assert ("POST", "/dead/{agent}/{action}") in found and "token" in found[("POST", "/dead/{agent}/{action}")]
    assert undocumented(app, PAGE.read_text()) == [], "document these routes in docs/dashboard.md, ## The JSON API"


def test_a_route_missing_from_the_page_is_named(app):
    """Negative control: a route the app gains, and a parameter the page lost."""
    extra = create_app(load_settings(env={}))
    extra.get("/api/unlisted")(lambda since: {})
    page = PAGE.read_text().replace("`minutes`", "minutes")
    assert undocumented(extra, page) == [
        "GET /api/history/{agent}: parameter minutes",
        "GET /api/unlisted",
        "GET /api/unlisted: parameter since",
    ]
