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
what Redis answered. On SIGTERM/SIGINT the worker stops fetching, lets in-flight rollouts finish
within the grace period, and hands the rest back (idle past the visibility timeout, so other
workers take them at once). A second signal skips the grace period; one within SAME_STOP_S of
the first is the same stop delivered twice (a `--processes` supervisor forwards the SIGTERM or
Ctrl-C its process group, or Slurm's step, already delivered to every worker).

An agent may tell the worker it cannot take work (the policy's every replica down or
rate-limited): while its `ready()` is false the fetch loop fetches nothing and waits on its
`wait_ready()`, so tasks stay safe in the stream instead of failing one attempt after another.

Each loop holds a connection to the policy, so a worker needs about one descriptor per loop:
at start it raises its soft RLIMIT_NOFILE to the hard limit, and refuses to start when the
concurrency needs more than the hard limit allows.
"""

from __future__ import annotations

import asyncio
import json
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
from farm.errors import ConfigError, FarmError, RedisAuthError, RedisUnavailable, TransportError
from farm.history import Recording
from farm.policy_version import PolicyVersions
from farm.scripts import NOT_PENDING
from farm.settings import Settings
from farm.settler import Settler
from farm.streams import BAD_REPLY, AgentStream
from farm.tasks import cancel_and_wait
from farm.transport import Outage
from workers.delivery.chores import VERSION, Summary, dump_tasks, raise_open_files, serve_metrics, warn_retry_budget
from workers.delivery.health import HealthServer
from workers.delivery.outcome import Outcomes
from workers.loops.context import Agent, AgentContext

log = logging.getLogger("farm.worker")

SAME_STOP_S = 1.0  # stop signals this close together are one request, not a second (forcing) one
DEPTH_EVERY_S = 10.0  # how often the maintenance loop writes the agent's queue depth into its history


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
        self._stopping = asyncio.Event()
        self._stop_requested_at = 0.0
        self._force = False
        self._slot = asyncio.Event()
        self._closed = asyncio.Event()
        self.outage = Outage.for_settings(settings)
        self._fatal: Optional[TransportError] = None
        self.ctx = AgentContext(worker_id=self.worker_id, settings=settings)
        self.cancels: Optional[Cancels] = None

    # -- control -----------------------------------------------------------------------
    def request_stop(self) -> None:
        now = time.monotonic()
        if self._stopping.is_set():
            if now - self._stop_requested_at < SAME_STOP_S:
                return  # one stop delivered twice: to the process group (Ctrl-C, Slurm) and by a supervisor
            self._force = True
            log.warning("second stop signal: not waiting for in-flight rollouts")
        else:
            self._stop_requested_at = now
        self._stopping.set()
        self._slot.set()

    def _fail(self, exc: TransportError) -> None:
        """Redis is gone for good (or refuses us): stop at once, without the grace period."""
        if self._fatal is None:
            self._fatal = exc
            log.error("stopping: %s", exc)
        self._force = True
        self._stopping.set()
        self._slot.set()

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
        maintenance = asyncio.create_task(self._maintenance(), name="maintenance")
        try:
            try:
                await self._setup_agent()
                await self._fetch_loop()
            except TransportError as exc:
                self._fail(exc)
            except BaseException:
                self._force = True  # cancelled: do not wait on the grace period
                raise
            finally:
                await self._drain()
        finally:
            # Every step is bounded, and none waits out an outage: a stopping worker always exits.
            self._closed.set()
            await self._bounded(maintenance, "stopping maintenance")
            await self._bounded(self.settler.close(), "stopping the settler")
            await self._bounded(
                self.outage.once(
                    lambda: self.r.delete(self.settings.keys.worker(self.worker_id)), "removing the heartbeat"
                ),
                "removing the heartbeat",
            )
            await self._bounded(self.agent.aclose(), "closing the agent")
            if self.ctx.versions is not None:
                await self._bounded(self.ctx.versions.aclose(), "stopping the policy version watch")
            if self.cancels is not None:
                await self._bounded(self.cancels.aclose(), "stopping the cancel watch")
            await self._bounded(self.r.aclose(), "closing the connection")
            log.info("worker stopped", extra={"worker": self.worker_id, **self.counters})
        if self._fatal is not None:
            raise self._fatal
        return self.counters

    async def _setup_agent(self) -> None:
        """The agent's (and its environment's) setup, before the first fetch; a failure stops the worker
        with the reason, since every task would fail the same way."""
        setup = getattr(self.agent, "setup", None)
        if setup is None:
            return
        try:
            await setup()
        except FarmError:
            raise
        except Exception as exc:
            raise ConfigError(
                f"agent {self.agent_name}: its environment's setup failed: {type(exc).__name__}: {exc}"
            ) from exc

    async def _bounded(self, aw, what: str, timeout_s: float = 5.0) -> None:
        try:
            await asyncio.wait_for(aw, timeout_s)
        except asyncio.TimeoutError:
            log.warning("%s took over %.0fs; going on", what, timeout_s)
        except TransportError as exc:
            log.log(self._after_fatal(), "%s failed: %s", what, exc)

    def _after_fatal(self) -> int:
        """The level for a shutdown step that failed on Redis: stopping because Redis is gone, the
        error line said so once, and each step need not warn again (one warning a second per process)."""
        return logging.INFO if self._fatal is not None else logging.WARNING

    async def _fetch_loop(self) -> None:
        s = self.settings
        vt_ms = int(s.visibility_timeout_s * 1000)
        next_reclaim = 0.0
        while not self._stopping.is_set():
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
            if self._stopping.is_set():
                break
            for entry_id, fields in await self.stream.read(free, s.block_ms):
                self._start(entry_id, fields, 1)

    def agent_ready(self) -> bool:
        ready = getattr(self.agent, "ready", None)
        return ready is None or ready()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def _pause_fetching(self) -> None:
        """Fetch nothing until the agent can take work again (or the worker stops)."""
        started = time.monotonic()
        self.counters["fetch_paused"] += 1
        log.warning("the agent cannot take work (no policy replica available): not fetching tasks until it can")
        waiters = [asyncio.ensure_future(self.agent.wait_ready()), asyncio.ensure_future(self._stopping.wait())]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
        if not self._stopping.is_set():
            log.info("fetching tasks again after %.1fs", time.monotonic() - started)

    def _start(self, entry_id: str, fields: dict, deliveries: int) -> None:
        picked = time.time()
        self.inflight[entry_id] = asyncio.create_task(self._handle(entry_id, fields, deliveries, picked))

    async def _drain(self) -> None:
        if self.inflight and not self._force:
            log.info("draining %d in-flight rollouts (grace %.0fs)", len(self.inflight), self.settings.grace_period_s)
            waiter = asyncio.gather(*self.inflight.values(), return_exceptions=True)
            force = asyncio.create_task(self._wait_force())
            await asyncio.wait(
                [waiter, force], timeout=self.settings.grace_period_s, return_when=asyncio.FIRST_COMPLETED
            )
            force.cancel()
        left = list(self.inflight)
        await cancel_and_wait(self.inflight.values())
        if left:
            idle_ms = int(self.settings.visibility_timeout_s * 1000) + 1
            try:
                n = await asyncio.wait_for(self.stream.release(left, idle_ms), 5.0)
                log.warning("handed %d unfinished tasks back to the group", n)
            except (TransportError, asyncio.TimeoutError) as exc:
                log.log(
                    self._after_fatal(),
                    "could not hand back %d tasks (%s); they are reclaimed after the visibility timeout",
                    len(left),
                    exc,
                )

    async def _wait_force(self) -> None:
        while not self._force:
            await asyncio.sleep(0.1)

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
            # Not settled: the entry stays pending and is reclaimed after the visibility timeout.
            log.error("could not settle task %s: %s", entry_id, exc)
            if isinstance(exc, (RedisUnavailable, RedisAuthError)):
                self._fail(exc)
        finally:
            self.inflight.pop(entry_id, None)
            self.stream.forget(entry_id)
            self._slot.set()

    # -- background chores -------------------------------------------------------------
    async def _maintenance(self) -> None:
        s = self.settings
        beat_every = s.heartbeat_ttl_s / 3
        next_beat = next_depth = 0.0
        next_renew = time.monotonic() + s.lease_renew_s
        next_prune = time.monotonic() + min(60.0, s.consumer_idle_s)
        summary = Summary(time.monotonic() + s.summary_every_s)
        while not self._closed.is_set():
            try:
                now = time.monotonic()
                if now >= next_beat:
                    next_beat = now + beat_every
                    await self.outage.call(self._heartbeat, "refreshing the heartbeat")
                if now >= next_depth:  # on a clock, not at settles: a queue nobody settles from is charted too
                    next_depth = now + DEPTH_EVERY_S
                    await self.stream.record_depth()
                if now >= summary.due:
                    summary.log(self, now, s.summary_every_s)
                if now >= next_prune:
                    next_prune = now + min(60.0, s.consumer_idle_s)
                    gone = await self.stream.prune_consumers(int(s.consumer_idle_s * 1000))
                    if gone:
                        log.info("removed %d consumer(s) of workers that are gone from the group", gone)
                if now >= next_renew:
                    next_renew = now + s.lease_renew_s
                    lost = await self.stream.renew(list(self.inflight))
                    if lost:
                        self.counters["lease_lost"] += len(lost)
                        log.warning("lost the lease of %d tasks to other workers", len(lost))
                moved = await self.stream.promote()
                if moved:
                    log.debug("moved %d due retries back into the stream", moved)
            except (RedisUnavailable, RedisAuthError) as exc:
                self._fail(exc)
                return
            except TransportError as exc:
                log.warning("maintenance: %s", exc)
            try:
                await asyncio.wait_for(self._closed.wait(), 0.25)
            except asyncio.TimeoutError:
                pass

    async def _heartbeat(self) -> None:
        info = {
            "worker_id": self.worker_id,
            "agent": self.agent_name,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "concurrency": self.concurrency,
            "inflight": len(self.inflight),
            "started_at": self.started_at,
            "version": VERSION,
            "ts": time.time(),
            **self.counters,
        }
        await self.r.set(
            self.settings.keys.worker(self.worker_id), json.dumps(info), px=int(self.settings.heartbeat_ttl_s * 1000)
        )


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
