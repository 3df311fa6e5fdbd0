"""What a worker process does beside running tasks: its version, open-file limit, periodic summary
line, and a stack dump of its asyncio tasks on SIGUSR1."""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from farm.errors import ConfigError

log = logging.getLogger("farm.worker")

FILES_RESERVED = 256  # Redis connections, logs, the tokenizer, sandboxes: beside one socket per loop


def _version() -> str:
    try:
        return version("rollout-farm")
    except PackageNotFoundError:
        return "unknown"


VERSION = _version()


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
    """The worker's one-line summary every summary_every_s: done, failed, in flight, rollouts/s."""

    def __init__(self, due: float):
        self.due, self.last_at, self.last_ended = due, time.monotonic(), 0

    def log(self, worker: Any, now: float, every_s: float) -> None:
        c = worker.counters
        ended = c["done"] + c["failed"] + c["dead"]
        rate = (ended - self.last_ended) / max(now - self.last_at, 1e-9)
        log.info(
            "worker %s: done %d, failed %d, dead %d, retried %d, in flight %d, %.1f rollouts/s",
            worker.worker_id,
            c["done"],
            c["failed"],
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
