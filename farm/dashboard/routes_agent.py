"""An agent's page: its charts over the last hours, from the per-minute history (farm.history)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from farm.dashboard import data
from farm.dashboard.charts import line_chart
from farm.dashboard.deps import Config, Page, Read

router = APIRouter(default_response_class=HTMLResponse)


@router.get("/agents/{agent}")
def agent_page(
    request: Request, agent: str, read: Read, page: Page, settings: Config, minutes: int = 180
) -> HTMLResponse:
    minutes = max(5, min(minutes, settings.history_ttl_s // 60))
    pts = read(data.series, read.agent(agent), minutes)["points"]
    mins = [p["minute"] for p in pts]
    kinds = sorted({k for p in pts for k in p["failures_by_kind"]})
    charts = [
        line_chart("rollouts per minute", mins, {k: [p[k] for p in pts] for k in ("done", "failed", "cancelled")}),
        line_chart("failures by kind", mins, {k: [p["failures_by_kind"].get(k, 0) for p in pts] for k in kinds}),
        line_chart(
            "reward", mins, {"mean": [p["mean_reward"] for p in pts], "pass rate": [p["pass_rate"] for p in pts]}
        ),
        line_chart(
            "latency (s, estimated from bins)",
            mins,
            {"p50": [p["latency_p50_s"] for p in pts], "p99": [p["latency_p99_s"] for p in pts]},
        ),
        line_chart("queue depth", mins, {"tasks": [p["depth"] for p in pts]}),
    ]
    return page(request, "agent.html", agent=agent, minutes=minutes, charts=charts)
