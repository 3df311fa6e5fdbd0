"""An agent's page: its charts over the last hours, from the per-minute history (farm.history),
starting at its first minute with data when that is later (farm.dashboard.data_agent)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from markupsafe import Markup

from farm import history
from farm.dashboard import data_agent
from farm.dashboard.charts import clock, line_chart
from farm.dashboard.deps import Config, Page, Read

router = APIRouter(default_response_class=HTMLResponse)


@router.get("/agents/{agent}")
def agent_page(
    request: Request, agent: str, read: Read, page: Page, settings: Config, minutes: int = 180
) -> HTMLResponse:
    minutes = max(5, min(minutes, settings.history_ttl_s // 60))
    got = read(data_agent.series, read.agent(agent), minutes)
    pts = got["points"]
    mins = [p["minute"] for p in pts]
    now = history.minute(got["now"])
    kinds = sorted({k for p in pts for k in p["failures_by_kind"]})

    def chart(title: str, lines: dict, empty: str = "no data in this window") -> Markup:
        return line_chart(title, mins, lines, now_minute=now, empty=empty)

    charts = [
        chart("rollouts per minute", {k: [p[k] for p in pts] for k in ("done", "failed", "cancelled")}),
        chart(
            "failures by kind",
            {k: [p["failures_by_kind"].get(k, 0) for p in pts] for k in kinds},
            empty="no failures in this window",
        ),
        chart("reward", {"mean": [p["mean_reward"] for p in pts], "pass rate": [p["pass_rate"] for p in pts]}),
        chart(
            "latency (s, estimated from bins)",
            {"p50": [p["latency_p50_s"] for p in pts], "p99": [p["latency_p99_s"] for p in pts]},
        ),
        chart("queue depth (tasks not yet settled)", {"tasks": [p["depth"] for p in pts]}),
    ]
    since = clock(got["start"]) if got["trimmed"] else None
    return page(request, "agent.html", agent=agent, minutes=minutes, since=since, charts=charts)
