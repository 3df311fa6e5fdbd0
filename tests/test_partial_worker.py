"""Interrupt and resume through Redis and a worker: `FarmClient.interrupt` stops a running rollout,
which settles once as `interrupted` with its partial; `FarmClient.resume` submits a continuation that
another worker finishes token-exactly; run interrupts spare tasks submitted after them; bad resumes
are refused in one line before anything is submitted.

The worker is the real asyncio Worker in this process, over the real agent loop and tokenizer; the
model is the scripted streaming stand-in of tests/helpers/policies.py (the answers are tool calls)."""

from __future__ import annotations

import asyncio
import contextlib

import msgspec
import pytest
from helpers.policies import StreamingScript, hermes

from envs.session_state import SessionState
from farm.client import FarmClient
from farm.errors import ConfigError
from farm.keys import GROUP
from farm.schema import Status
from workers.delivery.runtime import Worker
from workers.loops.loop import AgentLoop

ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "Start at 3, add 1 then 2, and report."}]},
    "initial_count": 3,
    "expected_count": 6,
}
SCRIPT = [hermes("increment_counter", {"count": 1}), hermes("increment_counter", {"count": 2}), "The count is 6."]
AGENT = "session_state"


def settled_stats(r, settings) -> dict:
    """The agent's stats, once nothing is pending and no open record is left."""
    keys = settings.keys
    assert r.xpending(keys.tasks(AGENT), GROUP)["pending"] == 0
    assert r.zcard(keys.open_tasks()) == 0 and r.hlen(keys.open_runs()) == 0
    return {k.decode(): int(v) for k, v in r.hgetall(keys.stats(AGENT)).items()}


@contextlib.asynccontextmanager
async def worker(settings, policy, tokenizer, concurrency=4):
    agent = AgentLoop.over_tokens(SessionState(), policy, tokenizer)
    w = Worker(settings, AGENT, agent, concurrency=concurrency)
    run = asyncio.create_task(w.run())
    try:
        yield w
    finally:
        w.request_stop()
        await asyncio.wait_for(run, 30)


async def test_an_interrupted_rollout_resumes_on_another_worker_and_ends_as_a_straight_run(
    settings, sync_redis, tokenizer
):
    client = FarmClient(settings)
    task = client.task(run_id="pr", agent=AGENT, row=ROW)
    first = StreamingScript(tokenizer, SCRIPT, pause_at=(1, 7))
    async with worker(settings, first, tokenizer):
        await client.submit([task])
        await asyncio.wait_for(first.paused.wait(), 20)
        report = await client.interrupt([task])
        assert report.open == [task.task_id]
        cut = (await client.collect([task], timeout_s=10))[task.task_id]
    assert cut.status is Status.interrupted
    assert cut.partial.open_turn == 7 and cut.partial.steps == 1 and cut.partial.row == ROW

    second = StreamingScript(tokenizer, SCRIPT, start=(1, 7))
    async with worker(settings, second, tokenizer):
        [cont] = await client.resume([cut])
        final = (await client.collect([cont], timeout_s=20))[cont.task_id]
    assert cont.group_id == task.group_id and cont.resume.resumes == 1 and cont.resume.row == {}
    assert final.status is Status.ok and final.reward == 1.0
    assert list(final.trace.completion())[: len(cut.partial.trace.completion())] == list(
        cut.partial.trace.completion()
    ), "the continuation keeps every token the interrupted rollout had"
    assert second.prompts[0][-7:] == list(cut.partial.trace.completion())[-7:]
    await client.aclose()
    stats = settled_stats(sync_redis, settings)
    assert stats["interrupted"] == 1 and stats["done"] == 1


async def test_a_run_interrupt_stops_its_running_and_queued_tasks_and_spares_later_ones(
    settings, sync_redis, tokenizer
):
    client = FarmClient(settings)
    running = client.task(run_id="ir", agent=AGENT, row=ROW)
    queued = client.task(run_id="ir", agent=AGENT, row=ROW)
    policy = StreamingScript(tokenizer, SCRIPT, pause_at=(0, 3))
    async with worker(settings, policy, tokenizer, concurrency=1):
        await client.submit([running, queued])
        await asyncio.wait_for(policy.paused.wait(), 20)
        report = await client.interrupt_run("ir")
        assert report.run_known and report.open_count == 2
        got = await client.collect([running, queued], timeout_s=10)
        assert {r.status for r in got.values()} == {Status.interrupted}
        assert got[running.task_id].partial.open_turn == 3
        assert not got[queued.task_id].partial.trace.prompt_ids, "queued: nothing generated"
        policy.turn, policy.pause_at = 0, None  # before the resume: the worker may start it at once
        [fresh] = await client.resume([got[queued.task_id]])
        assert fresh.resume is None and fresh.row == ROW, "a task that never started resumes as a fresh one"
        final = (await client.collect([fresh], timeout_s=20))[fresh.task_id]
        assert final.status is Status.ok, "a task submitted after the run's interrupt runs"
    await client.aclose()


async def test_resume_refuses_what_it_cannot_go_on_from_before_submitting_anything(settings, sync_redis, tokenizer):
    client = FarmClient(settings)
    task = client.task(run_id="bad", agent=AGENT, row=ROW)
    policy = StreamingScript(tokenizer, SCRIPT, pause_at=(2, 2))
    async with worker(settings, policy, tokenizer):
        await client.submit([task])
        await asyncio.wait_for(policy.paused.wait(), 20)
        await client.interrupt([task])
        cut = (await client.collect([task], timeout_s=10))[task.task_id]
    ok = msgspec.structs.replace(cut, status=Status.ok, partial=None)
    with pytest.raises(ConfigError, match="ended ok, not interrupted"):
        await client.resume([cut, ok])
    with pytest.raises(ConfigError, match="sampled by 'smollm2-135m-instruct', not 'other'"):
        await client.resume([cut], model="other")
    small = FarmClient(msgspec.structs.replace(settings, max_entry_bytes=2000))
    with pytest.raises(ConfigError, match=r"over max_entry_bytes=2,000"):
        await small.resume([cut])
    assert sync_redis.zcard(settings.keys.open_tasks()) == 0, "nothing was submitted"
    await small.aclose()
    await client.aclose()


async def test_the_command_line_interrupts_and_resumes_and_refuses_in_one_line(
    settings, sync_redis, tokenizer, tmp_path, capsys
):
    """`farm cancel --interrupt` and `farm resume --input FILE`: a rollout that was not interrupted,
    or a file line that is not a rollout, ends in one line and exit 2 with nothing submitted."""
    from farm.cli import main

    client = FarmClient(settings)
    task = client.task(run_id="cli", agent=AGENT, row=ROW)
    policy = StreamingScript(tokenizer, SCRIPT, pause_at=(0, 5))
    flags = ["--redis-url", settings.redis_url, "--namespace", settings.namespace]
    async with worker(settings, policy, tokenizer):
        await client.submit([task])
        await asyncio.wait_for(policy.paused.wait(), 20)
        assert await asyncio.to_thread(main, [*flags, "cancel", "--interrupt", task.task_id]) == 0
        cut = (await client.collect([task], timeout_s=10))[task.task_id]
    assert cut.status is Status.interrupted and cut.partial.open_turn == 5
    good, done = tmp_path / "cut.jsonl", tmp_path / "done.jsonl"
    good.write_bytes(msgspec.json.encode(cut) + b"\n")
    done.write_bytes(msgspec.json.encode(msgspec.structs.replace(cut, status=Status.ok, partial=None)) + b"\n")
    capsys.readouterr()
    assert await asyncio.to_thread(main, [*flags, "resume", "--input", str(done)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ended ok, not interrupted" in err[0] and "Traceback" not in err[0]
    (tmp_path / "torn.jsonl").write_bytes(b'{"task_id": "x"\n')
    assert await asyncio.to_thread(main, [*flags, "resume", "--input", str(tmp_path / "torn.jsonl")]) == 2
    assert "torn.jsonl:1: not a rollout" in capsys.readouterr().err
    assert sync_redis.zcard(settings.keys.open_tasks()) == 0, "nothing submitted"
    assert await asyncio.to_thread(main, [*flags, "resume", "--input", str(good)]) == 0
    out = capsys.readouterr().out
    assert "1 continuations submitted" in out and task.task_id in out
    assert sync_redis.zcard(settings.keys.open_tasks()) == 1
    await client.aclose()
