"""Cancelled rollouts are counted apart wherever the farm shows counts: `farm status`, the dashboard
(overview, history, JSON, /metrics, workers page), the worker's summary line and metrics, and the
producer's aggregates (collect, eval, demo).

A real worker (noop agent) settles rollouts that end done and failed; three more tasks, read by a
consumer of the test's own, are settled as `cancelled` through that worker's Settler (the settle
script and the counters a worker cancelling them would use), so every count below is what Redis
and the worker hold, and every cancelled rollout is read back from its result stream.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
import redis
from fastapi.testclient import TestClient
from helpers.redis import make_settings
from helpers.waiting import async_wait_for
from helpers.workers import in_process_worker
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from farm import history
from farm.client import FarmClient
from farm.connection import connect
from farm.dashboard import data, data_agent
from farm.dashboard.app import create_app
from farm.schema import Rollout, decode_task
from farm.status import run_status
from farm.streams import AgentStream
from farm.transport import Outage
from producer import demo, evaluate, metrics
from producer.output import Journal, Paths, line_for
from workers.delivery.chores import WorkerCollector

LONG = "instruction_following_v2"  # an agent name longer than `farm status` gives it


@pytest.fixture
async def farm(redis_url, namespace, caplog):
    """Rollouts of noop ended done (2), failed (1) and cancelled (3), by one live worker; what the
    worker showed while it was up (heartbeats, the workers page, its summary lines)."""
    settings = make_settings(redis_url, namespace, max_attempts=1, visibility_timeout_s=60, summary_every_s=0.2)
    client = FarmClient(settings)
    r_async = connect(settings)
    mine = AgentStream(r_async, settings.keys, "noop", "canceller", Outage.for_settings(settings))
    await mine.setup()
    doomed = [client.task(run_id="cx", agent="noop", row={"i": i}) for i in range(3)]
    await client.submit(doomed)
    entries = await mine.read(3, 100)  # pending to this consumer: the worker will not take them
    work = [client.task(run_id="cx", agent="noop", row={"noop": spec}) for spec in ({"reward": 1.0}, {"reward": 0.0})]
    work.append(client.task(run_id="cx", agent="noop", row={"noop": {"fail": "fatal"}}))
    r = redis.Redis.from_url(redis_url)
    with caplog.at_level(logging.INFO, logger="farm.worker"):
        async with in_process_worker(settings, concurrency=2) as worker:
            await async_wait_for(lambda: getattr(worker, "settler", None), what="the worker to start")
            for entry_id, fields in entries:
                task = decode_task(fields)
                op = mine.reply_op(entry_id, Rollout.cancelled(task, "a client cancelled it"), task.reply_to)
                assert await worker.settler.run(op) == 1
            await client.submit(work)
            got = await client.collect(work + doomed, timeout_s=60)
            beats = await async_wait_for(
                lambda: [b for b in data.workers(r, settings.keys) if b.get("cancelled") == 3],
                timeout=10,
                what="a heartbeat that counts the cancelled rollouts",
            )
            with TestClient(create_app(settings, r)) as web:
                workers_page = web.get("/workers").text
            await asyncio.sleep(0.5)  # a summary line after the settles
    lines = [x.getMessage() for x in caplog.records if "rollouts/s" in x.getMessage()]
    assert sorted(x.status.value for x in got.values()) == ["cancelled"] * 3 + ["failed", "ok", "ok"]
    await client.aclose()
    await r_async.aclose()
    yield settings, r, worker, got, work + doomed, {"beats": beats, "page": workers_page, "lines": lines}
    r.close()


async def test_farm_status_has_a_cancelled_column_that_fits_80_columns(farm, capsys):
    settings, r, *_ = farm
    r.sadd(settings.keys.agents(), LONG)
    r.hset(settings.keys.stats(LONG), mapping={"done": 4_321, "cancelled": 12})
    assert run_status(settings) == 0
    out = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(out) if line.startswith("agents"))
    header, *rows = out[at + 1 : at + 4]
    columns = ["agent", "queued", "pending", "lag", "delayed", "dead", "done", "failed", "cancelled", "retried"]
    assert header.split() == columns, header
    cells = {row.split()[0]: dict(zip(columns, row.split())) for row in rows}
    assert (cells["noop"]["done"], cells["noop"]["failed"], cells["noop"]["cancelled"]) == ("2", "1", "3")
    long = next(c for name, c in cells.items() if name.startswith("instruction"))
    assert long["cancelled"] == "12" and long["done"] == "4,321"
    assert all(len(line) <= 80 for line in out[at:]), out


async def test_the_dashboard_counts_cancelled_apart_from_done_and_failed(farm):
    settings, r, *_ = farm
    stats = {k.decode(): int(v) for k, v in r.hgetall(settings.keys.stats("noop")).items()}
    assert (stats["done"], stats["failed"], stats["cancelled"]) == (2, 1, 3)
    now = time.time()
    noop = data.overview(r, settings.keys, now=now)["agents"]["noop"]
    _, span = history.window(now, data.OVERVIEW_MINUTES)
    assert noop["cancelled_per_min"] == pytest.approx(3 / span)
    assert noop["done_per_min"] == pytest.approx(2 / span) and noop["failed_per_min"] == pytest.approx(1 / span)
    assert noop["failure_rate"] == pytest.approx(1 / 3), "a cancel is not a failure"
    assert noop["counters"]["cancelled"] == 3
    points = data_agent.series(r, settings.keys, "noop", 5)["points"]
    assert sum(p["cancelled"] for p in points) == 3 and sum(p["failed"] for p in points) == 1

    with TestClient(create_app(settings, r)) as web:
        api = web.get("/api/overview").json()["agents"]["noop"]
        assert api["cancelled_per_min"] > 0 and api["counters"]["cancelled"] == 3
        hist = web.get("/api/history/noop?minutes=5").json()["points"]
        assert sum(p["cancelled"] for p in hist) == 3
        home = web.get("/").text
        assert "<th>cancelled/<wbr>min</th>" in home
        shown = float(home.split('data-k="cancelled_per_min">')[1].split("<")[0])
        assert shown == pytest.approx(3 / span, abs=0.1)
        assert ">cancelled</text>" in web.get("/agents/noop").text, "the rollouts-per-minute chart's legend"

        families = {f.name: f for f in text_string_to_metric_families(web.get("/metrics").text)}
        rollouts = families["farm_rollouts"]
        assert "cancelled" in rollouts.documentation
        by_status = {(s.labels["agent"], s.labels["status"]): s.value for s in rollouts.samples}
        assert by_status[("noop", "cancelled")] == 3.0 and by_status[("noop", "failed")] == 1.0
        rate = {s.labels["agent"]: s.value for s in families["farm_cancelled_per_minute"].samples}
        assert rate["noop"] == pytest.approx(3 / span, rel=0.05)


async def test_the_worker_shows_its_cancelled_count(farm):
    settings, r, worker, got, tasks, live = farm
    assert worker.counters["cancelled"] == 3 and worker.counters["done"] == 2
    assert live["beats"][0]["cancelled"] == 3
    assert "<th>cancelled</th>" in live["page"]
    cells = live["page"].split("<td>noop</td>")[1].split("</tr>")[0]
    assert "<td>2</td><td>1</td><td>3</td><td>0</td>" in cells, cells  # done, failed, cancelled, dead
    assert any("done 2, failed 1, cancelled 3, dead 0" in line for line in live["lines"]), live["lines"]

    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(worker))
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    outcomes = {s.labels["outcome"]: s.value for s in families["farm_worker_tasks"].samples}
    assert (outcomes["done"], outcomes["failed"], outcomes["cancelled"]) == (2.0, 1.0, 3.0)


def write_collection(got: dict, tasks: list, tmp_path) -> Paths:
    """The rollouts as `farm collect` writes them (answered to the output, the others to the
    failures sidecar), two repeats a row: row 0 passes, row 1 was all cancelled, row 2 fails."""
    done, zero, failed, *cancelled = tasks  # rewards 1.0 and 0.0, a failure, three cancels
    rows = [(done, 0, 0), (cancelled[0], 0, 1), (cancelled[1], 1, 0), (cancelled[2], 1, 1), (zero, 2, 0)]
    rows.append((failed, 2, 1))
    paths = Paths.for_output(tmp_path / "out.jsonl")
    output, failures = Journal(paths.journal), Journal(paths.failures)
    for i, (task, row, rep) in enumerate(rows):
        rollout = got[task.task_id]
        line = line_for(task, rollout, row_index=row, repeat_index=rep, num_repeats=2, line=i, submitted_at=1.0)
        (output if rollout.ok else failures).write([line])
    output.close()
    failures.close()
    return paths


async def test_collect_metrics_count_cancelled_apart_and_do_not_rate_them(farm, tmp_path):
    settings, r, worker, got, tasks, live = farm
    paths = write_collection(got, tasks, tmp_path)
    m = metrics.aggregate_files(paths.journal, paths.failures)["noop"]
    assert (m["count"], m["ok"], m["failed"], m["cancelled"]) == (6, 2, 1, 3)
    assert m["failures"] == {"verifier": 1}
    assert m["rows"] == 2 and m["pass_at_k"] == pytest.approx(1 / 2), "the cancelled row is not a miss"
    assert m["mean_reward"] == pytest.approx(0.5)


async def test_eval_counts_cancelled_apart(farm, tmp_path):
    settings, r, worker, got, tasks, live = farm
    paths = write_collection(got, tasks, tmp_path)
    result = evaluate.score(paths.journal, paths.failures)
    counts = {k: result["overall"][k] for k in ("n", "passes", "failed", "cancelled")}
    assert counts == {"n": 2, "passes": 1, "failed": 1, "cancelled": 3}
    table = evaluate.render(result).splitlines()
    assert table[-1] == "cancelled (not failed, not scored): noop 3" and all(len(x) <= 80 for x in table)


async def test_the_demo_summary_counts_cancelled_apart(farm):
    settings, r, worker, got, tasks, live = farm
    summary = demo.summarize(list(got.values()), 1.0)
    assert (summary["ok"], summary["failed"], summary["cancelled"]) == (2, {"verifier": 1}, 3)


def test_the_collect_table_says_how_many_were_cancelled(capsys):
    m = dict(rows=2, k=2, count=6, truncated=0, failures={"verifier": 1}, cancelled=3, mean_reward=0.5)
    m |= dict(pass_at_k=0.5, majority_at_k=0.5, latency_p50_s=0.01, tokens_per_s=None)
    metrics.render({"noop": m})
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("agent"))
    row = next(line for line in lines if line.startswith("noop "))
    assert dict(zip(header.split(), row.split()))["failed"] == "1", "a cancel is not a failure"
    assert "noop cancelled: 3 (not failed, not scored)" in lines and all(len(x) <= 80 for x in lines)


async def test_collect_progress_counts_cancelled_apart(farm, tmp_path):
    """`farm collect`'s live progress line: a client's cancel is not the model failing."""
    from producer.collect import Collector
    from producer.plan import CollectOptions
    from producer.progress import _line

    settings, r, worker, got, tasks, live = farm
    collector = Collector(
        settings,
        CollectOptions(input=tmp_path / "in.jsonl", output=tmp_path / "o.jsonl", progress=False),
        Paths.for_output(tmp_path / "o.jsonl"),
        "cx",
        set(),
    )
    good: list[bytes] = []
    bad: list[bytes] = []
    try:
        for i, task in enumerate(tasks):
            collector.window = asyncio.Semaphore(len(tasks))
            collector.outstanding[task.task_id] = (task, i, 0, 1, i, 1.0)
            collector._settle(got[task.task_id], good, bad)
    finally:
        await collector.client.aclose()
    progress = collector.live["noop"]
    assert (progress.done, progress.failed, progress.cancelled) == (6, 1, 3)
    assert _line("noop", progress, 6, 6, 1.0).endswith("cancelled 3")
