"""What a worker process does beside running tasks: its version, open-file limit, periodic summary
line, and a stack dump of its asyncio tasks on SIGUSR1."""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from typing import Any

import farm
from farm.errors import ConfigError
from farm.settings import Settings

log = logging.getLogger("farm.worker")

FILES_RESERVED = 256  # Redis connections, logs, the tokenizer, sandboxes: beside one socket per loop


VERSION = farm.__version__


def raise_open_files(concurrency: int) -> int:
    """Raise the soft open-file limit to the hard one; refuse a concurrency the hard limit cannot carry."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = concurrency + FILES_RESERVED
    if hard != resource.RLIM_INFINITY and need > hard:
        raise ConfigError(
            f"concurrency {concurrency} needs about {need} open files (one connection per loop), "
            f"but this process may open at most {hard} (hard RLIMIT_NOFILE): raise it "
            f"(`ulimit -Hn`, LimitNOFILE in systemd, ulimits in Docker/Kubernetes) or lower "
            f"--concurrency to {max(1, hard - FILES_RESERVED)}"
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
