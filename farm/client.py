"""The client side of the farm: submit tasks, await their rollouts.

Used by the producer CLI and the trainer. Submitting checks each task (its reply_to must be
a result stream of the namespace, its body within max_entry_bytes), then pipelines XADDs in
chunks and creates each agent's consumer group first (at id 0, so no task is skipped by a
late group).

Consuming has one path, `ResultReader.batches()`: it reads the run's result stream, drops
duplicates by task_id (delivery is at-least-once), trims what it read, and turns an entry it
cannot decode (garbage, too deep, too large, another version) into a dead letter on
`{ns}:dead-results` with the reason, plus a `malformed` failure for its task when the entry
still says which task it was. `async for rollout in client.results(tasks, timeout_s=...)`
yields one rollout per task as they arrive; tasks still missing at the deadline come back as
`failed` rollouts of kind `deadline`, so a caller never waits forever and never mistakes a
missing rollout for a zero reward. Every Redis call goes through the client's Outage. What submit
checks (an agent nothing knows is refused, a cancelled run is said) is farm.submit_checks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, defaultdict
from typing import Any, AsyncIterator, Callable, Iterable, Optional, Sequence

import redis.asyncio as aioredis

from farm import cancel, fairness, history, schema, scripts
from farm.cancel import CancelReport
from farm.connection import connect, durability_of
from farm.errors import ConfigError
from farm.keys import GROUP, Keys, check_name, text
from farm.results import ResultReader
from farm.resume import continuations
from farm.rows import normalize_row
from farm.schema import ErrorKind, Rollout, Task
from farm.settings import Settings, load_settings
from farm.state import live_workers_async
from farm.streams import ensure_group
from farm.submit_checks import AgentCheck, CancelledRuns, IdleAgents, KnownAgents
from farm.transport import Outage

__all__ = [
    "FarmClient",
    "ResultReader",
]


log = logging.getLogger("farm.client")

Progress = Callable[[int, int, Rollout], None]


class FarmClient:
    """Submit tasks to agent streams and await their rollouts on the run's result stream.

    `FarmClient()` takes its settings from `load_settings()` (FARM_CONFIG, FARM_* variables); with
    no redis_url it uses the embedded Redis on 127.0.0.1:embedded_port, as the command line does.
    Use it as `async with FarmClient() as client:`, or call `await client.aclose()`.
    """

    def __init__(self, settings: Optional[Settings] = None, r: Optional[aioredis.Redis] = None, chunk: int = 1000):
        settings = settings if settings is not None else load_settings()
        self.settings = settings
        self.keys: Keys = settings.keys
        self.r = r or connect(settings)
        self.outage = Outage.for_settings(settings)
        self.chunk = chunk
        self._groups: set[str] = set()
        self._readers: dict[str, ResultReader] = {}
        self._known, self._warned = KnownAgents(settings, lambda: self.live_agents()), set[str]()
        self._cancelled = CancelledRuns(self.keys)
        self._idle = IdleAgents(lambda: self.live_agents(), self.keys.ns)

    def results_stream(self, run_id: str) -> str:
        return self.keys.results(run_id)

    def task(self, *, run_id: str, agent: str, row: dict, **kw) -> Task:
        """A task of `run_id` for `agent`; a row in TRL's shape (`prompt` + columns) goes as a farm row."""
        row = normalize_row(row)
        return Task.new(run_id=run_id, agent=agent, row=row, reply_to=self.results_stream(run_id), **kw)

    async def submit(
        self, tasks: Iterable[Task], *, share: float = 1.0, max_in_flight: int = 0, check_agents: Optional[bool] = None
    ) -> list[str]:
        """Queue tasks for their agents in pipelined chunks; returns their task ids. While several runs
        have tasks queued for an agent, its workers' slots are shared between them in proportion to
        their `share`; `max_in_flight` (0: none) caps a run's tasks in flight per agent (farm.fairness).
        The last submit's share and cap hold for the run. An agent nothing knows is warned about once
        and queued for a worker to come (the default, None); `check_agents=True` raises UnknownAgent
        before anything is written (from an iterator: before its chunk); False skips the check."""
        share, cap = fairness.check_share(share), fairness.check_cap(max_in_flight)
        refuse = bool(check_agents)
        checker = None if check_agents is False else AgentCheck(self._known, self.keys.ns, refuse, self._warned)
        if checker is not None and isinstance(tasks, Sequence):
            await checker.check({t.agent_ref.name for t in tasks})
        ids: list[str] = []
        batch: list[Task] = []
        for task in tasks:
            batch.append(task)
            if len(batch) >= self.chunk:
                ids += await self._submit_chunk(batch, share, cap, checker)
                batch = []
        if batch:
            ids += await self._submit_chunk(batch, share, cap, checker)
        return ids

    async def known_agents(self, *, refresh: bool = False) -> set[str]:
        """Agents a submit accepts: those defined here (built-in, registered, configured) and those with a
        live worker. Cached: `refresh` looks the live workers up again."""
        return await self._known.names(refresh=refresh)

    def _entries(self, tasks: list[Task]) -> dict[tuple[str, str], list[bytes]]:
        """The queue items per (agent, run); refuses (before anything is written) a task no worker could settle."""
        by_queue: dict[tuple[str, str], list[bytes]] = defaultdict(list)
        for t in tasks:
            if not self.keys.is_result_stream(t.reply_to):
                raise ConfigError(
                    f"task {t.task_id}: reply_to {t.reply_to[:200]!r} is not a result stream of "
                    f"namespace {self.keys.ns!r} ({self.keys.results_prefix()}RUN_ID; "
                    "client.task() builds it)"
                )
            fields = schema.entry(t)
            if len(fields[b"d"]) > self.settings.max_entry_bytes:
                raise ConfigError(
                    f"task {t.task_id} is {len(fields[b'd']):,} bytes encoded, over "
                    f"max_entry_bytes={self.settings.max_entry_bytes:,}: shorten its row"
                )
            by_queue[(t.agent_ref.name, t.run_id)].append(fairness.item(fields))
        for agent, run in by_queue:
            self.keys.queue(agent, run)  # checks both names, once per chunk
        return by_queue

    async def _submit_chunk(self, tasks: list[Task], share: float, cap: int, check: Optional[AgentCheck]) -> list[str]:
        by_queue = self._entries(tasks)
        agents = {t.agent_ref.name for t in tasks}
        if check is not None:
            await check.check(agents)
        runs = Counter(t.run_id for t in tasks)
        now = time.time()
        cancelled_at: list[Any] = []

        async def add() -> None:
            for agent in agents - self._groups:
                await ensure_group(self.r, self.keys.tasks(agent))
                await self.r.sadd(self.keys.agents(), agent)
                self._groups.add(agent)
            pipe = self.r.pipeline(transaction=False)
            # Open before added: a worker that settles the task at once finds its record (farm.cancel).
            pipe.zadd(self.keys.open_tasks(), {t.task_id: now for t in tasks})
            pipe.zremrangebyscore(self.keys.open_tasks(), "-inf", now - cancel.OPEN_MAX_AGE_S)
            for run, n in runs.items():
                pipe.hincrby(self.keys.open_runs(), run, n)
            for (agent, run), items in by_queue.items():
                fairness.enqueue(pipe, self.keys, agent, run, items, share, cap)
            for agent in agents:
                fairness.wake(pipe, self.keys, agent, GROUP)
            durability = durability_of(self.r)
            durability.queue(pipe)  # redis_wait_replicas: acknowledged once replicas have it (farm.connection)
            self._cancelled.read(pipe, list(runs))
            replies = await pipe.execute()
            cancelled_at[:] = replies[-1]
            if durability:
                durability.check(replies[-2], "submitting tasks")

        # A lost reply may mean the chunk went in: consumers deduplicate by task_id.
        await self.outage.call(add, "submitting tasks")
        self._cancelled.warn(runs, cancelled_at, now)
        return [t.task_id for t in tasks]

    def reader(self, run_id: str, *, dedupe: bool = True) -> ResultReader:
        stream = self.results_stream(run_id)
        if stream not in self._readers:
            self._readers[stream] = ResultReader(
                self.r,
                stream,
                keys=self.keys,
                outage=self.outage,
                block_ms=self.settings.block_ms,
                max_entry_bytes=self.settings.max_entry_bytes,
                dedupe=dedupe,
            )
        return self._readers[stream]

    async def results(
        self, tasks: Iterable[Task], *, timeout_s: Optional[float] = None, deadline: Optional[float] = None
    ) -> AsyncIterator[Rollout]:
        """One rollout per task, as each arrives; at the deadline (epoch seconds, or timeout_s from
        now) the missing ones come back as `deadline` failures. Tasks may span runs. An agent waited
        for that no live worker serves is logged (a warning, once) within seconds (farm.submit_checks)."""
        wanted: dict[str, Task] = {}
        for t in tasks:
            wanted[t.task_id] = t
        readers = {t.run_id: self.reader(t.run_id) for t in wanted.values()}
        again = [t for t in wanted.values() if t.task_id in readers[t.run_id].seen]
        if again:
            raise ValueError(
                f"{len(again)} of these tasks were already delivered or given up on "
                f"(e.g. {again[0].task_id}); each rollout is handed out once"
            )
        if timeout_s is not None:
            deadline = min(deadline or float("inf"), time.time() + timeout_s)
        missing = dict(wanted)
        left_per_run = Counter(t.run_id for t in wanted.values())
        left_per_agent = Counter(t.agent_ref.name for t in wanted.values())
        since = time.monotonic()
        while True:
            # What arrived, not every task still waited for: a pull costs its arrivals, not the batch size.
            for reader in set(readers.values()):
                for task_id in [t for t in reader.buffer if t in missing]:
                    rollout = reader.take(task_id)
                    done = missing.pop(task_id)
                    left_per_run[done.run_id] -= 1
                    left_per_agent[done.agent_ref.name] -= 1
                    if rollout is not None:  # in the buffer, so always
                        yield rollout
            if not missing:
                return
            block = self.settings.block_ms
            if deadline is not None:
                left = deadline - time.time()
                if left <= 0:
                    break
                block = max(1, min(block, int(left * 1000)))
            # The runs still waited for, from a count per run: not a pass over every missing task per pull.
            runs = [run for run, n in left_per_run.items() if n > 0]
            await self._idle.check({agent for agent, n in left_per_agent.items() if n > 0}, since)
            await asyncio.gather(*(readers[run].pull(block) for run in runs))
        waited = f"{timeout_s}s" if timeout_s is not None else "the deadline"
        for task_id, task in missing.items():
            readers[task.run_id].drop(task_id)
            yield Rollout.failure(task, ErrorKind.deadline, f"no rollout within {waited} of waiting")

    async def collect(
        self, tasks: list[Task], timeout_s: Optional[float] = None, on_progress: Optional[Progress] = None
    ) -> dict[str, Rollout]:
        """Await one rollout per task (a dict by task_id); see results()."""
        out: dict[str, Rollout] = {}
        async for rollout in self.results(tasks, timeout_s=timeout_s):
            out[rollout.task_id] = rollout
            if on_progress:
                on_progress(len(out), len(tasks), rollout)
        return out

    async def run_batch(
        self, tasks: list[Task], timeout_s: Optional[float] = None, on_progress: Optional[Progress] = None
    ) -> dict[str, Rollout]:
        await self.submit(tasks)
        return await self.collect(tasks, timeout_s, on_progress)

    async def cancel(self, tasks: Iterable[Task | str]) -> CancelReport:
        """Cancel tasks (Task objects or ids): a queued one is never run, a running one is stopped at
        once (its model request closed, its verifier killed); each ends in one `cancelled` rollout
        on its run's result stream. Ids that are unknown or already settled, and ids already cancelled
        (within cancel_ttl_s), are reported, not an error."""
        report = await self._signal(tasks, interrupt=False)
        log.debug("cancel: %s", report.line())
        return report

    async def interrupt(self, tasks: Iterable[Task | str]) -> CancelReport:
        """Interrupt tasks (Task objects or ids): a running one stops at once and ends in one
        `interrupted` rollout that holds what it generated so far (`Rollout.partial`: every token
        with its logprob and policy version; kept mid-turn with `policy_stream`), for `resume`;
        a queued one ends `interrupted` without running. Reported like a cancel."""
        return await self._signal(tasks, interrupt=True)

    async def _signal(self, tasks: Iterable[Task | str], *, interrupt: bool) -> CancelReport:
        """Send a cancel (or an interrupt) of these tasks; what it found of each, as a report."""
        ids = cancel.task_ids(tasks)
        if not ids:
            return CancelReport()
        states = await self.outage.call(
            lambda: cancel.send(self.r, self.keys, ids, self.settings.cancel_ttl_s, interrupt=interrupt),
            "sending interrupts" if interrupt else "sending cancels",
        )
        report = CancelReport()
        for tid, state in zip(ids, states):
            getattr(report, state).append(tid)
        return report

    async def interrupt_run(self, run_id: str) -> CancelReport:
        """Interrupt every task of a run submitted until now (queued or running); tasks submitted
        to it later, its continuations among them, run as usual."""
        try:
            check_name(run_id, "run id")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        count = await self.outage.call(
            lambda: cancel.send_run_interrupt(self.r, self.keys, run_id, self.settings.cancel_ttl_s),
            "sending a run's interrupt",
        )
        return CancelReport(run_id=run_id, open_count=count or 0, run_known=count is not None)

    async def resume(self, rollouts: Iterable[Rollout], *, model: Optional[str] = None, **submit: Any) -> list[Task]:
        """Submit one continuation per interrupted rollout and return them (farm.resume): each goes
        on token-exactly from where its rollout stopped, on any worker, and ends in one rollout on
        the run's result stream. ConfigError, before anything is submitted, for a rollout that was not
        interrupted, one sampled by another model than `model` (when given), or one too large."""
        tasks = continuations(rollouts, self.keys, max_entry_bytes=self.settings.max_entry_bytes, model=model)
        if tasks:
            await self.submit(tasks, **submit)
        return tasks

    async def cancel_run(self, run_id: str) -> CancelReport:
        """Cancel every task of a run, queued or running, and any submitted to it later within
        cancel_ttl_s; each ends in one `cancelled` rollout. A run with no open task is reported, and a
        run never seen here (no task, no result stream) is reported and not recorded."""
        try:
            check_name(run_id, "run id")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        count, already = await self.outage.call(
            lambda: cancel.send_run(self.r, self.keys, run_id, self.settings.cancel_ttl_s), "sending a run's cancel"
        )
        report = CancelReport(
            run_id=run_id, open_count=count or 0, run_known=count is not None, run_already_cancelled=already
        )
        if count:
            drained: dict[str, int] = {}  # per agent, kept across the retries of an outage
            await self.outage.call(lambda: self._drain(run_id, drained), "cancelling a run's queued tasks")
            report.drained = sum(drained.values())
            if report.drained and self.settings.history:
                await self.outage.call(lambda: self._count_drained(run_id, drained), "counting the drained tasks")
        log.debug("cancel: %s", report.line())
        return report

    async def _drain(self, run_id: str, drained: dict[str, int]) -> None:
        """Answer the run's queued tasks on every agent with `cancelled` rollouts at once (farm.fairness),
        adding how many per agent to `drained`."""
        agents = sorted(text(a) for a in await self.r.smembers(self.keys.agents()))
        pipe = self.r.pipeline(transaction=False)
        for agent in agents:
            pipe.exists(self.keys.queue(agent, run_id))
        for agent in [a for a, n in zip(agents, await pipe.execute()) if n]:
            n = await fairness.drain(self.r, self.keys, agent, run_id, "cancelled while queued")
            drained[agent] = drained.get(agent, 0) + n

    async def _count_drained(self, run_id: str, drained: dict[str, int]) -> None:
        """Count drained tasks in their agents' minute buckets, as a worker's settle counts the tasks it
        settles (no worker settles these), in one transaction (farm.history.drained)."""
        pipe = self.r.pipeline(transaction=True)
        for agent, n in drained.items():
            if n:
                scripts.bucket(
                    bucket=self.keys.history(agent, history.minute()),
                    stream=self.keys.tasks(agent),
                    backlog=self.keys.backlog(agent),
                    ttl_s=self.settings.history_ttl_s,
                    counts=history.drained(run_id, n),
                ).queue_source(pipe)
        await pipe.execute()

    async def live_agents(self) -> set[str]:
        """Agents with at least one live worker (their heartbeats have not expired)."""

        async def read() -> set[str]:
            return (await live_workers_async(self.r, self.keys)).agents()

        return await self.outage.call(read, "reading worker heartbeats")

    async def aclose(self) -> None:
        await self.r.aclose()

    async def __aenter__(self) -> "FarmClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
