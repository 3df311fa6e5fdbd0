"""The worker runtime: M concurrent agent loops in one asyncio process, fed from one stream.

Concurrency has an explicit bound: the fetch loop asks Redis for exactly as many tasks as
there are free slots (first reclaiming idle ones from dead workers, then new ones), so
backpressure reaches the queue and a worker never hoards work. Beside it, a maintenance
loop renews the lease of in-flight tasks, moves due retries back into the stream and
refreshes the heartbeat and, every DEPTH_EVERY_S, the agent's queue depth in its history.

Each task ends in exactly one settle step (see farm.streams): a rollout to reply_to, a delayed
retry with jittered exponential backoff, after max_attempts a dead letter plus a `failed`
rollout, or for a task a client cancelled (farm.cancel) a `cancelled` rollout, without running
when the cancel came first, stopped at once when it came while it ran. The Settler counts each by
what Redis answered.

A stop is bounded whatever Redis is doing. On SIGTERM/SIGINT the worker stops fetching at once (a
fetch that Redis does not answer within block_ms is given up), lets in-flight rollouts finish
within grace_period_s, then tries once, within stop_settle_timeout_s, to hand the rest back (idle
past the visibility timeout, so other workers take them at once), and exits within grace_period_s
+ STOP_MARGIN_S. Its Outage is stopped with the signal (farm.transport): nothing is retried from
then on, so a Redis that is gone ends the drain at once instead of holding the stop for
redis_down_max_s. Tasks it could neither settle nor hand back stay pending in the group and are
reclaimed after the visibility timeout: counters["left_for_reclaim"], which `farm worker` turns
into exit status 3 (0: nothing left). A second signal skips the grace period; one within
SAME_STOP_S of the first is the same stop delivered twice (a `--processes` supervisor forwards the
SIGTERM or Ctrl-C its process group, or Slurm's step, already delivered to every worker): the
stop's rules and clock are workers/delivery/stop.py.

An agent may tell the worker it cannot take work (the policy's every replica down or
rate-limited): while its `ready()` is false the fetch loop fetches nothing and waits on its
`wait_ready()`, so tasks stay safe in the stream instead of failing one attempt after another.

Each loop holds a connection to the policy, so a worker needs about one descriptor per loop:
at start it raises its soft RLIMIT_NOFILE to the hard limit, and refuses to start when the
concurrency needs more than the hard limit allows.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
import uuid
from collections import Counter
from typing import Optional

from farm.cancel import Cancels
from farm.connection import connect
from farm.errors import RedisAuthError, RedisUnavailable, TransportError
from farm.history import Recording
from farm.policy_version import PolicyVersions
from farm.scripts import NOT_PENDING
from farm.settings import Settings
from farm.settler import Settler
from farm.streams import BAD_REPLY, AgentStream
from farm.tasks import cancel_and_wait
from farm.transport import Outage
from workers.delivery.chores import (
    dump_tasks,
    log_stop,
    maintain,
    raise_open_files,
    serve_metrics,
    setup_agent,
    warn_retry_budget,
)
from workers.delivery.health import HealthServer
from workers.delivery.outcome import Outcomes
from workers.delivery.stop import Stop
from workers.loops.context import Agent, AgentContext

log = logging.getLogger("farm.worker")

FETCH_END_S = 0.5  # after a stop, a fetch in flight has block_ms + this to return what it read


def new_worker_id(agent: str) -> str:
    return f"{agent}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Worker:
    def __init__(
        self,
        settings: Settings,
        agent_name: str,
        agent: Agent,
        *,
        concurrency: Optional[int] = None,
        worker_id: Optional[str] = None,
    ):
        self.settings = settings
        self.agent_name = agent_name
        self.agent = agent
        self.concurrency = concurrency or settings.concurrency
        if self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.worker_id = worker_id or new_worker_id(agent_name)
        self.counters: Counter = Counter()
        self.inflight: dict[str, asyncio.Task] = {}
        self.started_at = time.time()
        self._held: list[str] = []  # what the worker still held after the drain (and settles that failed)
        self._slot = asyncio.Event()
        self._closed = asyncio.Event()
        self.outage = Outage.for_settings(settings)
        self.stop = Stop(settings.grace_period_s, self.outage, self._slot.set)
        self.ctx = AgentContext(worker_id=self.worker_id, settings=settings)
        self.cancels: Optional[Cancels] = None

    # -- control -----------------------------------------------------------------------
    def request_stop(self) -> None:
        self.stop.signal()

    def _fail(self, exc: TransportError) -> None:
        self.stop.fail(exc)

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        loop.add_signal_handler(signal.SIGUSR1, dump_tasks)

    # -- main --------------------------------------------------------------------------
    async def run(self) -> Counter:
        raise_open_files(self.concurrency, getattr(self.agent, "files_per_loop", 1))
        warn_retry_budget(self.settings)
        self.r = connect(self.settings)
        self.stream = AgentStream(
            self.r,
            self.settings.keys,
            self.agent_name,
            self.worker_id,
            self.outage,
            Recording.from_settings(self.settings),
        )
        await self.stream.setup()
        self.ctx.versions = PolicyVersions(self.r, self.settings.keys, self.outage)
        await self.ctx.versions.start()
        self.outcomes = Outcomes(self.settings, self.stream, self.agent, self.ctx)
        # Cancels reach this process on one subscription; fetching consults the mirror (farm.cancel).
        self.cancels = Cancels(self.r, self.settings.keys, self.outage, on_cancel=self.outcomes.stop)
        await self.cancels.start()
        self.outcomes.cancels = self.cancels
        self.settler = Settler(self.r, self.outage, self.counters)
        self.settler.start()
        log.info(
            "worker started",
            extra={"worker": self.worker_id, "agent": self.agent_name, "concurrency": self.concurrency},
        )
        maintenance = asyncio.create_task(maintain(self), name="maintenance")
        try:
            try:
                await self._fetch_until_stopped()
            except TransportError as exc:
                self._fail(exc)
            except BaseException:
                self.stop.force = True  # cancelled: do not wait on the grace period
                raise
            finally:
                await self._drain()
        finally:
            # Every step is bounded by the stop's clock, and none waits out an outage.
            self._closed.set()
            await cancel_and_wait([maintenance], grace_s=0.1, tries=3)
            await self._settle_once()
            await self._bounded(self.agent.aclose(), "closing the agent")
            await self._bounded(self.ctx.judges.aclose(), "closing the judges")
            if self.ctx.versions is not None:
                await self._bounded(self.ctx.versions.aclose(), "stopping the policy version watch")
            if self.cancels is not None:
                await self._bounded(self.cancels.aclose(), "stopping the cancel watch")
            await self._bounded(self.r.aclose(), "closing the connection")
            log.info("worker stopped", extra={"worker": self.worker_id, **self.counters})
        if self.stop.fatal is not None:
            raise self.stop.fatal
        return self.counters

    async def _fetch_until_stopped(self) -> None:
        """The agent's setup, then the fetch loop, until a stop. A fetch in flight then has block_ms (and
        FETCH_END_S) to return what it read; one that Redis does not answer (stopped, or gone before the
        socket notices) is cancelled: waiting for it would tie the stop to socket_timeout_s. Entries such
        a cancelled read may still deliver stay pending and are reclaimed after the visibility timeout."""
        fetching = asyncio.create_task(self._setup_and_fetch(), name="fetch")
        stopped = asyncio.create_task(self.stop.requested.wait(), name="stop")
        try:
            await asyncio.wait([fetching, stopped], return_when=asyncio.FIRST_COMPLETED)
            if not fetching.done():
                await asyncio.wait([fetching], timeout=self.settings.block_ms / 1000 + FETCH_END_S)
        finally:
            stopped.cancel()
            if not fetching.done():
                await cancel_and_wait([fetching], grace_s=0.1, tries=3)
        if not fetching.cancelled():
            fetching.result()  # what the fetch loop raised, if anything

    async def _setup_and_fetch(self) -> None:
        await setup_agent(self.agent, self.agent_name)
        await self._fetch_loop()

    async def _bounded(self, aw, what: str) -> None:
        timeout_s = self.stop.left_s()
        try:
            await asyncio.wait_for(aw, timeout_s)
        except asyncio.TimeoutError:
            log.warning("%s took over %.1fs; going on", what, timeout_s)
        except TransportError as exc:
            log.log(self.stop.after_fatal(), "%s failed: %s", what, exc)

    async def _fetch_loop(self) -> None:
        s = self.settings
        vt_ms = int(s.visibility_timeout_s * 1000)
        next_reclaim = 0.0
        while not self.stop.requested.is_set():
            free = self.concurrency - len(self.inflight)
            if free <= 0:
                self._slot.clear()
                await self._slot.wait()
                continue
            if not self.agent_ready():
                await self._pause_fetching()
                continue
            if time.monotonic() >= next_reclaim:
                next_reclaim = time.monotonic() + s.reclaim_interval_s
                for entry_id, fields, deliveries in await self.stream.reclaim(vt_ms, free):
                    self.counters["reclaimed"] += 1
                    self._start(entry_id, fields, deliveries)
                free = self.concurrency - len(self.inflight)
                if free <= 0:
                    continue
            if self.stop.requested.is_set():
                break
            for entry_id, fields in await self.stream.read(free, s.block_ms):
                self._start(entry_id, fields, 1)

    def agent_ready(self) -> bool:
        ready = getattr(self.agent, "ready", None)
        return ready is None or ready()

    @property
    def stopping(self) -> bool:
        return self.stop.requested.is_set()

    async def _pause_fetching(self) -> None:
        """Fetch nothing until the agent can take work again (or the worker stops)."""
        started = time.monotonic()
        self.counters["fetch_paused"] += 1
        log.warning("the agent cannot take work (no policy replica available): not fetching tasks until it can")
        waiters = [asyncio.ensure_future(self.agent.wait_ready()), asyncio.ensure_future(self.stop.requested.wait())]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
        if not self.stop.requested.is_set():
            log.info("fetching tasks again after %.1fs", time.monotonic() - started)

    def _start(self, entry_id: str, fields: dict, deliveries: int) -> None:
        picked = time.time()
        self.inflight[entry_id] = asyncio.create_task(self._handle(entry_id, fields, deliveries, picked))

    async def _drain(self) -> None:
        """In-flight rollouts get what is left of the grace period (nothing when forced); the rest are
        cancelled and kept in `_held` for the hand-back."""
        self.stop.begin(time.monotonic())
        assert self.stop.grace_ends is not None
        wait_s = self.stop.grace_ends - time.monotonic()
        if self.inflight and not self.stop.force and wait_s > 0:
            log.info("draining %d in-flight rollouts (grace %.1fs)", len(self.inflight), wait_s)
            waiter = asyncio.gather(*self.inflight.values(), return_exceptions=True)
            force = asyncio.create_task(self.stop.forced())
            await asyncio.wait([waiter, force], timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
            force.cancel()
        self._held.extend(self.inflight)
        await cancel_and_wait(self.inflight.values(), grace_s=0.1, tries=3)

    async def _settle_once(self) -> None:
        """One try, all at once and within stop_settle_timeout_s, at what Redis should hear before the
        worker goes: the tasks it holds handed back, its heartbeat removed, the settler's last counts.
        What it could not hand back stays pending and is reclaimed after the visibility timeout."""
        held = list(dict.fromkeys(self._held))
        timeout_s = min(self.settings.stop_settle_timeout_s, self.stop.left_s())
        idle_ms = int(self.settings.visibility_timeout_s * 1000) + 1
        heartbeat = self.settings.keys.worker(self.worker_id)
        released, *_ = await asyncio.gather(
            *(
                asyncio.wait_for(step, timeout_s)
                for step in (
                    self.stream.release(held, idle_ms),
                    self.outage.once(lambda: self.r.delete(heartbeat), "removing the heartbeat"),
                    self.settler.close(),
                )
            ),
            return_exceptions=True,
        )
        if isinstance(released, BaseException):
            why = "no answer within stop_settle_timeout_s" if isinstance(released, asyncio.TimeoutError) else released
            log.log(self.stop.after_fatal(), "could not hand back %d tasks: %s", len(held), why)
            self.counters["left_for_reclaim"] = len(held)
        elif released:
            log.info("handed %d unfinished tasks back to the group", released)
            self.counters["handed_back"] += released
        signalled = self.stop.signalled and self.stop.fatal is None
        log_stop(self.counters["left_for_reclaim"], self.counters["handed_back"], self.settings, signalled)

    # -- one task ----------------------------------------------------------------------
    async def _handle(self, entry_id: str, fields: dict, deliveries: int, picked: float) -> None:
        try:
            # The Settler counts each settle by the script's answer (done, duplicate, unsettled, ...).
            settled = await self.settler.run(await self.outcomes.of(entry_id, fields, deliveries, picked))
            if settled in BAD_REPLY:  # nothing written: the task becomes a dead letter instead
                settled = await self.settler.run(self.outcomes.bad_reply_op(entry_id, fields, deliveries, settled))
            if settled == NOT_PENDING:
                log.info("task settled elsewhere; dropped this result", extra={"entry": entry_id})
        except asyncio.CancelledError:
            raise
        except TransportError as exc:
            # Not settled: the entry stays pending (reclaimed after the visibility timeout); a stopping
            # worker tries to hand it back with the rest.
            if self.stopping:
                self._held.append(entry_id)
            log.log(
                logging.INFO if self.stop.signalled else logging.ERROR, "could not settle task %s: %s", entry_id, exc
            )
            if isinstance(exc, (RedisUnavailable, RedisAuthError)):
                self._fail(exc)
        finally:
            self.inflight.pop(entry_id, None)
            self.stream.forget(entry_id)
            self._slot.set()


async def run_worker(
    settings: Settings,
    agent_name: str,
    agent: Agent,
    *,
    concurrency: Optional[int] = None,
    handle_signals: bool = True,
    metrics_port: Optional[int] = None,
    health_port: Optional[int] = None,
) -> Counter:
    worker = Worker(settings, agent_name, agent, concurrency=concurrency)
    if metrics_port:
        serve_metrics(worker, metrics_port, settings.listen_host)
    health = HealthServer(worker, health_port, settings.listen_host).start() if health_port else None
    if handle_signals:
        worker.install_signal_handlers()
    try:
        return await worker.run()
    finally:
        if health is not None:
            health.close()
