"""A real Prometheus scrapes the farm, and every Grafana panel and alert rule shipped in
deploy/monitoring gets data back through its HTTP API; promtool accepts the shipped files.

The farm is made to show every condition the alerts watch for: an agent with a growing
backlog and no worker (two runs with shares 1 and 3, for the per-run panels), an agent whose
rollouts all fail (dead letters rising, some as policy errors), and a healthy one, served by
`farm worker` processes, one with --metrics-port. Tasks are submitted through FarmClient. A
sandboxed agent's worker is its heartbeat alone, written here as SandboxStats.snapshot makes it
(a real sandbox needs Docker or root), for the sandbox panels and series.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import pytest
import redis
import yaml
from helpers import ROOT
from helpers.processes import farm_process, need_binary
from helpers.redis import make_settings
from helpers.waiting import wait_for

from farm.client import FarmClient
from farm.embedded import free_port
from workers.loops.sandboxes import SandboxStats

MONITORING = ROOT / "deploy" / "monitoring"
pytestmark = pytest.mark.slow


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def query(prom: str, expr: str) -> list:
    out = get(f"{prom}/api/v1/query?query={urllib.parse.quote(expr)}")
    assert out["status"] == "success", (expr, out)
    return out["data"]["result"]


def panel_queries() -> list[str]:
    dash = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    return [t["expr"] for p in dash["panels"] for t in p["targets"]]


def alert_rules() -> dict[str, str]:
    rules = yaml.safe_load((MONITORING / "alerts.yml").read_text())
    return {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}


def test_promtool_accepts_the_shipped_rules_and_config():
    promtool = need_binary("promtool", "prometheus")
    for args in (["check", "rules", "alerts.yml"], ["check", "config", "prometheus.yml"]):
        out = subprocess.run([promtool, *args], cwd=MONITORING, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "SUCCESS" in out.stdout + out.stderr


def test_every_panel_and_alert_gets_data_from_a_real_prometheus(redis_url, namespace, tmp_path):
    prometheus = need_binary("prometheus", "prometheus")
    settings = make_settings(redis_url, namespace, max_attempts=1)
    dash_port, worker_port, prom_port = free_port(), free_port(), free_port()
    procs = [
        farm_process(["dashboard", "--port", str(dash_port)], redis_url, namespace, tmp_path / "dashboard.log"),
        farm_process(
            ["worker", "--agent", "noop", "--metrics-port", str(worker_port)],
            redis_url,
            namespace,
            tmp_path / "noop.log",
        ),
        farm_process(["worker", "--agent", "flaky", "--impl", "noop"], redis_url, namespace, tmp_path / "flaky.log"),
    ]
    rules = tmp_path / "alerts.yml"
    shutil.copy(MONITORING / "alerts.yml", rules)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {"job_name": "farm", "static_configs": [{"targets": [f"127.0.0.1:{dash_port}"]}]},
            {"job_name": "farm-workers", "static_configs": [{"targets": [f"127.0.0.1:{worker_port}"]}]},
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = open(tmp_path / "prometheus.log", "ab")
    procs.append(
        subprocess.Popen(
            [
                prometheus,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            stdout=log,
            stderr=log,
        )
    )
    prom = f"http://127.0.0.1:{prom_port}"
    stop = threading.Event()

    async def submit_until_stopped() -> None:
        """Submits through FarmClient, as a trainer does: two runs on `idle` (no worker: their
        backlogs grow), with shares 1 and 3, for the per-run panels."""
        client = FarmClient(settings)
        while not stop.is_set():
            rows = [
                ("prom", "idle", {}),  # no worker: a backlog that grows
                ("eval", "idle", {}),
                ("prom", "noop", {"noop": {"reward": 1.0, "tokens": 16}}),
                ("prom", "noop", {"noop": {"reward": 0.0}}),
                ("prom", "flaky", {"noop": {"fail": "always"}}),  # dead letters rising
                ("prom", "flaky", {"noop": {"fail": "fatal", "kind": "policy"}}),  # policy errors
            ]
            for run, share in (("prom", 1), ("eval", 3)):
                mine = [client.task(run_id=run, agent=agent, row=row) for r, agent, row in rows if r == run]
                await client.submit(mine, share=share, check_agents=False)  # `idle`: no worker, on purpose
            await asyncio.sleep(0.5)
        await client.aclose()

    feeder = threading.Thread(target=lambda: asyncio.run(submit_until_stopped()), daemon=True)
    r = redis.Redis.from_url(redis_url)
    r.hincrby(settings.keys.stats("idle"), "cancelled", 5)  # as the settle of 5 cancelled tasks counts them
    boxes = SandboxStats(starting=1, running=3, started=12, start_failed=2, infrastructure=1)
    boxes.start_s.extend([0.4, 0.6, 1.5])
    beat = {"worker_id": "boxed-1", "agent": "boxed", "ts": time.time(), "sandboxes": boxes.snapshot()}
    r.set(settings.keys.worker("boxed-1"), json.dumps(beat), ex=600)
    r.close()
    try:
        feeder.start()
        wait_for(lambda: _ready(prom), timeout=60, every=0.5, what="prometheus to answer")
        wait_for(lambda: len(query(prom, "farm_rollouts_total")) >= 4, timeout=60, every=1, what="scrapes")
        time.sleep(12)  # enough samples for deriv() and increase()
        for expr in panel_queries():
            assert query(prom, expr), f"Grafana panel query returned no data: {expr}"
        for name, expr in alert_rules().items():
            assert query(prom, expr), f"alert {name} returned no data: {expr}"
        (cancelled,) = query(prom, 'farm_rollouts_total{agent="idle",status="cancelled"}')
        assert cancelled["value"][1] == "5"
        assert query(prom, 'farm_cancelled_per_minute{agent="noop"}')
        shares = {x["metric"]["run"]: x["value"][1] for x in query(prom, 'farm_run_share{agent="idle"}')}
        assert shares == {"prom": "1", "eval": "3"}
        (worker,) = query(prom, 'farm_worker_tasks_total{agent="noop",outcome="cancelled"}')
        assert worker["value"][1] == "0", "the worker with --metrics-port counts its cancelled tasks"
        sandboxes = {
            'farm_sandboxes{agent="boxed",state="running"}': "3",
            'farm_sandboxes{agent="boxed",state="starting"}': "1",
            'farm_sandbox_starts_total{agent="boxed"}': "12",
            'farm_sandbox_start_failures_total{agent="boxed"}': "2",
            'farm_sandbox_infrastructure_failures_total{agent="boxed"}': "1",
            'farm_sandbox_start_seconds{agent="boxed",quantile="0.5"}': "0.6",
            'farm_sandbox_start_seconds{agent="boxed",quantile="0.99"}': "1.5",
        }
        assert {expr: [x["value"][1] for x in query(prom, expr)] for expr in sandboxes} == {
            expr: [value] for expr, value in sandboxes.items()
        }
        assert not query(prom, 'farm_sandboxes{agent="noop"}'), "no sandboxes on noop's workers: no series"
    finally:
        stop.set()
        feeder.join(10)
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()


def _ready(prom: str) -> bool:
    try:
        return urllib.request.urlopen(f"{prom}/-/ready", timeout=2).status == 200
    except OSError:
        return False
