"""The dashboard in a real headless Chromium (Debian's chromium-headless-shell, driven by
Playwright with executable_path), against a farm with work in flight.

It checks the agents and numbers the overview shows and that they refresh, opens a sampled
rollout, shows that a rollout holding HTML renders as text, and requeues a dead letter with
the token after being refused without it; a sandboxed agent's sandboxes show in their own table
(from a heartbeat written here in the shape SandboxStats.snapshot makes: a real sandbox needs
Docker or root). FARM_UPDATE_SCREENSHOT=1 also writes the
overview's screenshot to docs/dashboard.png (the one docs/dashboard.md shows).
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest
import redis
from helpers import ROOT
from helpers.browser import browser_path, page_ready
from helpers.processes import farm_process, stop_all
from helpers.redis import make_settings
from helpers.waiting import wait_for

from farm import history
from farm.client import FarmClient
from farm.dashboard import data
from farm.embedded import free_port
from workers.loops.sandboxes import SandboxStats

pytestmark = pytest.mark.slow
HOSTILE = "<script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">"


def submit(settings, agent: str, rows: list[dict], run: str = "web", share: float = 1.0) -> None:
    """Through FarmClient.submit, as a trainer submits: queued in the run's queue for the agent."""

    async def go() -> None:
        client = FarmClient(settings)
        tasks = [client.task(run_id=run, agent=agent, row=row) for row in rows]
        await client.submit(tasks, share=share, check_agents=False)  # agents such as `idle`: no worker, on purpose
        await client.aclose()

    asyncio.run(go())


def test_the_dashboard_in_a_real_browser(redis_url, namespace, tmp_path):
    executable = browser_path()
    from playwright.sync_api import sync_playwright

    settings = make_settings(redis_url, namespace)
    r = redis.Redis.from_url(redis_url)
    port = free_port()
    env = {"FARM_SAMPLE_EVERY": "1", "FARM_MAX_ATTEMPTS": "1"}
    procs = [
        farm_process(["worker", "--agent", "noop"], redis_url, namespace, tmp_path / "noop.log", **env),
        farm_process(["worker", "--agent", "flaky", "--impl", "noop"], redis_url, namespace, tmp_path / "f.log", **env),
        farm_process(
            ["worker", "--agent", "slow", "--impl", "noop", "--concurrency", "2"],
            redis_url,
            namespace,
            tmp_path / "slow.log",
            **env,
        ),
        farm_process(
            ["dashboard", "--port", str(port)],
            redis_url,
            namespace,
            tmp_path / "dash.log",
            FARM_DASHBOARD_TOKEN="let-me-in",
        ),
    ]
    base = f"http://127.0.0.1:{port}"
    try:
        submit(
            settings,
            "noop",
            [{"noop": {"reward": 1.0, "tokens": 12}}] * 6
            + [{"noop": {"reward": 0.0}, "responses_create_params": {"input": HOSTILE}}],
        )
        submit(settings, "flaky", [{"noop": {"fail": "always"}}] * 3)
        submit(settings, "slow", [{"noop": {"sleep_s": 60}}] * 5)  # 2 in flight, 3 waiting
        submit(settings, "idle", [{}] * 4)  # no worker: one moved to the stream, 3 in web's queue
        submit(settings, "idle", [{}] * 2, run="idle-eval", share=3)
        # 60 tasks of idle cancelled this minute, as the settle records them (farm.history)
        r.hincrby(settings.keys.history("idle", history.minute()), "cancelled", 60)
        wait_for(
            lambda: r.xlen(settings.keys.dead("flaky")) == 3 and r.xlen(settings.keys.samples("noop")) == 7,
            timeout=60,
            what="the workers to settle",
        )

        def counted() -> bool:  # the workers write their history counts within Settler.FLUSH_S
            agents = data.overview(r, settings.keys)["agents"]
            return agents["flaky"]["failure_rate"] == 1.0 and agents["noop"]["rollouts"] == 7

        wait_for(counted, timeout=30, what="the history counts")
        boxes = SandboxStats(starting=1, running=3, started=12, start_failed=2, infrastructure=1)
        boxes.start_s.extend([0.4, 0.6, 1.5])
        beat = {"worker_id": "boxed-1", "agent": "boxed", "pid": 1, "host": "h", "concurrency": 4, "ts": time.time()}
        r.set(settings.keys.worker("boxed-1"), json.dumps({**beat, "sandboxes": boxes.snapshot()}), ex=300)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1500, "height": 700})
            wait_for(
                lambda: page_ready(page, base + "/", "h1:has-text('Agents')"),
                timeout=60,
                every=0.5,
                what="the dashboard",
            )
            rows = {tr.get_attribute("data-agent"): tr for tr in page.query_selector_all("#overview tbody tr")}
            assert set(rows) == {"noop", "flaky", "slow", "idle"}

            def cell(agent: str, key: str) -> str:
                return page.inner_text(f'#overview tr[data-agent="{agent}"] td[data-k="{key}"]')

            assert cell("flaky", "dead") == "3" and cell("flaky", "failure_rate") == "3 of 3"
            assert cell("flaky", "failures_by_kind") == "agent_error 3"
            assert cell("idle", "queued") == "6" and cell("idle", "live_workers") == "0"

            def run_cells(agent: str, run: str) -> tuple[str, ...]:
                row = f'#runs tr[data-agent="{agent}"][data-run="{run}"]'
                return tuple(page.inner_text(f'{row} td[data-k="{k}"]') for k in ("share", "queued", "in_flight"))

            runs_shown = {"web": ("1", "3", "1"), "idle-eval": ("3", "2", "0")}
            assert {run: run_cells("idle", run) for run in runs_shown} == runs_shown
            assert cell("slow", "in_flight") == "2" and cell("slow", "queued") == "3"
            assert cell("noop", "live_workers") == "1" and cell("noop", "pass_rate") == "85.7%"
            # 60 over the 5-minute window, of which 4 to 5 minutes have elapsed
            assert 12.0 <= float(cell("idle", "cancelled_per_min")) <= 15.0
            assert cell("noop", "cancelled_per_min") == "0.0"
            before = page.inner_text("#updated")
            # (the page's Content-Security-Policy forbids evaluating strings, so poll from here)
            wait_for(lambda: page.inner_text("#updated") != before, timeout=15, what="the overview to refresh itself")
            assert 12.0 <= float(cell("idle", "cancelled_per_min")) <= 15.0, "as the refresh writes it"
            assert {run: run_cells("idle", run) for run in runs_shown} == runs_shown, "as the refresh writes them"
            assert run_cells("slow", "web")[1:] == ("3", "2")
            assert "cancelled/min" in page.inner_text("#overview thead")
            shown = ("running", "started", "start_failed", "infrastructure", "start_p50_s", "start_p99_s")
            boxed = [page.inner_text(f'#sandboxes tr[data-agent="boxed"] td[data-k="{k}"]') for k in shown]
            assert boxed == ["3", "12", "2", "1", "0.60", "1.50"], "as the refresh writes them"
            assert len(page.query_selector_all("#sandboxes tbody tr")) == 1, "only the agent with sandboxes"
            page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
            if os.environ.get("FARM_UPDATE_SCREENSHOT"):
                page.screenshot(path=str(ROOT / "docs" / "dashboard.png"), full_page=True)

            page.click('#overview tr[data-agent="noop"] a:text("rollouts")')
            links = [a.get_attribute("href") for a in page.query_selector_all("#rollouts a")]
            assert len(links) == 7
            texts = {}
            for href in links:
                page.goto(base + href)
                texts[href] = page.inner_text("main")
            hostile = next(h for h, t in texts.items() if "pwned" in t)
            page.goto(base + hostile)
            assert "<script>document.title='pwned'</script>" in page.inner_text(".turns")
            assert page.title() != "pwned" and not page.query_selector(".turns img")
            assert page.inner_text('#prompt li[data-role="user"] pre') == HOSTILE, "the prompt it answered, as text"
            assert page.inner_text("#status") == "ok" and page.inner_text("#reward") == "0.0"

            page.goto(f"{base}/dead/flaky")
            assert len(page.query_selector_all("#dead tbody tr")) == 3
            first = page.query_selector("#dead tbody tr")
            first.query_selector('input[name="token"]').fill("wrong")
            first.query_selector(".requeue-one").click()
            assert "wrong dashboard token" in page.inner_text("body")
            assert r.xlen(settings.keys.dead("flaky")) == 3
            page.goto(f"{base}/dead/flaky")
            first = page.query_selector("#dead tbody tr")
            first.query_selector('input[name="token"]').fill("let-me-in")
            first.query_selector(".requeue-one").click()
            page.wait_for_selector("#done")
            assert page.inner_text("#done") == "requeued 1"
            browser.close()
        wait_for(lambda: r.xlen(settings.keys.dead("flaky")) == 3, timeout=30, what="the requeued task to die again")
    finally:
        stop_all(procs)
        r.close()
