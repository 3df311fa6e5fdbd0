"""Finding things on the dashboard (farm.dashboard.routes_find, data_find), against real workers.

Real workers (the noop agent, in this test's event loop) run tasks that pass at once, pass on their
third attempt, fail without retry, time out, or fail every attempt (dead letters), on two agents and
two runs, in whole GRPO groups; the pages are then checked against what the client collected:
a task's attempts (worker, time, error), a dead letter's, search by each kind of id, a group's
rewards and advantages (computed here), filters and pages that return exactly the matching items,
hostile ids shown as text. The real-browser check of /find and /groups at 1,400 and 390 px is last.
"""

from __future__ import annotations

import asyncio
import math
import re
import uuid
import zlib
from html.parser import HTMLParser
from urllib.parse import quote

import msgspec
import pytest
import redis
from fastapi.testclient import TestClient
from helpers.browser import browser_path, fits_width, page_ready
from helpers.processes import farm_process
from helpers.redis import make_settings
from helpers.waiting import wait_for
from helpers.workers import in_process_worker

from farm import deadletters
from farm.client import FarmClient
from farm.dashboard.app import create_app
from farm.embedded import free_port

HOSTILE_GROUP = "<img src=x onerror=\"document.title='pwned'\">"
HOSTILE_TASK = "</td><script>document.title='pwned'</script>"
G4_REWARDS = [1.0, 0.0, 0.25, 0.75]


class Tables(HTMLParser):
    """The body rows of every <table id=...>: each row's attributes, its cells' text and attributes."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, list[dict]] = {}
        self.table: list | None = None
        self.body = False
        self.cell: dict | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self.table = self.tables.setdefault(a.get("id") or "", [])
        elif tag == "tbody":
            self.body = True
        elif tag == "tr" and self.body and self.table is not None:
            self.table.append({"attrs": a, "cells": []})
        elif tag == "td" and self.body and self.table:
            self.cell = {"attrs": a, "text": ""}
            self.table[-1]["cells"].append(self.cell)

    def handle_endtag(self, tag):
        if tag == "tbody":
            self.body = False
        elif tag == "table":
            self.table = None
        elif tag == "td":
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell["text"] += data


def rows(html: str, table: str) -> list[dict]:
    """Rows of one table: {attrs, cells, k: {data-k: (text, attrs)}}; a missing table has none."""
    out = Tables(html).tables.get(table, [])
    for row in out:
        row["k"] = {
            c["attrs"]["data-k"]: (c["text"].strip(), c["attrs"]) for c in row["cells"] if "data-k" in c["attrs"]
        }
    return out


def task_ids(html: str, table: str) -> list[str]:
    return [r["attrs"]["data-task"] for r in rows(html, table) if "data-task" in r["attrs"]]


def advantages(rewards: list[float]) -> list[float]:
    """GRPO's, as the page says: (r - mean) / population std; r - mean when std is 0."""
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    return [(r - mean) / std if std > 0 else r - mean for r in rewards]


@pytest.fixture
async def kept(redis_url, namespace):
    """Two agents' sampled rollouts and dead letters (sample_every=1), and what the client collected."""
    settings = make_settings(
        redis_url, namespace, max_attempts=3, sample_every=1, task_timeout_s=0.5, dashboard_token="s3cret"
    )
    client = FarmClient(settings)

    def task(run: str, spec: dict, agent: str = "noop", **kw):
        return client.task(run_id=run, agent=agent, row={"noop": spec}, **kw)

    g4, same = uuid.uuid4().hex, uuid.uuid4().hex
    t = {
        "retried": [task("find-a", {"fail": 2, "reward": 0.75}) for _ in range(2)],
        "always": [task("find-a", {"fail": "always"}) for _ in range(2)],
        "slow": [task("find-a", {"sleep_s": 3})],
        "fatal": [task("find-a", {"fail": "fatal"}) for _ in range(2)],
        "g4": [task("find-a", {"reward": x}, group_id=g4, sample_index=i) for i, x in enumerate(G4_REWARDS)],
        "same": [task("find-a", {"reward": 0.5}, group_id=same, sample_index=i) for i in range(3)]
        + [task("find-a", {"fail": "always"}, group_id=same, sample_index=3)],
        "other": [task("find-b", {"reward": 0.25}, agent="other") for _ in range(3)]
        + [
            msgspec.structs.replace(
                task("find-b", {"reward": 1.0}, agent="other", group_id=HOSTILE_GROUP), task_id=HOSTILE_TASK
            )
        ],
    }
    every = [x for group in t.values() for x in group]
    async with in_process_worker(settings, concurrency=8) as w, in_process_worker(settings, agent="other"):
        await client.submit(every, check_agents=False)  # `other`'s worker may not have beaten its heart yet
        got = await client.collect(every, timeout_s=60)
        worker = w.worker_id
    await client.aclose()
    r = redis.Redis.from_url(redis_url)
    dead = {t["always"][0].task_id, t["always"][1].task_id, t["slow"][0].task_id, t["same"][3].task_id}
    yield settings, r, t, got, dead, worker, (g4, same)
    r.close()


def letter_of(r, settings, agent: str, task_id: str) -> str:
    letters = deadletters.list_dead(r, settings.keys, agent, 100, max_entry_bytes=settings.max_entry_bytes)
    return next(x["id"] for x in letters if x["task_id"] == task_id)


async def test_a_retried_task_and_a_dead_letter_show_every_attempt(kept):
    settings, r, t, got, dead, worker, _ = kept
    retried = t["retried"][0]
    assert [a.attempt for a in got[retried.task_id].history] == [1, 2], "the rollout carries its attempts"
    with TestClient(create_app(settings, r)) as web:
        page = web.get(f"/tasks/{retried.task_id}")
        assert page.status_code == 200
        shown = rows(page.text, "attempts")
        earlier = [x for x in shown if x["attrs"]["class"] == "earlier"]
        assert [x["cells"][0]["text"] for x in earlier] == ["1", "2"]
        assert all(x["k"]["worker"][0] == worker for x in shown)
        for n, x in enumerate(earlier, 1):
            assert x["k"]["error"][0] == f"RuntimeError: noop told to fail (attempt {n})"
            assert x["k"]["kind"][0] == "agent_error" and re.match(r"\d{4}-\d\d-\d\dT", x["cells"][2]["text"])
        final = [x for x in shown if x["attrs"]["class"] == "final"]
        assert [(x["cells"][0]["text"], x["k"]["kind"][0]) for x in final] == [("3", "ok")]

        always = t["always"][0].task_id
        letter = web.get(f"/dead/noop/{letter_of(r, settings, 'noop', always)}")
        attempts = rows(letter.text, "attempts")
        assert [x["cells"][0]["text"] for x in attempts] == ["1", "2", "3"], "the last attempt too"
        assert [x["k"]["error"][0] for x in attempts] == [
            f"RuntimeError: noop told to fail (attempt {n})" for n in (1, 2, 3)
        ]
        assert {x["k"]["worker"][0] for x in attempts} == {worker}
        assert len(rows(web.get(f"/tasks/{always}").text, "attempts")) == 3, "the task page shows the letter's"
        slow = web.get(f"/dead/noop/{letter_of(r, settings, 'noop', t['slow'][0].task_id)}")
        assert [x["k"]["kind"][0] for x in rows(slow.text, "attempts")] == ["timeout"] * 3
        assert "attempt ran past 0.5s" in rows(slow.text, "attempts")[0]["k"]["error"][0]


async def test_find_by_task_run_and_group_id_and_nothing_found(kept):
    settings, r, t, got, dead, worker, (g4, same) = kept
    sampled = {tid for tid in got if tid not in dead}
    with TestClient(create_app(settings, r)) as web:
        one = t["retried"][1].task_id
        page = web.get("/find", params={"q": one}).text
        assert task_ids(page, "found-rollouts") == [one] and not task_ids(page, "found-letters")
        assert rows(page, "found-rollouts")[0]["cells"][0]["text"] == "task"
        kept_n = sum(r.xlen(settings.keys.samples(a)) for a in ("noop", "other"))
        dead_n = sum(r.xlen(settings.keys.dead(a)) for a in ("noop", "other"))
        assert f"searched {kept_n} sampled rollout(s) and {dead_n} dead letter(s) of 2 agent(s)" in page

        run_a = {x.task_id for name, group in t.items() if name != "other" for x in group}
        page = web.get("/find", params={"q": "find-a"}).text
        assert sorted(task_ids(page, "found-rollouts")) == sorted(run_a & sampled)
        assert sorted(task_ids(page, "found-letters")) == sorted(run_a & dead)
        page = web.get("/find", params={"q": "find-b"}).text
        assert sorted(task_ids(page, "found-rollouts")) == sorted(x.task_id for x in t["other"])

        page = web.get("/find", params={"q": g4}).text
        assert sorted(task_ids(page, "found-rollouts")) == sorted(x.task_id for x in t["g4"])
        assert f'href="/groups/{g4}"' in page
        page = web.get("/find", params={"q": same}).text
        assert task_ids(page, "found-letters") == [t["same"][3].task_id] and len(task_ids(page, "found-rollouts")) == 3

        for q in ("no-such-id", one[:-1], "find"):
            page = web.get("/find", params={"q": q}).text
            assert 'id="nothing"' in page and "nothing found" in page, q
            assert not task_ids(page, "found-rollouts") and not task_ids(page, "found-letters"), q
        assert web.get("/tasks/no-such-task").status_code == 404
        assert "nothing found" in web.get("/groups/no-such-group").text
        assert web.get("/find", params={"q": "x" * 5000}).status_code == 400


async def test_a_group_of_four_side_by_side_with_its_advantages(kept):
    settings, r, t, got, dead, worker, (g4, same) = kept
    with TestClient(create_app(settings, r)) as web:
        page = web.get(f"/groups/{g4}")
        assert page.status_code == 200
        shown = rows(page.text, "group")
        assert [x["k"]["index"][0] for x in shown] == ["0", "1", "2", "3"]
        rewards = [got[x.task_id].reward for x in t["g4"]]
        assert rewards == G4_REWARDS and [float(x["k"]["reward"][0]) for x in shown] == rewards
        expected = advantages(rewards)
        assert [float(x["k"]["advantage"][1]["data-v"]) for x in shown] == pytest.approx(expected)
        assert [x["k"]["advantage"][0] for x in shown] == [f"{a:+.3f}" for a in expected]
        assert "population" in page.text and "/ group std" in page.text
        links = re.findall(r'href="(/rollouts/noop/[^"]+)"', page.text)
        assert len(links) == 4 and all(web.get(h).status_code == 200 for h in links)

        shown = rows(web.get(f"/groups/{same}").text, "group")
        assert [x["k"]["status"][0] for x in shown] == ["ok", "ok", "ok", "dead"]
        assert [x["k"]["advantage"][0] for x in shown] == ["+0.000"] * 3 + ["-"], "std 0: reward - mean"


async def test_filters_and_pages_return_exactly_the_matching_items(kept):
    settings, r, t, got, dead, worker, _ = kept
    noop = {tid: ro for tid, ro in got.items() if ro.agent_ref.name == "noop" and tid not in dead}
    with TestClient(create_app(settings, r)) as web:

        def listed(path: str, table: str, **params) -> list[str]:
            return task_ids(web.get(path, params=params).text, table)

        assert sorted(listed("/rollouts/noop", "rollouts")) == sorted(noop)
        fatal = sorted(x.task_id for x in t["fatal"])
        assert sorted(listed("/rollouts/noop", "rollouts", status="failed")) == fatal
        assert sorted(listed("/rollouts/noop", "rollouts", kind="verifier")) == fatal
        assert listed("/rollouts/noop", "rollouts", kind="timeout") == []
        middle = sorted(tid for tid, ro in noop.items() if ro.reward is not None and 0.3 <= ro.reward <= 0.8)
        assert (
            len(middle) == 6
            and sorted(listed("/rollouts/noop", "rollouts", reward_min="0.3", reward_max="0.8")) == middle
        )
        assert sorted(listed("/rollouts/other", "rollouts", run="find-b", reward_max="0.5")) == sorted(
            x.task_id for x in t["other"][:3]
        )

        seen: list[str] = []
        for n in range(1, 10):
            page = web.get("/rollouts/noop", params={"per_page": 3, "page": n}).text
            seen += task_ids(page, "rollouts")
            assert len(task_ids(page, "rollouts")) == min(3, len(noop) - 3 * (n - 1))
            if 'id="next"' not in page:
                break
        assert len(seen) == len(noop) and set(seen) == set(noop), "each item on exactly one page"
        assert "page 2 of" in web.get("/rollouts/noop", params={"per_page": 3, "page": 2}).text
        filtered = web.get("/rollouts/noop", params={"status": "ok", "per_page": 2, "page": 2}).text
        assert "status=ok" in re.search(r'id="next" href="([^"]+)"', filtered)[1], "pages keep the filters"

        agent_error = sorted(x.task_id for x in t["always"] + t["same"][3:])

        def dead_rows(**params) -> list[str]:
            found = rows(web.get("/dead/noop", params=params).text, "dead")
            return [x["cells"][4]["text"] for x in found if "data-id" in x["attrs"]]

        assert sorted(dead_rows(kind="agent_error")) == agent_error
        assert dead_rows(kind="timeout") == [t["slow"][0].task_id]
        assert sorted(dead_rows(run="find-a")) == sorted(dead) and dead_rows(run="find-b") == []
        one_each = [dead_rows(per_page=1, page=n) for n in range(1, 6)]
        assert [len(x) for x in one_each] == [1, 1, 1, 1, 0] and {x[0] for x in one_each[:4]} == dead
        assert sorted(sum((dead_rows(kind="agent_error", per_page=2, page=n) for n in (1, 2)), [])) == agent_error

        for path, params in [
            ("/rollouts/noop", {"status": "bogus"}),
            ("/rollouts/noop", {"kind": "gremlins"}),
            ("/rollouts/noop", {"reward_min": "nan"}),
            ("/rollouts/noop", {"reward_max": "lots"}),
            ("/dead/noop", {"kind": "gremlins"}),
            ("/dead/noop", {"page": "two"}),
        ]:
            resp = web.get(path, params=params)
            assert resp.status_code == 400, (path, params)
        assert 'name="per_page" value="200"' in web.get("/rollouts/noop", params={"per_page": 10**6}).text


async def test_hostile_ids_and_searches_stay_text(kept):
    settings, r, t, got, dead, worker, _ = kept
    with TestClient(create_app(settings, r)) as web:
        pages = [
            web.get("/find", params={"q": HOSTILE_GROUP}),
            web.get("/find", params={"q": HOSTILE_TASK}),
            web.get("/find", params={"q": "find-b"}),
            web.get("/groups/" + quote(HOSTILE_GROUP, safe="")),
            web.get("/tasks/" + quote(HOSTILE_TASK, safe="")),
            web.get("/find", params={"q": "<script>alert(1)</script>"}),
            web.get("/rollouts/other"),
        ]
        for page in pages:
            assert page.status_code == 200, page.url
            assert "<script>" not in page.text and "<img src=x" not in page.text, page.url
        assert task_ids(pages[0].text, "found-rollouts") == [HOSTILE_TASK]
        assert task_ids(pages[1].text, "found-rollouts") == [HOSTILE_TASK]
        assert "&lt;img src=x onerror=" in pages[0].text and "&lt;/td&gt;&lt;script&gt;" in pages[1].text
        assert len(rows(pages[3].text, "group")) == 1 and rows(pages[4].text, "attempts")[0]["k"]["kind"][0] == "ok"
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages[5].text and "nothing found" in pages[5].text


async def test_sampling_keeps_whole_groups_chosen_by_their_id(redis_url, namespace):
    """One group in sample_every, all of it: sampling each rollout at random kept parts of groups."""
    settings = make_settings(redis_url, namespace, sample_every=3)
    client = FarmClient(settings)
    groups = [f"grp-{i}" for i in range(12)]
    chosen = {g for g in groups if zlib.crc32(g.encode()) % 3 == 0}
    assert 0 < len(chosen) < len(groups)
    tasks = [
        client.task(run_id="s", agent="noop", row={}, group_id=g, sample_index=i) for g in groups for i in range(4)
    ]
    async with in_process_worker(settings):
        await client.submit(tasks)
        await client.collect(tasks, timeout_s=30)
    await client.aclose()
    r = redis.Redis.from_url(redis_url)
    with TestClient(create_app(settings, r)) as web:
        for g in groups:
            shown = rows(web.get(f"/groups/{g}").text, "group")
            assert len(shown) == (4 if g in chosen else 0), g
    assert r.xlen(settings.keys.samples("noop")) == 4 * len(chosen)
    r.close()


@pytest.mark.slow
def test_find_and_a_group_in_a_real_browser_at_1400_and_390_px(redis_url, namespace, tmp_path):
    executable = browser_path()
    from playwright.sync_api import sync_playwright

    settings = make_settings(redis_url, namespace, sample_every=1, max_attempts=2)
    group = uuid.uuid4().hex

    async def populate() -> None:
        client = FarmClient(settings)
        tasks = [
            client.task(run_id="browse", agent="noop", row={"noop": {"reward": x}}, group_id=group, sample_index=i)
            for i, x in enumerate(G4_REWARDS)
        ] + [client.task(run_id="browse", agent="noop", row={"noop": {"fail": "always"}}, group_id=HOSTILE_GROUP)]
        async with in_process_worker(settings):
            await client.submit(tasks)
            await client.collect(tasks, timeout_s=30)
        await client.aclose()

    asyncio.run(populate())
    port = free_port()
    dash = farm_process(["dashboard", "--port", str(port)], redis_url, namespace, tmp_path / "dash.log")
    base = f"http://127.0.0.1:{port}"
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
            for width in (1400, 390):
                page = browser.new_page(viewport={"width": width, "height": 800})
                wait_for(lambda: page_ready(page, f"{base}/find?q=browse"), timeout=60, every=0.5, what="the dashboard")
                assert len(page.query_selector_all("#found-rollouts tbody tr")) == 4
                assert len(page.query_selector_all("#found-letters tbody tr")) == 1
                assert fits_width(page), f"/find scrolls sideways at {width} px"
                assert page.title() != "pwned" and not page.query_selector("main img")
                page.click(f'#groups a[href="/groups/{group}"]')
                page.wait_for_selector("#group")
                cells = page.query_selector_all('#group td[data-k="advantage"]')
                assert [c.inner_text() for c in cells] == [f"{a:+.3f}" for a in advantages(G4_REWARDS)]
                assert fits_width(page), f"/groups scrolls sideways at {width} px"
                for path in (f"/groups/{quote(HOSTILE_GROUP, safe='')}", "/rollouts/noop", "/dead/noop"):
                    page.goto(base + path)
                    assert fits_width(page), f"{path} scrolls sideways at {width} px"
                    assert page.title() != "pwned"
                page.close()
            browser.close()
    finally:
        dash.terminate()
        dash.wait(30)
