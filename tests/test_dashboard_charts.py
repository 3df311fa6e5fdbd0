"""An agent's charts: one minute of data is drawn, with a time axis, a y scale and each minute's values
on hover (SVG <title>, no script); the window starts at the agent's first minute with data; the queue
depth is written on a clock by the worker, so a queue nobody settles from is charted as it is.

Against real Redis and real workers (the noop agent); the layout at three widths in a real headless
Chromium (Debian's chromium-headless-shell, driven by Playwright with executable_path).
"""

from __future__ import annotations

import asyncio
import re
import xml.etree.ElementTree as ET
from typing import Optional

import pytest
import redis
from fastapi.testclient import TestClient
from helpers.browser import browser_path, fits_width, page_ready
from helpers.processes import farm_process, stop_all
from helpers.redis import make_settings
from helpers.waiting import async_wait_for, wait_for
from helpers.workers import in_process_worker

from farm import history
from farm.client import FarmClient
from farm.dashboard.app import create_app
from farm.dashboard.charts import clock, line_chart
from farm.embedded import free_port

HHMM = re.compile(r"^\d\d:\d\d$")
CHARTS = ("rollouts per minute", "failures by kind", "reward", "latency (s, estimated from bins)")


def parse(markup: str) -> ET.Element:
    """One chart's SVG as XML, its tags without their namespace."""
    svg = ET.fromstring(markup)
    for el in svg.iter():
        el.tag = el.tag.rsplit("}", 1)[-1]
    return svg


def charts_of(html: str) -> dict[str, ET.Element]:
    """The page's charts by title."""
    charts = (parse(found.group(0)) for found in re.finditer(r'<svg class="chart".*?</svg>', html, re.S))
    return {str(svg.get("data-chart")): svg for svg in charts}


def hover(svg: ET.Element) -> list[str]:
    """Each minute's hover title (one per column)."""
    return [t.text or "" for t in svg.iter("title")]


def values(svg: ET.Element, series: str) -> list[Optional[float]]:
    """A series' value in each minute, read back from the hover titles."""
    out: list[Optional[float]] = []
    for title in hover(svg):
        line = next(x for x in title.split("\n") if x.startswith(f"{series}: "))
        shown = line.split(": ", 1)[1]
        out.append(None if shown == "-" else float(shown.replace(",", "")))
    return out


def labels(svg: ET.Element, axis: str) -> list[str]:
    return [t.text or "" for t in svg.iter("text") if axis in (t.get("class") or "").split()]


def dots(svg: ET.Element, series: str) -> list[ET.Element]:
    return [c for c in svg.iter("circle") if c.get("data-series") == series]


def submit(settings, agent: str, rows: list[dict], run: str = "charts") -> None:
    async def go() -> None:
        client = FarmClient(settings)
        # Agents such as `idle` have no worker on purpose.
        await client.submit([client.task(run_id=run, agent=agent, row=row) for row in rows], check_agents=False)
        await client.aclose()

    asyncio.run(go())


def test_a_lone_minute_is_drawn_a_gap_breaks_the_line_and_names_are_escaped():
    """One minute of data was an invisible polyline of one point; a minute with no value joined its
    neighbours; a hostile series name stays text."""
    hostile = "<script>alert(1)</script>"
    one = parse(str(line_chart("one", [100], {"mean": [0.5]})))
    assert len(dots(one, "mean")) == 1, "a single point is a dot"
    assert hover(one) == ["01:40 UTC\nmean: 0.5"]
    assert labels(one, "x") == ["01:40", "01:41"]
    assert labels(one, "y")[0] == "0" and max(float(t) for t in labels(one, "y")) >= 0.5, "a scale up to the value"
    gap = parse(str(line_chart("gap", list(range(200, 280)), {hostile: [1.0] * 30 + [None] + [2.0] * 49})))
    assert len(list(gap.iter("polyline"))) == 2, "the line breaks where a minute has no value"
    assert len(hover(gap)) == 80 and f"{hostile}: -" in hover(gap)[30]
    ticks = labels(gap, "x")
    assert 2 <= len(ticks) <= 6 and all(HHMM.match(t) for t in ticks), ticks
    assert "<script>" not in str(line_chart("t", [1], {hostile: [1.0]})), "escaped in the markup"


def test_the_window_starts_at_the_first_minute_with_data(redis_url, namespace):
    """A new farm's charts start at its first data, not 3 h back with everything in the last pixels;
    an older one keeps the whole window."""
    settings = make_settings(redis_url, namespace)
    r = redis.Redis.from_url(redis_url)
    keys = settings.keys
    now = history.minute()
    r.sadd(keys.agents(), "fresh", "old")
    r.hset(keys.history("fresh", now - 30), mapping={"done": 16, "reward_sum": 8.0, "reward_n": 16, "depth": 3})
    r.hset(keys.history("old", now - 179), mapping={"done": 1})
    r.hset(keys.history("old", now - 200), mapping={"done": 1})  # before the window: not shown
    try:
        with TestClient(create_app(settings, r)) as web:
            page = web.get("/agents/fresh?minutes=180").text
            after = history.minute()
            old = charts_of(web.get("/agents/old?minutes=180").text)
    finally:
        r.close()
    charts = charts_of(page)
    assert set(CHARTS) <= set(charts), list(charts)
    throughput = charts["rollouts per minute"]
    shown = len(hover(throughput))
    assert shown in {now - (now - 30) + 1, after - (now - 30) + 1}, shown
    assert hover(throughput)[0].startswith(f"{clock(now - 30)} UTC")
    assert values(throughput, "done")[0] == 16 and values(charts["reward"], "mean")[0] == 0.5
    shown_minutes = {clock(m) for m in range(now - 30, after + 2)}
    ticks = labels(throughput, "x")
    assert len(ticks) >= 2 and set(ticks) <= shown_minutes, f"the time axis starts at the first data: {ticks}"
    assert f"since {clock(now - 30)} UTC" in page
    assert len(hover(old["rollouts per minute"])) == 180, "data 179 minutes back: the whole 3 h"


async def test_the_queue_depth_is_sampled_on_a_clock_without_any_settle(redis_url, namespace):
    """16 tasks behind a worker busy for 30 s: nothing settles, yet the depth chart reads 16 (it was
    written only beside settles, so it read nothing, or the depth of the last settle)."""
    settings = make_settings(redis_url, namespace)
    r = redis.Redis.from_url(redis_url)
    client = FarmClient(settings)
    tasks = [client.task(run_id="busy", agent="slow", row={"noop": {"sleep_s": 30}}) for _ in range(16)]
    try:
        async with in_process_worker(settings, concurrency=1, agent="slow"):
            await client.submit(tasks, check_agents=False)  # `slow`'s worker is starting in this block
            with TestClient(create_app(settings, r)) as web:

                def depth() -> Optional[float]:
                    chart = charts_of(web.get("/agents/slow").text).get("queue depth (tasks not yet settled)")
                    return values(chart, "tasks")[-1] if chart is not None and hover(chart) else None

                await async_wait_for(lambda: depth() == 16, timeout=30, every=0.5, what="a depth of 16")
            now = history.minute()
            written = {
                k: history.decode_bucket(r.hgetall(k))
                for k in (settings.keys.history("slow", now - 1), settings.keys.history("slow", now))
            }
            assert not any(b.get("done") or b.get("failed") for b in written.values()), "nothing settled"
            assert any(b.get("depth") == 16 and r.ttl(k) > 0 for k, b in written.items()), "with the history's TTL"
    finally:
        await client.aclose()
        r.close()


@pytest.mark.slow
def test_sixteen_rollouts_in_one_minute_are_drawn_at_every_width(redis_url, namespace, tmp_path):
    """mcqa's reward and latency charts were blank after 16 rollouts (one minute, one point). Here a
    real worker settles 16, and in a real browser at 1400, 1024 and 390 px each chart draws them,
    with HH:MM ticks, a y scale and the values in the hover titles, and the page never scrolls sideways."""
    executable = browser_path()
    from playwright.sync_api import sync_playwright

    settings = make_settings(redis_url, namespace)
    r = redis.Redis.from_url(redis_url)
    port = free_port()
    procs = [
        farm_process(["worker", "--agent", "noop"], redis_url, namespace, tmp_path / "noop.log"),
        farm_process(["dashboard", "--port", str(port)], redis_url, namespace, tmp_path / "dash.log"),
    ]
    base = f"http://127.0.0.1:{port}"
    try:
        submit(settings, "noop", [{"noop": {"reward": 0.5, "tokens": 8}}] * 16)

        def settled() -> bool:
            now = history.minute()
            bucket = history.merge(history.buckets(r, settings.keys, "noop", range(now - 3, now + 1)))
            return bucket.get("done") == 16

        wait_for(settled, timeout=60, what="16 rollouts counted in the history")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
            for width in (1400, 1024, 390):
                page = browser.new_page(viewport={"width": width, "height": 900})
                wait_for(
                    lambda: page_ready(page, f"{base}/agents/noop", "svg.chart"),
                    timeout=60,
                    every=0.5,
                    what="the agent page",
                )
                page.screenshot(path=str(tmp_path / f"agent-{width}.png"), full_page=True)
                assert fits_width(page), "no sideways scroll"
                assert page.locator("svg.chart").count() == 5
                for i in range(5):
                    box = page.locator("svg.chart").nth(i).bounding_box()
                    assert box and box["x"] >= 0 and box["x"] + box["width"] <= width, (width, box)
                for chart, series in (
                    ("reward", "mean"),
                    ("reward", "pass rate"),
                    ("latency (s, estimated from bins)", "p50"),
                ):
                    dot = page.locator(f'svg[data-chart="{chart}"] circle.dot[data-series="{series}"]').first
                    assert dot.is_visible(), (width, chart, series)
                    box = dot.bounding_box()
                    assert box and box["width"] >= 2, (width, chart, box)
                charts = charts_of(page.content())
                minutes = len(hover(charts["rollouts per minute"]))
                assert 1 <= minutes <= 3, "the window starts at the first data"
                assert sum(v or 0 for v in values(charts["rollouts per minute"], "done")) == 16
                assert {v for v in values(charts["reward"], "mean") if v is not None} == {0.5}
                assert any(v for v in values(charts["latency (s, estimated from bins)"], "p99")), "latency drawn"
                for svg in charts.values():
                    assert all(HHMM.match(t) for t in labels(svg, "x")) and len(labels(svg, "x")) >= 2
                    assert len(labels(svg, "y")) >= 2
                assert max(float(t) for t in labels(charts["rollouts per minute"], "y")) >= max(
                    values(charts["rollouts per minute"], "done")
                ), "the y scale reaches the highest value"
                page.close()
            browser.close()
    finally:
        stop_all(procs)
        r.close()
