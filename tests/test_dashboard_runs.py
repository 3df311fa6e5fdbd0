"""The runs list, a run's page and a worker's page, against a farm the test runs.

A real worker (the noop agent) settles the rollouts of two runs: `train`, whose rewards rise with
the policy version its tasks carry, with failures of three kinds and one task cancelled in
flight, and `eval`, with tasks left waiting on an agent no worker serves. Every number on the
pages is checked against the rollouts the test collected (computed here, independently of the
dashboard), and the worker's page against its heartbeat as Redis holds it. Run ids are untrusted
text: one written into the history by hand is escaped on the pages and reachable by its link; an
unknown id is a 404 that does not repeat it. In a real browser the pages fit 1,400, 1,024 and 390 px
without sideways scrolling.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import time
import urllib.parse
from collections import defaultdict

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
from farm.embedded import free_port

HOSTILE = "<script>document.title='pwned'</script><img src=x onerror=alert(1)>"
# policy version -> the rewards of train's rollouts started on it (pass: reward >= 1.0)
CURVE = {0: [0.0, 0.0, 0.0, 1.0], 1: [1.0, 1.0, 0.5, 0.0], 3: [1.0, 1.0, 1.0, 0.75, 1.0]}


def _texts(block: str) -> dict[str, str]:
    found = re.findall(r'data-k="([^"]+)"[^>]*>(.*?)</(?:dd|td|span)>', block)
    return {k: html.unescape(re.sub(r"<[^>]+>", "", v)).strip() for k, v in found}


def cells(page: str, marker: str, end: str) -> dict[str, str]:
    """{data-k: text} of the elements between `marker` (e.g. 'id="run-facts"') and the next `end`."""
    return _texts(page.split(marker, 1)[1].split(end, 1)[0])


def row_cells(page: str, table_id: str, attr: str, value: str) -> dict[str, str]:
    """{data-k: text} of the row of table `table_id` whose `attr` is `value`."""
    table = page.split(f'id="{table_id}"', 1)[1].split("</table>", 1)[0]
    return _texts(table.split(f'{attr}="{value}"', 1)[1].split("</tr>", 1)[0])


def counted(r: redis.Redis, settings, run: str) -> dict[str, float]:
    """A run's rollouts by outcome in the noop agent's history of the last 5 minutes."""
    minutes = history.window(time.time(), 5)[0]
    return history.run_counts(history.merge(history.buckets(r, settings.keys, "noop", minutes))).get(run, {})


def per_min_bounds(n: int, before: float, after: float) -> tuple[float, float]:
    """The rate a page rendered between `before` and `after` shows for n rollouts over the 5-minute window."""
    spans = [history.window(t, 5)[1] for t in (before, after)]
    return n / max(spans) - 0.05, n / min(spans) + 0.05


@pytest.fixture
async def farm(redis_url, namespace):
    settings = make_settings(redis_url, namespace, max_attempts=1, sample_every=1)
    client = FarmClient(settings)
    rewarded = [
        client.task(run_id="train", agent="noop", row={"noop": {"reward": x}}, policy_version=v)
        for v, rewards in CURVE.items()
        for x in rewards
    ]
    failing = [
        client.task(run_id="train", agent="noop", row={"noop": {"fail": "fatal"}}, policy_version=3),
        client.task(run_id="train", agent="noop", row={"noop": {"fail": "fatal"}}, policy_version=3),
        client.task(run_id="train", agent="noop", row={"noop": {"fail": "fatal", "kind": "tool"}}, policy_version=3),
        client.task(run_id="train", agent="noop", row={"noop": {"fail": "always"}}, policy_version=3),
    ]
    slow = client.task(run_id="train", agent="noop", row={"noop": {"sleep_s": 60}}, policy_version=3)
    evals = [client.task(run_id="eval", agent="noop", row={"noop": {"reward": 1.0}}) for _ in range(5)]
    waiting = [client.task(run_id="eval", agent="idle", row={}) for _ in range(3)]
    r = redis.Redis.from_url(redis_url)
    async with in_process_worker(settings, concurrency=4) as worker:
        await client.submit(rewarded + failing)
        await client.submit(evals + waiting, share=3, check_agents=False)  # `idle`: no worker, on purpose
        got = await client.collect(rewarded + failing + evals, timeout_s=60)
        await client.submit([slow])
        await async_wait_for(lambda: len(worker.inflight) == 1, timeout=20, what="the slow task to start")
        await client.cancel([slow])
        got.update(await client.collect([slow], timeout_s=30))
        settled = len(got)

        def beat() -> dict:
            raw = r.get(settings.keys.worker(worker.worker_id))
            return json.loads(raw) if raw else {}

        # the heartbeat has caught up with every settle (it is written every heartbeat_ttl_s / 3)
        await async_wait_for(
            lambda: (
                sum(beat().get(k, 0) for k in ("done", "failed", "cancelled", "dead")) == settled
                and not beat()["inflight"]
            ),
            timeout=20,
            what="the heartbeat to count every settle",
        )
        # the Settler writes the history counts in its next round trip (this loop must run for it)
        await async_wait_for(lambda: counted(r, settings, "train").get("cancelled"), what="the history to count it all")
        yield settings, r, client, got, worker, beat
    await client.aclose()
    r.close()


async def test_every_number_on_a_run_page_is_what_was_settled(farm):
    settings, r, client, got, worker, beat = farm
    train = [x for x in got.values() if x.run_id == "train"]
    assert len(train) == 18 and {x.policy_version for x in train} == {0, 1, 3}
    ok = [x for x in train if x.ok]
    failed = [x for x in train if not x.ok and str(x.status) != "cancelled"]
    kinds: dict[str, int] = defaultdict(int)
    for x in failed:
        kinds[str(x.error.kind)] += 1
    assert dict(kinds) == {"verifier": 2, "tool": 1, "agent_error": 1}
    by_version: dict[int, list[float]] = defaultdict(list)
    for x in train:
        if x.reward is not None:
            by_version[x.policy_version].append(x.reward)
    assert {v: sorted(rs) for v, rs in by_version.items()} == {v: sorted(rs) for v, rs in CURVE.items()}

    with TestClient(create_app(settings, r)) as web:
        before = time.time()
        page = web.get("/runs/train")
        after = time.time()
    assert page.status_code == 200, page.text
    text = page.text
    facts = cells(text, 'id="run-facts"', "</dl>")
    assert facts["done"] == str(len(ok)) and facts["failed"] == str(len(failed)) and facts["cancelled"] == "1"
    assert (facts["open"], facts["queued"], facts["in_flight"]) == ("0", "0", "0")
    assert facts["agents"] == "noop"
    progress = cells(text, 'id="progress"', "</p>")
    assert progress == {"settled": str(len(train)), "submitted": str(len(train))}
    assert "(100.0%)" in text.split('id="progress"')[1].split("</p>")[0]
    low, high = per_min_bounds(len(ok), before, after)
    assert low <= float(facts["done_per_min"]) <= high, (facts["done_per_min"], low, high)
    low, high = per_min_bounds(len(failed), before, after)
    assert low <= float(facts["failed_per_min"]) <= high
    assert facts["failure_rate"] == f"{100 * len(failed) / (len(ok) + len(failed)):.1f}% of {len(ok) + len(failed)}"
    rewards = [x.reward for x in train if x.reward is not None]
    assert facts["mean_reward"] == f"{sum(rewards) / len(rewards):.3f}"
    assert facts["pass_rate"] == f"{100 * sum(x >= 1.0 for x in rewards) / len(rewards):.1f}%"
    for kind, n in kinds.items():
        assert row_cells(text, "failures", "data-kind", kind) == {"n": str(n)}
    assert text.split('id="failures"')[1].split("</table>")[0].count("<tr data-kind=") == 3
    curve_table = text.split('id="curve"')[1].split("</table>")[0]
    assert re.findall(r'data-version="(\d+)"', curve_table) == ["0", "1", "3"], "every version, in order"
    assert curve_table.count("(start)") == 1 and 'data-version="0"><td>0 <small>(start)' in curve_table
    for v, rs in by_version.items():
        shown = row_cells(text, "curve", "data-version", str(v))
        assert shown["n"] == str(len(rs))
        assert shown["mean_reward"] == f"{sum(rs) / len(rs):.3f}", (v, shown)
        assert shown["pass_rate"] == f"{100 * sum(x >= 1.0 for x in rs) / len(rs):.1f}%", (v, shown)
    assert text.count("<svg") == 2 and "by policy version: mean reward, pass rate" in text
    curve_svg = text.split('data-chart="by policy version')[1].split("</svg>")[0]
    assert ">v0<" in curve_svg and ">v3<" in curve_svg and "UTC" not in curve_svg, "versions on x, not clock times"
    assert 'class="hover" fill="transparent"' in curve_svg, "hover columns drawn invisible without a stylesheet"

    with TestClient(create_app(settings, r)) as web:
        before = time.time()
        ev = web.get("/runs/eval").text
        after = time.time()
    facts = cells(ev, 'id="run-facts"', "</dl>")
    assert (facts["done"], facts["failed"], facts["cancelled"], facts["open"]) == ("5", "0", "0", "3")
    assert cells(ev, 'id="progress"', "</p>") == {"settled": "5", "submitted": "8"}, "5 settled, 3 still waiting"
    idle = row_cells(ev, "placement", "data-agent", "idle")
    assert idle["share"] == "3" and int(idle["queued"]) + int(idle["in_flight"]) == 3 and idle["cap"] == "-"
    assert int(facts["queued"]) + int(facts["in_flight"]) == 3 and facts["agents"] == "idle, noop"
    assert facts["failure_rate"] == "0.0% of 5" and facts["pass_rate"] == "100.0%"
    low, high = per_min_bounds(5, before, after)
    assert low <= float(facts["done_per_min"]) <= high
    assert row_cells(ev, "curve", "data-version", "0") == {"n": "5", "mean_reward": "1.000", "pass_rate": "100.0%"}


async def test_the_runs_list_newest_first_with_progress_and_rates(farm):
    settings, r, client, got, worker, beat = farm
    keys = settings.keys
    # a run that settled 2 rollouts 30 minutes ago: in the window, out of the rates
    r.hset(keys.history("noop", history.minute() - 30), mapping={"run:old:done": 2, "run:old:failed": 1})
    with TestClient(create_app(settings, r)) as web:
        before = time.time()
        page = web.get("/runs").text
        after = time.time()
    order = re.findall(r'<tr data-run="([^"]+)">', page)
    assert set(order) == {"eval", "train", "old"}
    assert order[0] == "eval" and order[-1] == "old", "open tasks first, the oldest last"
    train = row_cells(page, "runs-list", "data-run", "train")
    n_ok = sum(x.ok for x in got.values() if x.run_id == "train")
    assert (train["done"], train["failed"], train["cancelled"], train["open"]) == (str(n_ok), "4", "1", "0")
    assert train["progress"] == "18 of 18" and train["last"] in ("0 min ago", "1 min ago")
    low, high = per_min_bounds(n_ok, before, after)
    assert low <= float(train["done_per_min"]) <= high
    ev = row_cells(page, "runs-list", "data-run", "eval")
    assert ev["progress"] == "5 of 8" and ev["open"] == "3" and ev["last"] == "now" and ev["agents"] == "idle, noop"
    old = row_cells(page, "runs-list", "data-run", "old")
    assert old["progress"] == "3 of 3" and old["done_per_min"] == "0.0" and old["last"] in ("30 min ago", "31 min ago")
    assert 'href="/runs/train"' in page and 'href="/runs/eval"' in page


async def test_a_hostile_run_id_is_text_and_an_unknown_one_a_404_that_names_nothing(farm):
    settings, r, client, got, worker, beat = farm
    keys = settings.keys
    r.hset(keys.history("noop", history.minute()), mapping={f"run:{HOSTILE}:done": 2, f"runpv:{HOSTILE}:7:n": 2})
    r.hset(keys.history("noop", history.minute()), mapping={f"runpv:{HOSTILE}:7:reward": 1.0})
    with TestClient(create_app(settings, r)) as web:
        listing = web.get("/runs").text
        assert HOSTILE not in listing and "&lt;script&gt;document.title=&#39;pwned&#39;&lt;/script&gt;" in listing
        link = "/runs/" + urllib.parse.quote(HOSTILE, safe="")
        assert f'href="{link}"' in listing, "the whole id in one quoted path segment"
        page = web.get(link)
        assert page.status_code == 200 and HOSTILE not in page.text and "<img src=x" not in page.text
        assert "&lt;img src=x onerror=alert(1)&gt;" in page.text.split('id="run-id"')[1].split("</span>")[0]
        assert row_cells(page.text, "curve", "data-version", "7") == {
            "n": "2",
            "mean_reward": "0.500",
            "pass_rate": "0.0%",
        }
        for unknown in ("nope", "<b>nope-" + "x" * 20 + "</b>"):
            for accept in ("text/html", "application/json"):
                resp = web.get("/runs/" + urllib.parse.quote(unknown, safe=""), headers={"accept": accept})
                assert resp.status_code == 404 and "nope" not in resp.text, resp.text
        assert "no such run" in web.get("/runs/nope", headers={"accept": "text/html"}).text
        gone = web.get("/workers/noop@nowhere:1:abcdef")
        assert gone.status_code == 404 and "nowhere" not in gone.text
        assert web.get("/workers/").status_code == 404


async def test_a_worker_page_is_its_heartbeat_and_its_dead_letters(farm):
    settings, r, client, got, worker, beat = farm
    keys = settings.keys
    # a dead letter of another worker of the same agent: not this worker's failure
    r.xadd(keys.dead("noop"), {"kind": "timeout", "reason": "elsewhere", "worker": "noop@other:1:000000", "at": 1})
    with TestClient(create_app(settings, r)) as web:
        listing = web.get("/workers")
        page = web.get("/workers/" + urllib.parse.quote(worker.worker_id, safe=""), headers={"accept": "text/html"})
    held = beat()
    assert listing.status_code == 200 and page.status_code == 200, page.text
    facts = cells(page.text, 'id="worker-facts"', "</dl>")
    assert facts["agent"] == held["agent"] == "noop"
    for k in ("host", "pid", "concurrency", "inflight", "version"):
        assert facts[k] == str(held[k]), k
    assert facts["concurrency"] == "4" and facts["inflight"] == "0"
    assert re.fullmatch(r"\d+\.\d s ago", facts["ts"]) and float(facts["ts"].split()[0]) <= settings.heartbeat_ttl_s
    assert facts["started_at"].startswith(str(int(held["started_at"])))
    counters = cells(page.text, 'id="counters"', "</table>")
    numbers = {k: v for k, v in held.items() if k not in {"pid", "concurrency", "inflight", "started_at", "ts"}}
    numbers = {k: str(v) for k, v in numbers.items() if isinstance(v, (int, float))}
    assert counters == numbers and counters["cancelled"] == "1"
    assert int(counters["done"]) == sum(x.ok for x in got.values())
    mine = [
        (i.decode(), f[b"kind"].decode())
        for i, f in r.xrange(keys.dead("noop"))
        if f[b"worker"] == worker.worker_id.encode()
    ]
    assert mine and ("agent_error" in {k for _, k in mine}), "the task that failed always was dead-lettered by it"
    failures = page.text.split('id="worker-failures"')[1].split("</table>")[0]
    assert sorted(re.findall(r'<tr data-id="([^"]+)">', failures)) == sorted(i for i, _ in mine)
    assert "elsewhere" not in failures and "timeout" not in failures


@pytest.mark.slow
def test_the_run_and_worker_pages_fit_a_wide_and_a_phone_screen(redis_url, namespace, tmp_path):
    """In a real Chromium at 1,400, 1,024 and 390 px: the runs list, a run's page and a worker's page have no
    page-wide sideways scroll; a hostile run id is text (the title is not taken over)."""
    executable = browser_path()
    from playwright.sync_api import sync_playwright

    settings = make_settings(redis_url, namespace)
    r = redis.Redis.from_url(redis_url)
    port = free_port()
    procs = [
        farm_process(["worker", "--agent", "noop"], redis_url, namespace, tmp_path / "w.log", FARM_MAX_ATTEMPTS="1"),
        farm_process(["dashboard", "--port", str(port)], redis_url, namespace, tmp_path / "dash.log"),
    ]
    base = f"http://127.0.0.1:{port}"
    long_run = "a-training-run-with-a-very-long-name-" + "x" * 60

    async def submit() -> None:
        c = FarmClient(settings)
        rows = [({"noop": {"reward": x / 4}}, v) for v in range(1, 6) for x in range(v)]
        rows += [({"noop": {"fail": "always"}}, 5)] * 2
        await c.submit([c.task(run_id=long_run, agent="noop", row=row, policy_version=v) for row, v in rows])
        await c.aclose()

    try:
        asyncio.run(submit())
        r.hset(settings.keys.history("noop", history.minute()), mapping={f"run:{HOSTILE}:done": 1})
        wait_for(
            lambda: counted(r, settings, long_run) == {"done": 15.0, "failed": 2.0, "cancelled": 0.0},
            timeout=60,
            what="the worker to settle and count every rollout",
        )
        beats = wait_for(lambda: list(r.scan_iter(f"{namespace}:worker:*")), timeout=30, what="the heartbeat")
        worker_id = json.loads(r.get(beats[0]))["worker_id"]
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
            for width in (1400, 1024, 390):
                page = browser.new_page(viewport={"width": width, "height": 800})
                wait_for(
                    lambda: page_ready(page, base + "/runs", "#runs-list"), timeout=60, every=0.5, what="the dashboard"
                )
                assert page.title() != "pwned" and HOSTILE in page.inner_text("#runs-list")
                _fits(page, width)
                page.click(f'#runs-list tr[data-run="{long_run}"] a')
                page.wait_for_selector("#curve")
                assert page.inner_text("#run-id") == long_run
                assert len(page.query_selector_all("#curve tbody tr")) == 5, "versions 1 to 5 have rewards"
                assert page.query_selector_all("svg.chart") and page.inner_text('#run-facts dd[data-k="failed"]') == "2"
                _fits(page, width)
                page.goto(base + "/runs/" + urllib.parse.quote(HOSTILE, safe=""))
                assert page.inner_text("#run-id") == HOSTILE and page.title() != "pwned"
                _fits(page, width)
                page.goto(base + "/workers/" + urllib.parse.quote(worker_id, safe=""))
                assert page.inner_text("#worker-id") == worker_id
                assert len(page.query_selector_all("#worker-failures tbody tr[data-id]")) == 2
                _fits(page, width)
                page.close()
            browser.close()
    finally:
        stop_all(procs)
        r.close()


def _fits(page, width: int) -> None:
    """No sideways scroll of the page body: the document is no wider than the viewport."""
    scroll = page.evaluate("() => document.documentElement.scrollWidth")
    assert fits_width(page), f"{page.url} is {scroll} px wide at {width} px"
