"""The dashboard left open all week, in a real headless Chromium (Debian's chromium-headless-shell,
driven by Playwright with executable_path): every page refreshes itself, a failed refresh says so
in a banner until one succeeds, what someone types survives the refreshes, and the pages fit the
window at 1,400, 1,024 and 390 px without sideways scrolling of the page.

Real workers (the noop agent) and a real `farm dashboard` process; the test that stops Redis runs
its own embedded one (farm.embedded.EmbeddedRedis), restarted on the same port and data.
"""

from __future__ import annotations

import asyncio
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from helpers.browser import browser_path, fits_width
from helpers.processes import farm_process, stop_all
from helpers.redis import make_settings
from helpers.waiting import wait_for
from test_dashboard_browser import submit

from farm import history, schema
from farm.client import FarmClient
from farm.embedded import EmbeddedRedis, free_port

pytestmark = pytest.mark.slow
REFRESH_S = 5  # base.html's data-refresh-s
HOSTILE = "<script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">"


def submit_now(*args, **kw) -> None:
    """`submit` from inside sync_playwright, whose own event loop runs in this thread."""
    with ThreadPoolExecutor(1) as pool:
        pool.submit(submit, *args, **kw).result()


def dashboard(redis_url: str, namespace: str, log, **env: str):
    port = free_port()
    proc = farm_process(["dashboard", "--port", str(port)], redis_url, namespace, log, **env)
    base = f"http://127.0.0.1:{port}"
    return proc, base


def opened(page, url: str) -> bool:
    try:
        return page.goto(url).ok
    except Exception:  # noqa: BLE001 - not up yet
        time.sleep(0.2)
        return False


def browser(pw):
    return pw.chromium.launch(executable_path=browser_path(), args=["--no-sandbox"])


def test_a_failed_refresh_shows_a_banner_until_one_succeeds(tmp_path):
    """With Redis stopped the overview kept showing its last numbers as if live."""
    from playwright.sync_api import sync_playwright

    browser_path()
    server = EmbeddedRedis(tmp_path / "redis").start()
    namespace = "live"
    settings = make_settings(server.url, namespace)
    submit(settings, "idle", [{}] * 3)
    proc, base = dashboard(server.url, namespace, tmp_path / "dash.log")
    try:
        with sync_playwright() as pw:
            b = browser(pw)
            page = b.new_page(viewport={"width": 1024, "height": 700})
            wait_for(lambda: opened(page, base + "/"), timeout=60, every=0.5, what="the dashboard")
            assert page.inner_text('#overview tr[data-agent="idle"] td[data-k="queued"]') == "3"
            assert not page.is_visible("#stale")
            shown = page.inner_text("#updated")
            wait_for(lambda: page.inner_text("#updated") != shown, timeout=3 * REFRESH_S, what="a refresh")

            server.stop()
            stopped = time.monotonic()
            wait_for(lambda: page.is_visible("#stale"), timeout=2 * REFRESH_S + 5, what="the banner")
            assert time.monotonic() - stopped <= 2 * REFRESH_S + 5
            said = page.inner_text("#stale")
            assert re.fullmatch(r"not updated since \d\d:\d\d:\d\d: 503 .+", said), said
            assert said[len("not updated since ") :].startswith(page.inner_text("#updated")), "since the last refresh"
            assert "Redis" in said, said
            assert page.inner_text('#overview tr[data-agent="idle"] td[data-k="queued"]') == "3", (
                "the last numbers stay"
            )

            server.start()  # the same port and data (AOF)
            wait_for(lambda: not page.is_visible("#stale"), timeout=3 * REFRESH_S, what="the banner to go")
            assert page.inner_text('#overview tr[data-agent="idle"] td[data-k="queued"]') == "3"
            b.close()
    finally:
        proc.terminate()
        proc.wait(30)
        server.stop()


def test_pages_that_are_not_the_overview_update_on_their_own(redis_url, namespace, tmp_path):
    """The workers, charts and dead letters never refreshed; and a refresh must not wipe a token
    someone is typing."""
    from playwright.sync_api import sync_playwright

    browser_path()
    settings = make_settings(redis_url, namespace)
    r = redis.Redis.from_url(redis_url)
    env = {"FARM_MAX_ATTEMPTS": "1"}
    procs = []
    dash, base = dashboard(redis_url, namespace, tmp_path / "dash.log", FARM_DASHBOARD_TOKEN="let-me-in")
    procs.append(dash)
    try:
        with sync_playwright() as pw:
            b = browser(pw)
            page = b.new_page(viewport={"width": 1024, "height": 700})
            wait_for(lambda: opened(page, base + "/workers"), timeout=60, every=0.5, what="the dashboard")
            assert "no live worker" in page.inner_text("#workers")
            procs.append(
                farm_process(
                    ["worker", "--agent", "flaky", "--impl", "noop"], redis_url, namespace, tmp_path / "w.log", **env
                )
            )
            wait_for(
                lambda: page.query_selector_all("#workers tr[data-worker]"),
                timeout=30 + 2 * REFRESH_S,
                what="the new worker on the page, without a reload",
            )
            assert "flaky" in page.inner_text("#workers tbody")

            submit_now(settings, "flaky", [{"noop": {"fail": "always"}}])
            wait_for(lambda: r.xlen(settings.keys.dead("flaky")) == 1, timeout=30, what="a dead letter")
            page.goto(f"{base}/dead/flaky")
            every = float(page.get_attribute("main", "data-refresh-s") or REFRESH_S)  # the page's own interval
            assert 0 < every <= 60
            wait_for(lambda: page.inner_text("#updated") != "at load", timeout=5, what="the script")
            shown = page.inner_text("#updated")
            field = '.bulk input[name="token"]'
            page.fill(field, "let-me")  # half typed, then the focus goes elsewhere
            page.click("h1")
            submit_now(settings, "flaky", [{"noop": {"fail": "always"}}])
            wait_for(lambda: r.xlen(settings.keys.dead("flaky")) == 2, timeout=30, what="a second dead letter")
            time.sleep(every + 2)
            assert page.input_value(field) == "let-me", "a refresh wiped what was typed"
            assert page.inner_text("#updated") == shown, "no refresh while a field holds text"
            assert len(page.query_selector_all("#dead tbody tr[data-id]")) == 1

            page.fill(field, "")  # emptied, and the focus stays: still no refresh
            time.sleep(every + 2)
            assert page.inner_text("#updated") == shown, "no refresh while a field has the focus"

            page.click("h1")  # and left: refreshes go on
            wait_for(
                lambda: len(page.query_selector_all("#dead tbody tr[data-id]")) == 2,
                timeout=every + 5,
                what="the new dead letter, without a reload",
            )
            assert page.inner_text("#updated") != shown
            b.close()
    finally:
        stop_all(procs)
        r.close()


WIDTHS = (1400, 1024, 390)


def test_the_pages_fit_the_window_without_sideways_scrolling(redis_url, namespace, tmp_path):
    """The overview's table was ~1,500 px wide: the page scrolled sideways at every width and the
    header bar stopped at the window's edge."""
    from playwright.sync_api import sync_playwright

    browser_path()
    settings = make_settings(redis_url, namespace)
    r = redis.Redis.from_url(redis_url)
    long_agent = "summarisation-with-tools-and-a-long-name"
    submit(settings, long_agent, [{}] * 5, run="collect-2026-11-27-0330-" + "x" * 24)
    submit(settings, "math", [{}] * 3, run="eval", share=2)
    minute = settings.keys.history(long_agent, history.minute())
    for field, n in (
        ("done", 900),
        ("failed", 40),
        ("fail:agent_error", 20),
        ("fail:verifier", 12),
        ("fail:timeout", 8),
    ):
        r.hincrby(minute, field, n)
    proc, base = dashboard(redis_url, namespace, tmp_path / "dash.log")
    try:
        with sync_playwright() as pw:
            b = browser(pw)
            page = b.new_page(viewport={"width": 1400, "height": 800})
            wait_for(lambda: opened(page, base + "/"), timeout=60, every=0.5, what="the dashboard")
            for path in ("/", "/workers"):
                for width in WIDTHS:
                    page.set_viewport_size({"width": width, "height": 800})
                    page.goto(base + path)
                    sizes = page.evaluate(
                        "() => [document.documentElement.scrollWidth, window.innerWidth,"
                        " document.querySelector('header').getBoundingClientRect().width]"
                    )
                    scroll_width, inner, header = sizes
                    assert scroll_width <= inner, (path, width, sizes)
                    assert header == inner, ("the header spans the window", path, width, sizes)
                    assert page.is_visible(f'#overview tr[data-agent="{long_agent}"]') or path != "/"
            page.set_viewport_size({"width": 1400, "height": 800})
            page.goto(base + "/")
            row = f'#overview tr[data-agent="{long_agent}"]'
            assert page.inner_text(f'{row} td[data-k="failure_rate"]') == "4.3% of 940"
            assert "ended (done + failed)" in page.inner_text("#definitions")
            b.close()
    finally:
        proc.terminate()
        proc.wait(30)
        r.close()


def sample(r: redis.Redis, settings, agent: str, rollout: schema.Rollout, task: schema.Task) -> str:
    """A sample entry as the worker keeps it: the rollout, and beside it the task's body (`t`)."""
    r.sadd(settings.keys.agents(), agent)
    fields = {**schema.entry(rollout), b"t": schema.entry(task)[b"d"]}
    return r.xadd(settings.keys.samples(agent), fields).decode()


def test_the_rollout_page_shows_its_prompt_as_text(redis_url, namespace, tmp_path):
    """The prompt (system and user messages) was never shown, so an answer could not be judged; an
    empty failure shifted the tokens label; task ids were cut."""
    from playwright.sync_api import sync_playwright

    browser_path()
    settings = make_settings(redis_url, namespace)
    r = redis.Redis.from_url(redis_url)
    client = FarmClient(settings)
    row = {
        "responses_create_params": {
            "instructions": "You are a careful grader. " + HOSTILE,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "What is 2+2? " + HOSTILE}]}],
        }
    }
    task = client.task(run_id="collect-4547-" + "r" * 20, agent="noop", row=row)
    asyncio.run(client.aclose())
    answer = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "4"}]}]
    ok = sample(
        r, settings, "noop", schema.Rollout.for_task(task, status=schema.Status.ok, reward=1.0, output=answer), task
    )
    bad = sample(r, settings, "noop", schema.Rollout.failure(task, schema.ErrorKind.verifier, "no <b>answer</b>"), task)
    proc, base = dashboard(redis_url, namespace, tmp_path / "dash.log")
    try:
        with sync_playwright() as pw:
            b = browser(pw)
            page = b.new_page(viewport={"width": 390, "height": 800})
            wait_for(lambda: opened(page, f"{base}/rollouts/noop/{ok}"), timeout=60, every=0.5, what="the page")
            system = page.inner_text('#prompt li[data-role="system"] pre')
            user = page.inner_text('#prompt li[data-role="user"] pre')
            assert system == "You are a careful grader. " + HOSTILE
            assert user == "What is 2+2? " + HOSTILE
            assert not page.query_selector("main img") and page.title() != "pwned"
            assert page.inner_text("#output pre") == "4"
            assert page.inner_text("#task-id") == task.task_id and len(task.task_id) == 32
            assert page.inner_text("#run-id") == task.run_id
            assert not page.query_selector("#failure"), "no empty failure label"
            label = page.query_selector("dt:text-is('tokens')").bounding_box()
            value = page.query_selector("#tokens").bounding_box()
            assert abs(label["y"] - value["y"]) < 4, ("the tokens label sits by its value", label, value)
            assert fits_width(page)

            page.goto(f"{base}/rollouts/noop/{bad}")
            assert page.inner_text("#failure") == "verifier: no <b>answer</b>"
            assert not page.query_selector("#failure b")
            label = page.query_selector("dt:text-is('tokens')").bounding_box()
            value = page.query_selector("#tokens").bounding_box()
            assert abs(label["y"] - value["y"]) < 4, (label, value)
            b.close()
    finally:
        proc.terminate()
        proc.wait(30)
        r.close()
