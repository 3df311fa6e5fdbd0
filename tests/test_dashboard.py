"""The dashboard's numbers, pages, write actions and /metrics, against a farm the test runs.

Real workers (the noop agent on two streams) settle real tasks through Redis; every number on
the overview is then checked against what the collected rollouts say, computed here
independently (rates over the window, percentiles from the sorted latencies).
"""

from __future__ import annotations

import math
import re
import time

import pytest
import redis
from fastapi.testclient import TestClient
from helpers.redis import make_settings
from helpers.waiting import async_wait_for, wait_for
from helpers.workers import in_process_worker
from prometheus_client.parser import text_string_to_metric_families

from farm import deadletters, schema
from farm.client import FarmClient
from farm.dashboard import data
from farm.dashboard.app import CSRF_COOKIE, create_app
from farm.history import LATENCY_EDGES_S, latency_bin
from farm.status import collect_status

HOSTILE = "<script>document.title='pwned'</script><img src=x onerror=alert(1)>"


def within_the_bin_of(latencies: list[float], q: float, estimate: float) -> bool:
    """Whether an estimated q-quantile lies in the bin of the true one (the sorted values' own)."""
    ordered = sorted(latencies)
    i = latency_bin(ordered[max(0, math.ceil(q * len(ordered)) - 1)])
    lower = LATENCY_EDGES_S[i - 1] if i > 0 else 0.0
    return lower <= estimate <= LATENCY_EDGES_S[min(i, len(LATENCY_EDGES_S) - 1)]


@pytest.fixture
async def farm(redis_url, namespace):
    """Two agents worked by real workers, one agent with work and no worker, and what they returned."""
    settings = make_settings(redis_url, namespace, max_attempts=1, sample_every=1, dashboard_token="s3cret")
    client = FarmClient(settings)
    good = (
        [{"noop": {"reward": 1.0, "tokens": 20, "sleep_s": 0.02}}] * 10
        + [{"noop": {"reward": 0.0, "sleep_s": 0.3}}] * 5
        + [{"noop": {"fail": "fatal"}}] * 3
        + [{"noop": {"reward": 1.0}, "responses_create_params": {"input": HOSTILE}}]
    )
    tasks = [client.task(run_id="dash", agent="noop", row=r) for r in good]
    flaky = [client.task(run_id="dash", agent="flaky", row={"noop": {"fail": "always"}}) for _ in range(4)]
    idle = [client.task(run_id="dash", agent="idle", row={}) for _ in range(6)]
    async with in_process_worker(settings, concurrency=4), in_process_worker(settings, agent="flaky"):
        await client.submit(tasks + flaky + idle, check_agents=False)  # `idle`: no worker, on purpose
        got = await client.collect(tasks + flaky, timeout_s=60)
        r = redis.Redis.from_url(redis_url)
        live = data.overview(r, settings.keys)
    await client.aclose()
    yield settings, r, got, tasks, flaky, live
    r.close()


async def test_every_overview_number_matches_the_rollouts(farm):
    settings, r, got, tasks, flaky, live = farm
    now = time.time()
    view = data.overview(r, settings.keys, now=now)
    _, span = data.history.window(now, data.OVERVIEW_MINUTES)
    noop = view["agents"]["noop"]
    mine = [got[t.task_id] for t in tasks]
    ok = [x for x in mine if x.ok]
    rewarded = [x.reward for x in mine if x.reward is not None]
    assert noop["done_per_min"] == pytest.approx(len(ok) / span)
    assert noop["failed_per_min"] == pytest.approx(3 / span)
    assert noop["failure_rate"] == pytest.approx(3 / len(mine))
    assert noop["failures_by_kind"] == {"verifier": 3}
    assert noop["mean_reward"] == pytest.approx(sum(rewarded) / len(rewarded))
    assert noop["pass_rate"] == pytest.approx(sum(x >= 1.0 for x in rewarded) / len(rewarded))
    latencies = [x.timings.total_s for x in mine]
    assert within_the_bin_of(latencies, 0.5, noop["latency_p50_s"]), (sorted(latencies), noop["latency_p50_s"])
    assert within_the_bin_of(latencies, 0.99, noop["latency_p99_s"]), (sorted(latencies), noop["latency_p99_s"])
    assert noop["latency_p99_s"] >= 0.25, "the 0.3 s rollouts are in the tail"
    assert noop["tokens_per_s"] == pytest.approx(10 * 20 / (span * 60))
    assert (noop["queued"], noop["in_flight"], noop["delayed"], noop["dead"]) == (0, 0, 0, 0)
    assert noop["counters"]["done"] == len(ok) and noop["counters"]["failed"] == 3

    fl = view["agents"]["flaky"]
    assert fl["dead"] == 4 and fl["failures_by_kind"] == {"agent_error": 4} and fl["failure_rate"] == 1.0
    assert fl["mean_reward"] is None and fl["pass_rate"] is None
    idle = view["agents"]["idle"]
    assert (idle["queued"], idle["in_flight"], idle["live_workers"], idle["done_per_min"]) == (6, 0, 0, 0.0)
    assert idle["failure_rate"] is None, "no rollout ended: no failure rate (it said 0.0%)"
    assert live["agents"]["noop"]["live_workers"] == 1 and live["agents"]["flaky"]["live_workers"] == 1
    assert view["workers"] == [], "the heartbeats left with the workers"


async def test_pages_api_and_metrics(farm):
    settings, r, got, tasks, flaky, live = farm
    with TestClient(create_app(settings, r)) as web:
        api = web.get("/api/overview").json()
        assert set(api["agents"]) == {"noop", "flaky", "idle"} and api["agents"]["idle"]["queued"] == 6
        home = web.get("/")
        assert home.status_code == 200 and "default-src 'self'" in home.headers["content-security-policy"]
        assert 'data-agent="noop"' in home.text and "script-src 'self'" in home.headers["content-security-policy"]
        idle_row = home.text.split('data-agent="idle"')[1].split("</tr>")[0]
        assert '<td data-k="failure_rate">-</td>' in idle_row, idle_row
        assert web.get("/agents/noop").text.count("<svg") == 5
        assert web.get("/workers").status_code == 200
        hist = web.get("/api/history/noop?minutes=5").json()["points"]
        assert sum(p["done"] for p in hist) == sum(x.ok for x in got.values() if x.agent_ref.name == "noop")

        families = {f.name: f for f in text_string_to_metric_families(web.get("/metrics").text)}
        depth = {s.labels["agent"]: s.value for s in families["farm_queue_depth"].samples}
        assert depth == {"noop": 0.0, "flaky": 0.0, "idle": 6.0}
        dead = {s.labels["agent"]: s.value for s in families["farm_dead_letters"].samples}
        assert dead["flaky"] == 4.0
        done = {(s.labels["agent"], s.labels["status"]): s.value for s in families["farm_rollouts"].samples}
        assert done[("noop", "done")] == 16.0 and done[("flaky", "dead")] == 4.0
        kinds = {(s.labels["agent"], s.labels["kind"]) for s in families["farm_failures_per_minute"].samples}
        assert ("noop", "verifier") in kinds and ("flaky", "agent_error") in kinds


async def test_model_output_renders_as_text(farm):
    settings, r, got, tasks, flaky, live = farm
    with TestClient(create_app(settings, r)) as web:
        listing = web.get("/rollouts/noop").text
        ids = re.findall(r'href="/rollouts/noop/([^"]+)"', listing)
        assert ids
        pages = [web.get(f"/rollouts/noop/{i}").text for i in ids]
        hostile = [p for p in pages if "pwned" in p]
        assert hostile, "the rollout holding HTML was sampled"
        assert "<script>document.title" not in hostile[0] and "<img src=x" not in hostile[0]
        assert "&lt;script&gt;document.title=&#39;pwned&#39;&lt;/script&gt;" in hostile[0]


async def test_write_actions_need_the_token_and_the_form_of_this_dashboard(farm):
    settings, r, got, tasks, flaky, live = farm
    with TestClient(create_app(settings, r)) as web:
        page = web.get("/dead/flaky")
        csrf = web.cookies.get(CSRF_COOKIE)
        assert page.status_code == 200 and csrf and f'value="{csrf}"' in page.text
        letter = re.findall(r'<tr data-id="([^"]+)">', page.text)[0]
        refused = [
            ({"csrf": csrf, "token": "wrong", "ids": letter}, "wrong dashboard token"),
            ({"csrf": "forged", "token": "s3cret", "ids": letter}, "CSRF"),
            ({"token": "s3cret", "ids": letter}, "CSRF"),
        ]
        for form, reason in refused:
            resp = web.post("/dead/flaky/requeue", data=form, follow_redirects=False)
            assert resp.status_code == 403 and reason in resp.text
        assert web.get("/dead/flaky/requeue").status_code == 404, "write actions are POST only"
        detail = web.get(f"/dead/flaky/{letter}")
        assert detail.status_code == 200 and "agent_error" in detail.text and "noop told to fail" in detail.text
        assert "&#34;fail&#34;: &#34;always&#34;" in detail.text, "the task, as escaped JSON"
        assert 'id="requeue-one"' in detail.text and 'id="purge-one"' in detail.text, "a letter's own actions"
        assert all(t.task_id in page.text for t in flaky), "whole task ids in the list"
        assert r.xlen(settings.keys.dead("flaky")) == 4
        ok = web.post(
            "/dead/flaky/requeue", data={"csrf": csrf, "token": "s3cret", "ids": letter}, follow_redirects=False
        )
        assert ok.status_code == 303 and r.xlen(settings.keys.dead("flaky")) == 3
        assert r.xlen(settings.keys.tasks("flaky")) == 1
        purged = web.post(
            "/dead/flaky/purge", data={"csrf": csrf, "token": "s3cret", "all": "yes"}, follow_redirects=True
        )
        assert "purged 3" in purged.text and r.xlen(settings.keys.dead("flaky")) == 0

    with TestClient(create_app(make_settings(settings.redis_url, settings.namespace), r)) as closed:
        shown = closed.get("/dead/flaky").text
        assert "<form" not in shown and 'name="token"' not in shown, "no controls that cannot work"
        assert "Requeue and purge are disabled" in shown
        resp = closed.post(
            "/dead/flaky/purge", data={"csrf": closed.cookies.get(CSRF_COOKIE), "token": "", "all": "yes"}
        )
        assert resp.status_code == 403 and "write actions are disabled" in resp.text


def test_a_redis_that_is_down_is_one_line(namespace):
    settings = make_settings("redis://127.0.0.1:1/0", namespace, redis_down_max_s=0.5)
    with TestClient(create_app(settings)) as web:
        resp = web.get("/api/overview")
    assert resp.status_code == 503 and resp.text.startswith("farm dashboard: ") and "\n" not in resp.text.strip()


def named(r: redis.Redis, name: str) -> int:
    """Connections Redis holds under this client name (redis-py names them from the URL's client_name)."""
    return sum(1 for c in r.client_list() if c.get("name") == name)


def test_the_redis_client_is_closed_when_the_app_shuts_down(redis_url, namespace):
    sep = "&" if "?" in redis_url else "?"
    own, lent = f"{namespace}-dashboard", f"{namespace}-caller"
    observer = redis.Redis.from_url(redis_url)
    with TestClient(create_app(make_settings(f"{redis_url}{sep}client_name={own}", namespace))) as web:
        assert web.get("/healthz").json() == {"ok": True}
        assert named(observer, own) == 1
    wait_for(lambda: named(observer, own) == 0, timeout=5, what="the dashboard's Redis connection to close")

    caller = redis.Redis.from_url(f"{redis_url}{sep}client_name={lent}")
    with TestClient(create_app(make_settings(redis_url, namespace), caller)) as web:
        assert web.get("/healthz").status_code == 200
    assert named(observer, lent) == 1, "a client the caller passed in is the caller's to close"
    caller.close()
    observer.close()


async def test_an_unknown_agent_is_a_404_that_names_the_known_ones(farm):
    """/agents/nosuch and /dead/nosuch answered 200 with empty content: a typo looked like an agent
    with nothing yet."""
    settings, r, *_ = farm
    with TestClient(create_app(settings, r)) as web:
        for path in ("/agents/nosuch", "/dead/nosuch", "/rollouts/nosuch", "/api/history/nosuch", "/dead/nosuch/1-0"):
            resp = web.get(path)
            assert resp.status_code == 404, (path, resp.status_code)
            assert "no agent 'nosuch'" in resp.text and "flaky, idle, noop" in resp.text, (path, resp.text)
        for path in ("/agents/noop", "/dead/flaky", "/rollouts/noop", "/api/history/idle"):
            assert web.get(path).status_code == 200, path


async def test_people_get_pages_and_machines_get_json_for_errors(farm):
    """A 404, a bad `?minutes=abc` and a refused write answered raw JSON to a browser."""
    settings, r, *_ = farm
    html = {"accept": "text/html,application/xhtml+xml"}
    with TestClient(create_app(settings, r)) as web:
        missing = web.get("/agents/nosuch", headers=html)
        assert missing.status_code == 404 and missing.headers["content-type"].startswith("text/html")
        assert "Not Found" in missing.text and "no agent &#39;nosuch&#39;" in missing.text
        bad = web.get("/agents/noop?minutes=abc", headers=html)
        assert bad.status_code == 400 and bad.headers["content-type"].startswith("text/html") and "minutes" in bad.text
        web.get("/dead/flaky", headers=html)
        form = {"csrf": web.cookies.get(CSRF_COOKIE), "token": "wrong", "ids": "1-0"}
        refused = web.post("/dead/flaky/requeue", data=form, headers=html)
        assert refused.status_code == 403 and "wrong dashboard token" in refused.text and "<h1>" in refused.text
        api = web.get("/api/history/noop?minutes=abc", headers=html)
        assert api.status_code == 400 and api.json()["detail"].startswith("bad request: minutes")
        assert web.get("/agents/nosuch").json()["detail"].startswith("no agent 'nosuch'")


def metric(families: dict, name: str) -> dict:
    return {tuple(sorted(s.labels.items())): s.value for s in families[name].samples}


async def test_status_the_overview_and_metrics_count_the_same(farm):
    """`farm status --json` said lag None (shown "-") for a stream no worker had read, where the
    overview said 1; in flight was `pending` there and not in /metrics' help."""
    settings, r, *_ = farm
    now = time.time()
    view = data.overview(r, settings.keys, now=now)["agents"]
    status = collect_status(r, settings.keys, now=now)["agents"]
    with TestClient(create_app(settings, r)) as web:
        families = {f.name: f for f in text_string_to_metric_families(web.get("/metrics").text)}
    assert set(view) == set(status) == {"noop", "flaky", "idle"}
    assert (status["idle"]["lag"], view["idle"]["lag"]) == (1, 1), "no worker ever read idle's stream"
    # the group's lag is nil once settles XDEL entries (and on Redis 6.2 always): `farm status` said "-"
    assert {a: s["lag"] for a, s in status.items()} == {a: v["lag"] for a, v in view.items()}
    gauges = {
        "queued": "farm_queue_depth",
        "lag": "farm_stream_lag",
        "in_flight": "farm_in_flight",
        "delayed": "farm_delayed_retries",
        "dead": "farm_dead_letters",
    }
    for agent, a in view.items():
        s = status[agent]
        for key, name in gauges.items():
            assert s[key] == a[key] == metric(families, name)[(("agent", agent),)], (agent, key)
        assert s["pending"] == a["in_flight"] and a["queued"] == a["backlog"] + a["lag"]
        runs = [{k: x[k] for k in ("run_id", "queued", "in_flight", "share", "cap")} for x in a["runs"]]
        assert runs == [{k: x[k] for k in ("run_id", "queued", "in_flight", "share", "cap")} for x in s["runs"]]
        ended = metric(families, "farm_rollouts_ended")[(("agent", agent),)]
        assert ended == a["rollouts"]


def test_a_failure_rate_says_its_denominator():
    assert data.failure_rate_text(0, 0) == "-"
    assert data.failure_rate_text(1, 1) == "1 of 1"
    assert data.failure_rate_text(3, 19) == "3 of 19"
    assert data.failure_rate_text(1, 40) == "2.5% of 40"


async def test_a_requeued_dead_letter_that_fails_again_is_not_a_100_percent_failure_rate(redis_url, namespace):
    """One re-dead-lettered task showed "failure rate 100.0%" as if all of the agent's traffic failed."""
    settings = make_settings(redis_url, namespace, max_attempts=1)
    client = FarmClient(settings)
    task = client.task(run_id="old", agent="flaky", row={"noop": {"fail": "always"}})
    await client.aclose()
    r = redis.Redis.from_url(redis_url)
    dead = settings.keys.dead("flaky")
    # a letter that died an hour ago: its first failure is long out of the overview's window
    letter = {"kind": "agent_error", "reason": "failed 1 attempts", "agent": "flaky", "attempts": 1}
    r.xadd(dead, {**schema.entry(task), **letter, "worker": "gone", "at": time.time() - 3600, "entry_id": "1-0"})
    r.sadd(settings.keys.agents(), "flaky")
    async with in_process_worker(settings, agent="flaky"):
        assert deadletters.requeue(r, settings.keys, "flaky") == 1
        await async_wait_for(
            lambda: r.xlen(dead) == 1 and data.overview(r, settings.keys)["agents"]["flaky"]["rollouts"] == 1,
            timeout=30,
            what="the requeued task to die again",
        )
    with TestClient(create_app(settings, r)) as web:
        page = web.get("/").text
    cells = page.split('data-agent="flaky"')[1].split("</tr>")[0]
    assert '<td data-k="failure_rate">1 of 1</td>' in cells and "100.0%" not in cells, cells
    row = data.overview(r, settings.keys)["agents"]["flaky"]
    assert (row["failed"], row["rollouts"], row["failure_rate"]) == (1, 1, 1.0)
    assert "failed rollouts over the rollouts that\nended (done + failed)" in page
    r.close()


def test_a_sampled_rollout_shows_its_prompt_escaped(redis_url, namespace):
    """The prompt was never shown; an empty failure label was; the task id is whole."""
    settings = make_settings(redis_url, namespace)
    r = redis.Redis.from_url(redis_url)
    row = {
        "responses_create_params": {"instructions": "Be <b>brief</b>.", "input": [{"role": "user", "content": HOSTILE}]}
    }
    task = schema.Task.new(run_id="collect-4547", agent="noop", row=row, reply_to=settings.keys.results("collect-4547"))
    out = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "4"}]}]
    ro = schema.Rollout.for_task(task, status=schema.Status.ok, reward=1.0, output=out)
    r.sadd(settings.keys.agents(), "noop")
    with_task = r.xadd(settings.keys.samples("noop"), {**schema.entry(ro), b"t": schema.entry(task)[b"d"]}).decode()
    without = r.xadd(settings.keys.samples("noop"), schema.entry(ro)).decode()
    with TestClient(create_app(settings, r)) as web:
        page = web.get(f"/rollouts/noop/{with_task}").text
        older = web.get(f"/rollouts/noop/{without}").text
    prompt = page.split('id="prompt"')[1].split("</ol>")[0]
    assert 'data-role="system"' in prompt and "Be &lt;b&gt;brief&lt;/b&gt;." in prompt
    assert 'data-role="user"' in prompt and "&lt;script&gt;document.title=&#39;pwned&#39;&lt;/script&gt;" in prompt
    assert "<script>document.title" not in page and "<img src=x" not in page
    assert f'<dd id="task-id" class="id">{task.task_id}</dd>' in page
    assert 'id="failure"' not in page, "no failure label on a rollout that did not fail"
    assert 'id="no-prompt"' in older and 'id="prompt"' not in older
    r.close()
