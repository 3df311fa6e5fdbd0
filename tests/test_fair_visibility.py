"""Fair share made visible: `farm status` (its table and --json), the dashboard (its JSON and its
page) and /metrics show each run's tasks queued, in flight, share, cap and rollouts per minute,
and the agent's queued counts what no worker has taken yet (the runs' queues plus the stream's lag).

Two runs with shares 3 and 1 are submitted through FarmClient.submit; a real worker (the noop agent,
in this process) takes their tasks and settles them through Redis.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
import redis
from fastapi.testclient import TestClient
from helpers import ROOT
from helpers.waiting import async_wait_for
from helpers.workers import in_process_worker, worker_env
from prometheus_client.parser import text_string_to_metric_families

from farm import history, status
from farm.client import FarmClient
from farm.dashboard import data
from farm.dashboard.app import create_app

HOSTILE = "<img src=x onerror=alert(1)>"
NO_RATES = {"done_per_min": 0.0, "failed_per_min": 0.0, "cancelled_per_min": 0.0}


def tasks(client: FarmClient, run: str, n: int, **spec) -> list:
    return [client.task(run_id=run, agent="noop", row={"noop": spec, "i": i}) for i in range(n)]


def farm_status(settings, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "farm", "status", *args],
        cwd=ROOT,
        env=worker_env(settings),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def runs_of(agent_row: dict) -> dict[str, dict]:
    return {x["run_id"]: x for x in agent_row["runs"]}


def samples(text: str, name: str) -> dict[tuple, float]:
    family = next(f for f in text_string_to_metric_families(text) if f.name == name)
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples}


@pytest.mark.slow
async def test_status_shows_each_runs_queue_share_and_cap_and_the_agents_queued_counts_them_all(settings, sync_redis):
    client = FarmClient(settings)
    await client.submit(tasks(client, "train", 30), share=3)
    await client.submit(tasks(client, "eval", 20), share=1, max_in_flight=5)
    await client.aclose()

    noop = json.loads(farm_status(settings, "--json"))["agents"]["noop"]
    # No worker: the first submit moved one task into the stream for a worker to read; the rest wait
    # in the runs' queues (the backlog). Queued is all 50: none has been taken by a worker.
    assert (noop["queued"], noop["backlog"], noop["lag"], noop["pending"]) == (50, 49, 1, 0)
    assert noop["backlog"] == sync_redis.llen(settings.keys.backlog("noop"))
    runs = runs_of(noop)
    assert runs["train"] == {
        "run_id": "train",
        "queued": 29,
        "in_flight": 1,
        "share": 3.0,
        "cap": 0,
        **NO_RATES,
    }
    assert runs["eval"] == {"run_id": "eval", "queued": 20, "in_flight": 0, "share": 1.0, "cap": 5, **NO_RATES}

    table = farm_status(settings)
    lines = table.splitlines()
    assert max(len(line) for line in lines) <= 80, table
    agent_row = next(line for line in lines if line.startswith("noop"))
    assert agent_row.split()[1:4] == ["50", "0", "1"], agent_row  # queued, pending, lag
    assert any(line.startswith("runs on noop") for line in lines), table
    rows = {line.split()[0]: line.split()[1:] for line in lines if line.startswith(("train", "eval"))}
    assert rows == {"train": ["3", "-", "29", "1", "0.0"], "eval": ["1", "5", "20", "0", "0.0"]}, table


@pytest.mark.timeout(90)
async def test_a_real_workers_slots_split_by_share_show_on_the_dashboard_and_in_metrics(settings):
    """Concurrency 8 and shares 3:1: 6 of train's tasks in flight and 2 of eval's, on the overview's
    JSON, on its page and in /metrics, all from one steady moment (tasks of 2 s)."""
    client = FarmClient(settings)
    train, evals = tasks(client, "train", 24, sleep_s=2.0), tasks(client, "eval", 8, sleep_s=2.0)
    await client.submit(train, share=3)
    await client.submit(evals, share=1)
    r = redis.Redis.from_url(settings.redis_url)
    with TestClient(create_app(settings, r)) as web:
        async with in_process_worker(settings, concurrency=8):

            def split():
                noop = web.get("/api/overview").json()["agents"]["noop"]
                flights = {run: x["in_flight"] for run, x in runs_of(noop).items()}
                return noop if noop["in_flight"] == 8 and flights == {"train": 6, "eval": 2} else None

            noop = await async_wait_for(split, timeout=15, what="8 tasks in flight, 6 of train and 2 of eval")
            page = web.get("/").text
            metrics = web.get("/metrics").text
            got = await client.collect(train + evals, timeout_s=60)
    await client.aclose()
    r.close()
    assert len(got) == 32 and all(x.ok for x in got.values())

    runs = runs_of(noop)
    assert (runs["train"]["share"], runs["eval"]["share"]) == (3.0, 1.0)
    assert runs["train"]["queued"] + runs["eval"]["queued"] == noop["backlog"] > 0
    assert noop["queued"] == noop["backlog"] + noop["lag"]
    # a wave of 8 at a time, 6:2: train's and eval's queues shrink together
    assert (runs["train"]["queued"], runs["eval"]["queued"]) in {(18, 6), (12, 4), (6, 2)}, runs

    for run, x in runs.items():
        row = page.split(f'<tr data-agent="noop" data-run="{run}">')[1].split("</tr>")[0]
        assert f'<td data-k="in_flight">{x["in_flight"]}</td>' in row, row
        assert f'<td data-k="queued">{x["queued"]}</td>' in row, row
        assert f'<td data-k="share">{x["share"]:g}</td>' in row, row

    def by_run(name: str) -> dict[str, float]:
        return {dict(k)["run"]: v for k, v in samples(metrics, name).items() if dict(k)["agent"] == "noop"}

    assert by_run("farm_run_in_flight") == {"train": 6.0, "eval": 2.0}
    assert by_run("farm_run_share") == {"train": 3.0, "eval": 1.0}
    assert by_run("farm_run_queued") == {run: float(x["queued"]) for run, x in runs.items()}
    assert samples(metrics, "farm_backlog")[(("agent", "noop"),)] == noop["backlog"]
    assert samples(metrics, "farm_queue_depth")[(("agent", "noop"),)] == noop["queued"]


@pytest.mark.timeout(90)
@pytest.mark.slow
async def test_done_per_minute_per_run_after_a_real_worker_settles(settings, sync_redis):
    """12 rollouts of train and 4 of eval (and one failure of eval) settled by a real worker, then
    more tasks queued with no worker: each run's done per minute is its own count over the window
    (status: the last one to two minutes; the dashboard and /metrics: its 5 minutes)."""
    client = FarmClient(settings)
    train, evals = tasks(client, "train", 12), tasks(client, "eval", 4) + tasks(client, "eval", 1, fail="fatal")
    async with in_process_worker(settings, concurrency=4):
        await client.submit(train, share=3)
        await client.submit(evals)
        got = await client.collect(train + evals, timeout_s=30)
    assert sum(x.ok for x in got.values()) == 16
    await client.submit(tasks(client, "train", 2), share=3)  # no worker now: the runs wait, and show
    await client.submit(tasks(client, "eval", 3))
    await client.aclose()

    now = time.time()
    runs = runs_of(status.collect_status(sync_redis, settings.keys, now=now)["agents"]["noop"])
    _, span = history.window(now, history.RUN_WINDOW_MINUTES)
    assert runs["train"]["done_per_min"] == pytest.approx(12 / span)
    assert runs["eval"]["done_per_min"] == pytest.approx(4 / span)
    assert (runs["train"]["queued"], runs["train"]["in_flight"], runs["eval"]["queued"]) == (1, 1, 3)

    dash = runs_of(data.overview(sync_redis, settings.keys, now=now)["agents"]["noop"])
    _, span5 = history.window(now, data.OVERVIEW_MINUTES)
    assert dash["train"]["done_per_min"] == pytest.approx(12 / span5)
    assert dash["eval"]["done_per_min"] == pytest.approx(4 / span5)
    assert (dash["train"]["failed_per_min"], dash["eval"]["failed_per_min"]) == (0.0, pytest.approx(1 / span5))

    # In their own processes and moments: the same counts over the same windows, so train's rate
    # is three times eval's (a rate per agent, or one run's counted for both, is not).
    shown = {
        x["run_id"]: x["done_per_min"] for x in json.loads(farm_status(settings, "--json"))["agents"]["noop"]["runs"]
    }
    assert shown["train"] == pytest.approx(3 * shown["eval"]) and 12 / 2 <= shown["train"] <= 12
    with TestClient(create_app(settings, sync_redis)) as web:
        scraped = samples(web.get("/metrics").text, "farm_run_rollouts_per_minute")
        table = web.get("/").text
    train_rate = scraped[(("agent", "noop"), ("run", "train"))]
    assert train_rate == pytest.approx(3 * scraped[(("agent", "noop"), ("run", "eval"))]) and train_rate > 0
    shown_on_page = {}
    for run in ("train", "eval"):
        row = table.split(f'<tr data-agent="noop" data-run="{run}">')[1].split("</tr>")[0]
        shown_on_page[run] = float(re.search(r'<td data-k="done_per_min">([0-9.]+)</td>', row).group(1))
    # 12 and 4 over the page's own 4 to 5 minutes, to one decimal
    assert 2.4 <= shown_on_page["train"] <= 3.0 and 0.8 <= shown_on_page["eval"] <= 1.0, shown_on_page


@pytest.mark.slow
async def test_a_run_id_written_by_hand_is_shown_as_text(settings, sync_redis):
    """Run ids come from Redis: one that is not a plain name (written there by something else) is
    escaped on the page, plain text in `farm status`, a label value in /metrics, and breaks nothing."""
    client = FarmClient(settings)
    await client.submit(tasks(client, "ok", 2))
    await client.aclose()
    sync_redis.hset(settings.keys.runs("noop"), mapping={f"flight:{HOSTILE}": 1, f"share:{HOSTILE}": 2})
    with TestClient(create_app(settings, sync_redis)) as web:
        page = web.get("/").text
        metrics = web.get("/metrics").text
        api = web.get("/api/overview").json()
    assert HOSTILE not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert runs_of(api["agents"]["noop"])[HOSTILE]["in_flight"] == 1
    assert samples(metrics, "farm_run_share")[(("agent", "noop"), ("run", HOSTILE))] == 2.0
    table = farm_status(settings)
    assert HOSTILE in table and runs_of(json.loads(farm_status(settings, "--json"))["agents"]["noop"])["ok"]
