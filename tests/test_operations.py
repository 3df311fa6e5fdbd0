"""Running a farm for days: dead-letter tools, consumers of gone workers removed, summary lines."""

from __future__ import annotations

import asyncio
import json
import logging

import redis
from helpers.redis import make_settings
from helpers.workers import in_process_worker

from farm.cli import main
from farm.client import FarmClient
from farm.deadletters import list_dead, purge, requeue, show_dead
from farm.keys import GROUP
from farm.schema import decode_task


async def _dead_letters(settings, n: int, client: FarmClient) -> list:
    tasks = [client.task(run_id="dl", agent="noop", row={"noop": {"fail": "always"}, "i": i}) for i in range(n)]
    async with in_process_worker(settings, concurrency=2):
        await client.submit(tasks)
        got = await client.collect(tasks, timeout_s=60)
    assert all(r.error.kind == "agent_error" for r in got.values())
    return tasks


async def test_dead_letters_list_show_requeue_and_purge(redis_url, namespace):
    settings = make_settings(redis_url, namespace, max_attempts=1)
    client = FarmClient(settings)
    tasks = await _dead_letters(settings, 4, client)
    r = redis.Redis.from_url(redis_url)
    letters = list_dead(r, settings.keys, "noop", max_entry_bytes=settings.max_entry_bytes)
    assert len(letters) == 4 and {x["task_id"] for x in letters} == {t.task_id for t in tasks}
    assert all(x["kind"] == "agent_error" and "noop told to fail" in x["reason"] for x in letters)
    one = show_dead(r, settings.keys, "noop", letters[0]["id"], max_entry_bytes=settings.max_entry_bytes)
    assert one["task"]["row"]["noop"] == {"fail": "always"} and one["attempts"] == "1"

    # requeue one: it runs again (and dies again, as its row says), the others stay
    assert requeue(r, settings.keys, "noop", [letters[0]["id"]]) == 1
    assert requeue(r, settings.keys, "noop", [letters[0]["id"]]) == 0, "a letter is requeued once"
    assert r.xlen(settings.keys.dead("noop")) == 3 and r.xlen(settings.keys.tasks("noop")) == 1
    async with in_process_worker(settings, concurrency=2):
        for _ in range(200):
            if r.xlen(settings.keys.dead("noop")) == 4:
                break
            await asyncio.sleep(0.05)
    assert r.xlen(settings.keys.dead("noop")) == 4
    assert purge(r, settings.keys, "noop", [letters[1]["id"]]) == 1
    assert purge(r, settings.keys, "noop") == 3 and r.xlen(settings.keys.dead("noop")) == 0
    await client.aclose()
    r.close()


async def test_farm_dead_commands(redis_url, namespace, capsys, monkeypatch):
    settings = make_settings(redis_url, namespace, max_attempts=1)
    client = FarmClient(settings)
    await _dead_letters(settings, 3, client)
    await client.aclose()
    base = ["--redis-url", redis_url, "--namespace", namespace, "dead"]
    assert main([*base, "list", "--agent", "noop", "--json"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert len(lines) == 3 and all(x["kind"] == "agent_error" for x in lines)
    assert main([*base, "list", "--agent", "noop"]) == 0
    out = capsys.readouterr().out
    assert "3 dead letter(s) for 'noop'" in out and "agent_error" in out and max(map(len, out.splitlines())) <= 80
    assert lines[0]["at_iso"][:19].replace("T", " ") in out  # the when its help promises...
    assert lines[0]["reason"] in " ".join(out.split()), out  # ...and the whole reason, on its own lines
    monkeypatch.setenv("COLUMNS", "160")  # a wide terminal: the table uses it, nothing is cut
    assert main([*base, "list", "--agent", "noop"]) == 0
    wide = capsys.readouterr().out
    assert 80 < max(map(len, wide.splitlines())) <= 160, wide
    assert lines[0]["reason"] in wide and lines[0]["task_id"] in wide, wide
    assert main([*base, "show", "--agent", "noop", lines[0]["id"]]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == lines[0]["id"]
    assert main([*base, "requeue", "--agent", "noop", lines[0]["id"]]) == 0
    assert "requeued 1 task(s)" in capsys.readouterr().out
    assert main([*base, "purge", "--agent", "noop", "--all"]) == 0
    assert "purged 2 dead letter(s)" in capsys.readouterr().out


async def test_consumers_of_gone_workers_are_removed_once_they_hold_nothing(redis_url, namespace):
    settings = make_settings(redis_url, namespace, consumer_idle_s=0.3, visibility_timeout_s=60)
    r = redis.Redis.from_url(redis_url)
    stream = settings.keys.tasks("noop")
    r.xgroup_create(stream, GROUP, id="0", mkstream=True)
    r.xadd(stream, {"v": b"1", "d": b"x"})
    r.xreadgroup(GROUP, "gone-with-work", {stream: ">"}, count=1)  # holds a pending entry
    r.xreadgroup(GROUP, "gone-idle", {stream: ">"}, count=1)  # holds nothing
    await asyncio.sleep(0.5)
    async with in_process_worker(settings, concurrency=1):
        for _ in range(100):
            names = {c["name"].decode() for c in r.xinfo_consumers(stream, GROUP)}
            if "gone-idle" not in names:
                break
            await asyncio.sleep(0.05)
    assert "gone-idle" not in names, "a consumer with nothing pending, idle past consumer_idle_s, is removed"
    assert "gone-with-work" in names, "one that still holds an entry is kept (its entry is reclaimed, not lost)"
    r.close()


async def test_a_worker_logs_a_summary_line_every_summary_every_s(redis_url, namespace, caplog):
    settings = make_settings(redis_url, namespace, summary_every_s=0.2)
    client = FarmClient(settings)
    tasks = [client.task(run_id="sum", agent="noop", row={}) for _ in range(10)]
    with caplog.at_level(logging.INFO, logger="farm.worker"):
        async with in_process_worker(settings, concurrency=4):
            await client.submit(tasks)
            await client.collect(tasks, timeout_s=60)
            await asyncio.sleep(0.5)
    await client.aclose()
    lines = [r.getMessage() for r in caplog.records if "rollouts/s" in r.getMessage()]
    assert lines and "done 10, failed 0, cancelled 0, dead 0, retried 0, in flight 0" in lines[-1], lines


async def test_a_requeued_task_starts_over_with_all_its_attempts(redis_url, namespace):
    """The letter holds the attempt the task died on; requeued as it was, a task with max_attempts=2
    ran once more and died again. Requeued, it runs both attempts again: one more retry counted."""
    settings = make_settings(redis_url, namespace, max_attempts=2, retry_backoff_s=0.01, retry_backoff_max_s=0.02)
    client = FarmClient(settings)
    await _dead_letters(settings, 1, client)
    r = redis.Redis.from_url(redis_url)
    stats = settings.keys.stats("noop")
    [letter] = list_dead(r, settings.keys, "noop", max_entry_bytes=settings.max_entry_bytes)
    assert letter["attempts"] == "2" and int(r.hget(stats, "retried")) == 1
    assert requeue(r, settings.keys, "noop") == 1
    [(_, fields)] = r.xrange(settings.keys.tasks("noop"))
    assert decode_task(fields).attempt == 1
    async with in_process_worker(settings, concurrency=2):
        for _ in range(200):
            if r.xlen(settings.keys.dead("noop")) == 1:
                break
            await asyncio.sleep(0.05)
    [again] = list_dead(r, settings.keys, "noop", max_entry_bytes=settings.max_entry_bytes)
    assert again["attempts"] == "2" and int(r.hget(stats, "retried")) == 2
    await client.aclose()
    r.close()
