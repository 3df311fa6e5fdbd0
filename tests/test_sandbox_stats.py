"""Sandboxes per agent from the live workers' heartbeats (farm/sandbox_stats.py), and `farm status`,
the dashboard's JSON and overview and `/metrics` showing them, read from heartbeats in a real Redis
(the browser and Prometheus see them in test_dashboard_browser.py and test_prometheus.py).

The heartbeats are written here, not by sandboxed workers: a real sandbox needs Docker or root,
and what matters is what the heartbeat holds, which is what the worker's own SandboxStats.snapshot
makes (used here to write it), beside a key with the workers' TTL.
"""

from __future__ import annotations

import json
import math

import pytest
import redis
from fastapi.testclient import TestClient
from helpers.redis import make_settings
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from farm.dashboard.app import create_app
from farm.sandbox_stats import by_agent
from farm.status import collect_status, render_status, run_status
from workers.loops.sandboxes import SandboxStats

HOSTILE = "[b]box[/b]<i>"  # console markup and HTML in a name a heartbeat holds


def snapshot(starting=0, running=0, started=0, start_failed=0, infrastructure=0, start_s=()) -> dict:
    stats = SandboxStats(starting, running, started, start_failed, infrastructure)
    stats.start_s.extend(start_s)
    return stats.snapshot()


def beat(agent: str, worker_id: str, sandboxes: dict | None) -> dict:
    return {"worker_id": worker_id, "agent": agent, "concurrency": 4, "inflight": 1, "done": 0, "failed": 0} | (
        {} if sandboxes is None else {"sandboxes": sandboxes}
    )


def test_counts_sum_and_latency_combines_as_the_docstring_says():
    beats = [
        beat("harbor", "w1", snapshot(1, 3, 10, 2, 1, start_s=[1.0] * 99 + [9.0])),  # p50 1, p99 9
        beat("harbor", "w2", snapshot(0, 2, 5, 0, 0, start_s=[3.0])),  # p50 3, p99 3
        beat("harbor", "w3", snapshot(2, 0, 0, 1, 0)),  # no start yet: no latency
        beat("harbor", "w4", None),  # a worker of the agent without sandboxes
        beat("noop", "w5", None),
    ]
    got = by_agent(beats)
    assert set(got) == {"harbor"}, "only agents whose workers report sandboxes"
    assert got["harbor"] == {
        "workers": 3,
        "starting": 3,
        "running": 5,
        "started": 15,
        "start_failed": 3,
        "infrastructure": 1,
        "start_p50_s": 2.0,  # the median of 1 and 3
        "start_p99_s": 9.0,  # the worst worker's
    }


def test_no_start_yet_is_no_latency_and_a_bad_heartbeat_counts_nothing():
    got = by_agent(
        [
            beat("a", "w1", snapshot(starting=1)),
            beat("a", "w2", {"running": "lots", "started": -4, "start_p50_s": "x", "start_p99_s": float("nan")}),
            beat("b", "w3", "not a dict"),  # a hand-written key
            {"worker_id": "w4", "sandboxes": snapshot(running=1)},  # no agent
        ]
    )
    assert got == {
        "a": {
            "workers": 2,
            "starting": 1,
            "running": 0,
            "started": 0,
            "start_failed": 0,
            "infrastructure": 0,
            "start_p50_s": None,
            "start_p99_s": None,
        }
    }
    assert by_agent([]) == {}


@pytest.fixture
def heartbeats(redis_url, namespace):
    """Three live workers' heartbeats in this test's namespace: two sandboxed agents, one without."""
    settings = make_settings(redis_url, namespace)
    r = redis.Redis.from_url(redis_url)
    for info in (
        beat("harbor", "h1", snapshot(1, 4, 20, 3, 1, start_s=[0.5, 0.7, 2.5])),
        beat("harbor", "h2", snapshot(0, 2, 7, 0, 0, start_s=[0.9])),
        beat(HOSTILE, "x1", snapshot(starting=2)),
        beat("noop", "n1", None),
    ):
        r.set(settings.keys.worker(info["worker_id"]), json.dumps(info), ex=60)
    yield settings, r
    r.close()


def test_farm_status_shows_the_sandboxes_table_within_80_columns(heartbeats):
    settings, r = heartbeats
    status = collect_status(r, settings.keys)
    assert status["sandboxes"]["harbor"] == {
        "workers": 2,
        "starting": 1,
        "running": 6,
        "started": 27,
        "start_failed": 3,
        "infrastructure": 1,
        "start_p50_s": pytest.approx((0.7 + 0.9) / 2),
        "start_p99_s": 2.5,
    }
    assert set(status["sandboxes"]) == {"harbor", HOSTILE}
    console = Console(width=80, record=True)
    render_status(status, console=console)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    table = text.split("sandboxes (")[1].splitlines()
    assert table[1].split() == ["agent", "starting", "running", "started", "failed", "infra", "p50", "s", "p99", "s"]
    rows = {line.split()[0]: line.split()[1:] for line in table[2:] if line.strip()}
    assert rows["harbor"] == ["1", "6", "27", "3", "1", "0.80", "2.50"]
    assert rows[HOSTILE] == ["2", "0", "0", "0", "0", "-", "-"], "the agent's name as text, not console markup"
    assert "noop" not in rows
    assert f"x1      {HOSTILE}" in text, "the workers table shows it as text too"


def test_farm_status_json_has_the_sandboxes_and_no_table_without_them(heartbeats, capsys):
    settings, r = heartbeats
    assert run_status(settings, as_json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sandboxes"]["harbor"]["running"] == 6 and out["sandboxes"]["harbor"]["start_p99_s"] == 2.5
    for worker_id in ("h1", "h2", "x1"):
        r.delete(settings.keys.worker(worker_id))
    assert collect_status(r, settings.keys)["sandboxes"] == {}, "a worker that goes takes its counts"
    console = Console(width=80, record=True)
    render_status(collect_status(r, settings.keys), console=console)
    assert "sandboxes" not in console.export_text()


def test_the_dashboard_json_overview_and_metrics_show_the_sandboxes(heartbeats):
    settings, r = heartbeats
    r.sadd(settings.keys.agents(), "noop")  # an agent with tasks, whose workers run no sandbox
    with TestClient(create_app(settings, r)) as web:
        api = web.get("/api/overview").json()
        page = web.get("/").text
        families = {f.name: f for f in text_string_to_metric_families(web.get("/metrics").text)}
    assert set(api["sandboxes"]) == {"harbor", HOSTILE}
    assert api["sandboxes"]["harbor"]["started"] == 27 and api["sandboxes"]["harbor"]["start_p99_s"] == 2.5
    table = page.split('<table id="sandboxes">')[1].split("</table>")[0]
    assert table.count("<tr data-agent=") == 2 and 'data-agent="noop"' not in table
    harbor = table.split('<tr data-agent="harbor">')[1].split("</tr>")[0]
    for key, shown in {
        "workers": "2",
        "running": "6",
        "start_failed": "3",
        "start_p50_s": "0.80",
        "start_p99_s": "2.50",
    }.items():
        assert f'<td data-k="{key}">{shown}</td>' in harbor, (key, harbor)
    assert '<td class="name">[b]box[/b]&lt;i&gt;</td>' in table and "<i>" not in page

    def samples(name: str) -> dict:
        return {tuple(sorted(s.labels.items())): s.value for s in families[name].samples}

    assert samples("farm_sandboxes")[(("agent", "harbor"), ("state", "running"))] == 6
    assert samples("farm_sandboxes")[(("agent", HOSTILE), ("state", "starting"))] == 2
    assert samples("farm_sandbox_starts")[(("agent", "harbor"),)] == 27
    assert families["farm_sandbox_starts"].type == "counter"
    assert samples("farm_sandbox_start_failures")[(("agent", "harbor"),)] == 3
    assert samples("farm_sandbox_infrastructure_failures")[(("agent", "harbor"),)] == 1
    start = samples("farm_sandbox_start_seconds")
    assert start[(("agent", "harbor"), ("quantile", "0.99"))] == 2.5
    assert math.isnan(start[(("agent", HOSTILE), ("quantile", "0.5"))]), "no start yet"
    assert not any(s.labels.get("agent") == "noop" for f in families.values() for s in f.samples if "sandbox" in f.name)


def test_the_overview_has_no_sandboxes_table_when_no_worker_runs_one(redis_url, namespace):
    settings = make_settings(redis_url, namespace)
    r = redis.Redis.from_url(redis_url)
    r.set(settings.keys.worker("n1"), json.dumps(beat("noop", "n1", None)), ex=60)
    with TestClient(create_app(settings, r)) as web:
        assert web.get("/api/overview").json()["sandboxes"] == {}
        assert 'id="sandboxes"' not in web.get("/").text
        assert "farm_sandbox_starts_total{" not in web.get("/metrics").text
    r.close()
