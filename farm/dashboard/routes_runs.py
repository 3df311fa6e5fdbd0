"""The runs: a page per run (collections, evaluations, trainings), the list of runs, and a page per worker.

A run's page shows its progress against its tasks submitted, its rates, failures by kind, its share
and backlog per agent, and its learning curve: mean reward and pass rate by policy version, as a
table and a chart (farm.dashboard.data_runs). Run and worker ids are untrusted text: they are
escaped on the pages, quoted in links, and a 404 does not repeat them.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse

from farm.dashboard import data_runs
from farm.dashboard.charts import line_chart
from farm.dashboard.deps import Config, Page, Read
from farm.settings import Settings

router = APIRouter(default_response_class=HTMLResponse)


def window_minutes(settings: Settings) -> int:
    """The runs' window: the history the workers keep (history_ttl_s)."""
    return max(data_runs.RATE_MINUTES, int(settings.history_ttl_s // 60))


@router.get("/runs")
def runs_page(request: Request, read: Read, page: Page, settings: Config) -> HTMLResponse:
    view = read(data_runs.runs, window_minutes(settings))
    return page(request, "runs.html", view=view, now=time.time())


@router.get("/runs/{run_id:path}")
def run_page(request: Request, run_id: str, read: Read, page: Page, settings: Config) -> HTMLResponse:
    window = window_minutes(settings)
    x = read(data_runs.run, run_id, window)
    if x is None:
        raise HTTPException(
            404,
            f"no such run in namespace {settings.namespace!r}: none of its rollouts settled in the last "
            f"{window} minutes and none of its tasks is open (see /runs)",
        )
    versions = [c["version"] for c in x["curve"]]
    minutes = [p["minute"] for p in x["per_minute"]]
    charts = {
        "curve": line_chart(
            "by policy version: mean reward, pass rate",
            versions,
            {"mean reward": [c["mean_reward"] for c in x["curve"]], "pass rate": [c["pass_rate"] for c in x["curve"]]},
            x_label=lambda v: f"v{v}",
            x_unit="by policy version",
        ),
        "rate": line_chart(
            "rollouts per minute", minutes, {k: [p[k] for p in x["per_minute"]] for k in data_runs.OUTCOMES}
        ),
    }
    return page(request, "run.html", x=x, charts=charts, now=time.time())


@router.get("/workers/{worker_id:path}")
def worker_page(request: Request, worker_id: str, read: Read, page: Page, settings: Config) -> HTMLResponse:
    w = read(data_runs.worker, worker_id, max_entry_bytes=settings.max_entry_bytes)
    if w is None:
        raise HTTPException(404, "no live worker by that id: its heartbeat expired or never existed (see /workers)")
    return page(request, "worker.html", w=w, now=time.time())
