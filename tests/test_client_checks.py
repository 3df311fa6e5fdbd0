"""FarmClient.submit is as careful as `farm collect`: an agent nothing knows is refused before anything
is written (UnknownAgent, exit code 5), with one lookup per submit call at most; a cancelled run is
said at submit, once per run."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from farm.client import FarmClient
from farm.errors import EXIT_UNKNOWN_AGENT, UnknownAgent
from farm.schema import Status
from farm.submit_checks import defined_agents
from workers.delivery.runtime import Worker
from workers.loops.agent import known_agents
from workers.loops.noop import NoopAgent


def farm_keys(sync_redis, settings) -> list[bytes]:
    return sorted(sync_redis.scan_iter(match=f"{settings.namespace}:*"))


async def live_worker(settings, agent: str) -> tuple[Worker, asyncio.Task]:
    """An in-process worker serving `agent` with the noop agent (a name defined nowhere but by it),
    returned once its heartbeat is in Redis."""
    w = Worker(settings, agent, NoopAgent(), concurrency=4)
    run = asyncio.create_task(w.run())
    async with FarmClient(settings) as probe:
        deadline = time.monotonic() + 20
        while agent not in await probe.live_agents():
            assert time.monotonic() < deadline and not run.done(), "the worker never came up"
            await asyncio.sleep(0.05)
    return w, run


def test_the_core_knows_the_workers_built_in_agents(settings):
    """farm.client cannot import workers.loops.agent (the import contract): its list must match."""
    assert defined_agents(settings) == known_agents(settings)


async def test_an_unknown_agent_is_refused_before_anything_is_written(settings, sync_redis):
    before = farm_keys(sync_redis, settings)
    async with FarmClient(settings) as client:
        tasks = [client.task(run_id="r", agent="noop", row={}) for _ in range(3)]
        tasks.append(client.task(run_id="r", agent="nobody_serves_this", row={}))
        with pytest.raises(UnknownAgent) as caught:
            await client.submit(tasks, check_agents=True)
    message = str(caught.value)
    assert caught.value.exit_code == EXIT_UNKNOWN_AGENT == 5
    assert "'nobody_serves_this'" in message and "noop" in message and "check_agents" in message
    assert farm_keys(sync_redis, settings) == before, "nothing written, not even the three good tasks"


async def test_an_agent_only_a_live_worker_knows_is_accepted_with_one_lookup(settings):
    """`farm worker --agent weather --impl ...` on another host defines `weather` there alone: its
    heartbeat makes it known. Thousands of tasks in several chunks cost one live-worker lookup, and a
    second submit none (the answer is cached)."""
    w, run = await live_worker(settings, "elsewhere_only")
    try:
        async with FarmClient(settings, chunk=1000) as client:
            lookups = 0
            live = client.live_agents

            async def counted() -> set[str]:
                nonlocal lookups
                lookups += 1
                return await live()

            client.live_agents = counted  # type: ignore[method-assign]
            tasks = [client.task(run_id="many", agent="elsewhere_only", row={}) for _ in range(3000)]
            await client.submit(tasks)
            assert lookups == 1
            await client.submit([client.task(run_id="many", agent="elsewhere_only", row={})])
            await client.submit([client.task(run_id="many", agent="noop", row={})])
            assert lookups == 1, "known agents are cached; a defined one needs no lookup"
            got = await client.collect(tasks[:5], timeout_s=30)
            assert all(r.status is Status.ok for r in got.values())
    finally:
        w.request_stop()
        await asyncio.wait_for(run, 30)


async def test_an_unknown_agent_in_a_later_chunk_of_an_iterator_stops_there(settings, sync_redis):
    """An iterator is not read ahead: the chunks before the unknown agent's are queued, the rest not."""
    async with FarmClient(settings, chunk=10) as client:
        good = [client.task(run_id="it", agent="noop", row={}) for _ in range(10)]
        bad = client.task(run_id="it", agent="no_such_agent", row={})
        with pytest.raises(UnknownAgent, match="no_such_agent"):
            await client.submit(iter(good + [bad]), check_agents=True)
    assert sync_redis.zcard(settings.keys.open_tasks()) == 10


async def test_by_default_an_unknown_agent_is_warned_about_once_and_queued(settings, caplog):
    """A worker started a moment ago (no heartbeat yet) is a normal start-up: the default queues its
    tasks and says once per agent that nothing knows it yet."""
    async with FarmClient(settings) as client:
        for _ in range(2):
            tasks = [client.task(run_id="soon", agent="starting_up", row={}) for _ in range(3)]
            with caplog.at_level(logging.WARNING, logger="farm.client"):
                assert await client.submit(tasks) == [t.task_id for t in tasks]
    said = [r.getMessage() for r in caplog.records if "starting_up" in r.getMessage()]
    assert len(said) == 1 and "wait for a worker" in said[0], said


async def test_check_agents_false_queues_for_a_worker_to_come(settings, sync_redis):
    async with FarmClient(settings) as client:
        tasks = [client.task(run_id="later", agent="comes_later", row={}) for _ in range(2)]
        await client.submit(tasks, check_agents=False)
        assert sync_redis.zcard(settings.keys.open_tasks()) == 2
        got = await client.collect(tasks, timeout_s=0.3)
    assert all(r.error is not None and r.error.kind == "deadline" for r in got.values())


async def test_submitting_to_a_cancelled_run_warns_once(settings, caplog):
    caplog.set_level(logging.WARNING, logger="farm.client")
    async with FarmClient(settings) as client:
        await client.submit([client.task(run_id="gone", agent="noop", row={})])
        report = await client.cancel_run("gone")
        assert report.run_known
        assert not [r for r in caplog.records if "was cancelled" in r.getMessage()]
        for _ in range(3):
            await client.submit([client.task(run_id="gone", agent="noop", row={}) for _ in range(2)])
        await client.submit([client.task(run_id="fresh", agent="noop", row={})])
    warnings = [r.getMessage() for r in caplog.records if "was cancelled" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "run gone was cancelled" in warnings[0] and "cancelled before it started" in warnings[0]


async def test_results_says_within_seconds_that_no_worker_serves_the_agent(settings, caplog):
    """No worker for `noop` in this namespace: results() says so (once, naming the command to start)
    within IdleAgents.interval_s, not at its timeout; two concurrent waits share one live-worker lookup."""
    caplog.set_level(logging.WARNING, logger="farm.client")
    async with FarmClient(settings) as client:
        lookups = 0
        live = client.live_agents

        async def counted() -> set[str]:
            nonlocal lookups
            lookups += 1
            return await live()

        client.live_agents = counted  # type: ignore[method-assign]
        runs = [[client.task(run_id=run, agent="noop", row={}) for _ in range(200)] for run in ("a", "b")]
        await client.submit(runs[0] + runs[1])
        t0 = time.time()
        got = await asyncio.gather(*(client.collect(tasks, timeout_s=4.5) for tasks in runs))
    said = [r for r in caplog.records if "no worker serves it" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert said[0].levelno == logging.WARNING and said[0].name == "farm.client"
    assert "'noop'" in said[0].getMessage() and "`farm worker --agent noop`" in said[0].getMessage()
    assert said[0].created - t0 < 4, "said within seconds, before the timeout"
    assert lookups == 1, "one look-up per interval for the client, not per task or per wait"
    assert all(r.error is not None and r.error.kind == "deadline" for g in got for r in g.values())


async def test_results_is_quiet_while_a_worker_of_the_agent_is_live(settings, sync_redis, caplog, monkeypatch):
    """The negative control: a live heartbeat for `noop` (written directly: a worker would answer the
    tasks) and the same wait says nothing."""
    import json

    from farm.submit_checks import IdleAgents

    monkeypatch.setattr(IdleAgents, "interval_s", 0.3)
    sync_redis.set(settings.keys.worker("beat"), json.dumps({"agent": "noop", "worker_id": "beat"}), ex=30)
    caplog.set_level(logging.WARNING, logger="farm.client")
    async with FarmClient(settings) as client:
        tasks = [client.task(run_id="quiet", agent="noop", row={}) for _ in range(3)]
        await client.submit(tasks)
        await client.collect(tasks, timeout_s=1.5)
    assert not [r for r in caplog.records if "no worker serves it" in r.getMessage()]


async def test_the_unknown_agent_warning_has_its_level_without_logging_set_up(settings, capsys, monkeypatch):
    """An application that never set up logging: the warning is printed with its level and logger, and
    names check_agents=True (Python's last resort would print the bare message)."""
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    async with FarmClient(settings) as client:
        await client.submit([client.task(run_id="bare", agent="nobody_yet", row={})])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "nobody_yet" in line]
    assert len(lines) == 1 and lines[0].startswith("WARNING farm.client: agent 'nobody_yet'"), err
    assert "check_agents=True" in lines[0] and "`farm worker --agent nobody_yet`" in lines[0]
