"""The sandbox sweeper: the farm's sandboxes whose worker is gone, removed.

A worker closes each rollout's sandbox however the rollout ends, but a worker that is SIGKILLed,
or whose machine dies, closes nothing. Every sandbox carries its namespace, worker and expiry
(envs/sdk/sandbox.py's labels), and ends by itself at its expiry; the sweeper removes it sooner:
every worker of a sandboxed environment sweeps its namespace every `sandbox_sweep_s`, and
`farm sandbox sweep` does it once. A sandbox is removed when

- its worker's heartbeat key (`{ns}:worker:{id}`) has expired: the worker is gone, so nothing
  will ever close it (a live worker's sandboxes are never touched). A worker's sweeper waits for
  the key to be absent at two of its sweeps in a row: a Redis outage (or restart) longer than
  heartbeat_ttl_s expires every worker's key at once, and the first worker back would otherwise
  remove the sandboxes of the others, alive and about to beat again. So a SIGKILLed worker's
  sandboxes go within heartbeat_ttl_s + 2 x sandbox_sweep_s; or
- it has outlived its expiry (its lifetime is its task's time limits plus slack).

One listing of the backend and one Redis round trip (EXISTS for each distinct worker, pipelined)
per sweep, whatever the number of sandboxes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional

from envs.sdk.sandbox import LABEL_WORKER, SandboxBackend, expired

__all__ = ["Sweep", "Sweeper", "alive_workers", "sweep"]

log = logging.getLogger("farm.sandbox")


@dataclass
class Sweep:
    found: int = 0
    removed: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)


async def sweep(
    backend: SandboxBackend,
    namespace: str,
    alive: Callable[[set[str]], Awaitable[set[str]]],
    me: Optional[str] = None,
    now: Optional[float] = None,
) -> Sweep:
    """Remove `namespace`'s sandboxes whose worker is not alive (`alive(workers)` -> the live ones),
    or that outlived their expiry. `me`: the sweeping worker, whose own sandboxes only expire."""
    boxes = await backend.list(namespace)
    now = time.time() if now is None else now
    owners = {b.labels.get(LABEL_WORKER, "") for b in boxes} - {me or ""}
    live = await alive({o for o in owners if o}) if owners else set()
    out = Sweep(found=len(boxes))
    for box in boxes:
        owner = box.labels.get(LABEL_WORKER, "")
        if expired(box.labels, now):
            why = "outlived its lifetime"
        elif owner != me and owner not in live:
            why = f"its worker {owner or '(none)'} is gone"
        else:
            continue
        try:
            await backend.remove(box.id)
        except Exception as exc:  # noqa: BLE001 - one that cannot be removed now is tried at the next sweep
            log.warning("sandbox %s: not removed (%s): %s", box.id, why, exc)
            continue
        out.removed.append(box.id)
        out.reasons[box.id] = why
        log.info("removed sandbox %s: %s", box.id, why)
    return out


def alive_workers(redis: Any, keys: Any) -> Callable[[set[str]], Awaitable[set[str]]]:
    """`alive` over an async Redis client: the workers whose heartbeat key exists, in one pipeline."""

    async def alive(workers: set[str]) -> set[str]:
        ordered = sorted(workers)
        pipe = redis.pipeline(transaction=False)
        for w in ordered:
            pipe.exists(keys.worker(w))
        found = await pipe.execute()
        return {w for w, n in zip(ordered, found) if n}

    return alive


class Sweeper:
    """A worker's periodic sweep (from its maintenance loop): one at a time, in a task of its own, so
    a slow backend listing never delays the heartbeat; the first soon after start (a restarted worker
    finds what its predecessor left)."""

    FIRST_S = 3.0

    def __init__(self, backend: SandboxBackend, namespace: str, redis: Any, keys: Any, me: str, every_s: float):
        self.backend, self.namespace, self.me, self.every_s = backend, namespace, me, every_s
        self.alive = alive_workers(redis, keys)
        self.due = time.monotonic() + min(self.FIRST_S, every_s)
        self.job: Optional[asyncio.Task] = None
        self.removed = 0
        self.missing: set[str] = set()  # the workers whose heartbeat was absent at the last sweep

    def tick(self, now: float) -> None:
        if now < self.due or (self.job is not None and not self.job.done()):
            return
        self.due = now + self.every_s
        self.job = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        previous, self.missing = self.missing, set()

        async def alive(workers: set[str]) -> set[str]:
            live = await self.alive(workers)
            self.missing = workers - live
            return live | (self.missing - previous)  # absent once: maybe an outage, not a death

        try:
            result = await sweep(self.backend, self.namespace, alive, me=self.me)
            self.removed += len(result.removed)
        except Exception as exc:  # noqa: BLE001 - a failed sweep is retried at the next tick
            log.warning("sandbox sweep failed: %s", exc)

    async def aclose(self) -> None:
        if self.job is not None and not self.job.done():
            self.job.cancel()
            await asyncio.gather(self.job, return_exceptions=True)
