"""What a worker process does beside running tasks: its event loop, version, open-file limit, agent
setup, maintenance loop (leases, retries, heartbeat), periodic summary line, the line that says how
a stop ended, and a stack dump of its asyncio tasks on SIGUSR1."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import resource
import socket
import time
from typing import Any, Coroutine, TypeVar

import farm
from farm.errors import ConfigError, FarmError, RedisAuthError, RedisUnavailable, TransportError
from farm.settings import Settings

log = logging.getLogger("farm.worker")

FILES_RESERVED = 256  # Redis connections, logs, the tokenizer, sandboxes: beside one socket per loop
DEPTH_EVERY_S = 10.0  # how often the maintenance loop writes the agent's queue depth into its history
STOP_MARGIN_S = 2.0  # a stop ends within grace_period_s + this (workers.delivery.runtime; the pool waits as long)


VERSION = farm.__version__
EVENT_LOOPS = ("auto", "uvloop", "asyncio")
FULL_GC_AFTER = 1000  # young collections between full ones (Python's default: 10)
T = TypeVar("T")


def settle_heap() -> None:
    """Keep the cyclic garbage collector off the worker's hot path: freeze what start-up built, make full
    collections rare.

    Thousands of rollouts in flight keep about a million objects alive, and Python's default
    (a full collection every 10 young ones once a quarter of the heap is new) walked them all
    every 3-4 s: 36% of a worker's CPU at 8,192 loops (bench/concurrency.py), in pauses of about
    0.5 s that stall every loop; with this, 1.44 -> 0.94 ms of CPU per rollout, same peak RSS.
    Young collections still run as before and reclaim the cycles a rollout leaves, and the modules,
    tokenizer and chat template loaded at start are never walked again (`gc.freeze`).
    """
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_GC_AFTER)


def run_loop(main: Coroutine[Any, Any, T], choice: str = "auto") -> T:
    """Run the worker's main coroutine on uvloop (`auto`: where it is installed) or asyncio's own loop,
    after `settle_heap`.

    uvloop does the loop's own work (a timer per request's timeout, callbacks, socket reads) in C:
    at 8,192 loops per process it took 5% off the worker's CPU (1.39 -> 1.32 ms per rollout).
    """
    if choice not in EVENT_LOOPS:
        main.close()
        raise ConfigError(f"event loop {choice!r}: choose one of {', '.join(EVENT_LOOPS)}")
    settle_heap()
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                main.close()
                raise ConfigError("event loop uvloop: uvloop is not installed (pip install uvloop)") from None
        else:
            return uvloop.run(main)
    return asyncio.run(main)


def raise_open_files(concurrency: int, files_per_loop: int = 1) -> int:
    """Raise the soft open-file limit to the hard one; refuse a concurrency the hard limit cannot carry."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = concurrency * files_per_loop + FILES_RESERVED
    if hard != resource.RLIM_INFINITY and need > hard:
        raise ConfigError(
            f"concurrency {concurrency} needs about {need} open files ({files_per_loop} per agent loop), "
            f"but this process may open at most {hard} (hard RLIMIT_NOFILE): raise it "
            f"(`ulimit -Hn`, LimitNOFILE in systemd, ulimits in Docker/Kubernetes) or lower "
            f"--concurrency to {max(1, (hard - FILES_RESERVED) // files_per_loop)}"
        )
    target = need if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        log.info("raised the open-file limit from %d to %d", soft, target)
        soft = target
    return soft


class Summary:
    """The worker's one-line summary every summary_every_s: done, failed, cancelled, in flight, rollouts/s."""

    def __init__(self, due: float):
        self.due, self.last_at, self.last_ended = due, time.monotonic(), 0

    def log(self, worker: Any, now: float, every_s: float) -> None:
        c = worker.counters
        ended = c["done"] + c["failed"] + c["cancelled"] + c["dead"]
        rate = (ended - self.last_ended) / max(now - self.last_at, 1e-9)
        log.info(
            "worker %s: done %d, failed %d, cancelled %d, dead %d, retried %d, in flight %d, %.1f rollouts/s",
            worker.worker_id,
            c["done"],
            c["failed"],
            c["cancelled"],
            c["dead"],
            c["retried"],
            len(worker.inflight),
            rate,
        )
        self.due, self.last_at, self.last_ended = now + every_s, now, ended


def dump_tasks() -> None:
    """SIGUSR1: log where every asyncio task of this worker is waiting (for stuck workers)."""
    import io

    for task in asyncio.all_tasks():
        buf = io.StringIO()
        task.print_stack(file=buf)
        log.warning("task %s:\n%s", task.get_name(), buf.getvalue())


class WorkerCollector:
    """The worker's own metrics for `farm worker --metrics-port`: its counters, in flight, concurrency."""

    def __init__(self, worker: Any):
        self.worker = worker

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        w = self.worker
        labels = [w.agent_name, w.worker_id]
        done = CounterMetricFamily(
            "farm_worker_tasks", "Tasks this worker settled, by outcome.", labels=["agent", "worker", "outcome"]
        )
        for outcome in ("done", "failed", "cancelled", "dead", "retried", "duplicate", "unsettled"):
            done.add_metric([*labels, outcome], float(w.counters.get(outcome, 0)))
        yield done
        inflight = GaugeMetricFamily("farm_worker_in_flight", "Tasks this worker runs now.", labels=["agent", "worker"])
        inflight.add_metric(labels, float(len(w.inflight)))
        yield inflight
        slots = GaugeMetricFamily(
            "farm_worker_concurrency", "Concurrent loops of this worker.", labels=["agent", "worker"]
        )
        slots.add_metric(labels, float(w.concurrency))
        yield slots


def serve_metrics(worker: Any, port: int, host: str = "127.0.0.1") -> None:
    """Prometheus metrics of this worker process (its counters and the process collector) on host:port."""
    from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    registry.register(WorkerCollector(worker))
    start_http_server(port, addr=host, registry=registry)
    log.info("worker metrics on http://%s:%d/metrics", host, port)


def warn_retry_budget(s: Settings) -> None:
    """A model call that may wait longer than its attempt is allowed to run is a setting to fix."""
    if s.policy_urls and s.policy_retry_budget_s >= s.task_timeout_s:
        log.warning(
            "policy_retry_budget_s (%gs) is not shorter than task_timeout_s (%gs): an attempt times out "
            "(and is retried) while its model call still waits for a replica; lower the budget",
            s.policy_retry_budget_s,
            s.task_timeout_s,
        )


async def setup_agent(agent: Any, agent_name: str) -> None:
    """The agent's (and its environment's) setup, before the first fetch; a failure stops the worker
    with the reason, since every task would fail the same way."""
    setup = getattr(agent, "setup", None)
    if setup is None:
        return
    try:
        await setup()
    except FarmError:
        raise
    except Exception as exc:
        raise ConfigError(f"agent {agent_name}: its environment's setup failed: {type(exc).__name__}: {exc}") from exc


def heartbeat_info(worker: Any) -> dict:
    """What the worker's heartbeat key holds (`farm status`, the health probe and the dashboard read it);
    a sandboxed environment's worker adds its sandboxes (workers/loops/sandboxes.py)."""
    stats = getattr(worker.agent, "sandbox_stats", None)
    sandboxes = stats() if callable(stats) else None
    return {
        **({"sandboxes": sandboxes} if sandboxes is not None else {}),
        "worker_id": worker.worker_id,
        "agent": worker.agent_name,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "concurrency": worker.concurrency,
        "inflight": len(worker.inflight),
        "started_at": worker.started_at,
        "version": VERSION,
        "ts": time.time(),
        **worker.counters,
    }


async def maintain(worker: Any) -> None:
    """The worker's maintenance loop until it closes: its heartbeat, the agent's queue depth, the
    summary line, gone consumers pruned, the leases of in-flight tasks renewed, due retries promoted."""
    s, stream = worker.settings, worker.stream
    beat_every = s.heartbeat_ttl_s / 3
    next_beat = next_depth = 0.0
    next_renew = time.monotonic() + s.lease_renew_s
    next_prune = time.monotonic() + min(60.0, s.consumer_idle_s)
    summary = Summary(time.monotonic() + s.summary_every_s)
    key, ttl_ms = s.keys.worker(worker.worker_id), int(s.heartbeat_ttl_s * 1000)
    sweeper = _sweeper(worker)
    while not worker._closed.is_set():
        try:
            now = time.monotonic()
            if sweeper is not None:
                sweeper.tick(now)
            if now >= next_beat:
                next_beat = now + beat_every
                info = json.dumps(heartbeat_info(worker))
                await worker.outage.call(lambda: worker.r.set(key, info, px=ttl_ms), "refreshing the heartbeat")
            if now >= next_depth:  # on a clock, not at settles: a queue nobody settles from is charted too
                next_depth = now + DEPTH_EVERY_S
                await stream.record_depth()
            if now >= summary.due:
                summary.log(worker, now, s.summary_every_s)
            if now >= next_prune:
                next_prune = now + min(60.0, s.consumer_idle_s)
                gone = await stream.prune_consumers(int(s.consumer_idle_s * 1000))
                if gone:
                    log.info("removed %d consumer(s) of workers that are gone from the group", gone)
            if now >= next_renew:
                next_renew = now + s.lease_renew_s
                lost = await stream.renew(list(worker.inflight))
                if lost:
                    worker.counters["lease_lost"] += len(lost)
                    log.warning("lost the lease of %d tasks to other workers", len(lost))
            moved = await stream.promote()
            if moved:
                log.debug("moved %d due retries back into the stream", moved)
        except (RedisUnavailable, RedisAuthError) as exc:
            worker._fail(exc)
            return
        except TransportError as exc:
            log.warning("maintenance: %s", exc)
        try:
            await asyncio.wait_for(worker._closed.wait(), 0.25)
        except asyncio.TimeoutError:
            pass
    if sweeper is not None:
        await sweeper.aclose()


def _sweeper(worker: Any) -> Any:
    """The sandbox sweeper of a sandboxed environment's worker (workers/delivery/sweeper.py), else None."""
    tracked = getattr(worker.agent, "sandboxes", None)
    if tracked is None:
        return None
    from workers.delivery.sweeper import Sweeper

    s = worker.settings
    return Sweeper(tracked.backend, s.namespace, worker.r, s.keys, worker.worker_id, s.sandbox_sweep_s)


def log_stop(left: int, handed_back: int, s: Settings, signalled: bool) -> None:
    """The one line that says how a signalled stop ended, and with it the worker's exit status (`farm
    worker`): 0 when nothing was left pending, 3 when tasks stay pending for another worker to reclaim.
    A worker that stopped on an error of its own said so already, and exits with that error's status."""
    if not signalled:
        if left:
            log.info("%d tasks left pending, reclaimed after visibility_timeout_s (%gs)", left, s.visibility_timeout_s)
    elif left:
        log.warning(
            "stopped with %d tasks left pending: Redis did not answer, so they stay in the consumer group and "
            "another worker reclaims them after visibility_timeout_s (%gs); exit status 3",
            left,
            s.visibility_timeout_s,
        )
    else:
        log.info("stopped with nothing left pending (%d tasks handed back); exit status 0", handed_back)
