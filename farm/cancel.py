"""Cancelling tasks: a client marks task ids or a run cancelled, and every worker process knows
within milliseconds, without a Redis round trip per task.

The signal. `{ns}:cancel:tasks` and `{ns}:cancel:runs` (sorted sets, scored by when each cancel
expires, `cancel_ttl_s` after it was sent) hold every cancel; `{ns}:cancel_events` carries one
message per cancel call (`task EXPIRY ID ...`, `run EXPIRY ID ...`). A worker process keeps one
`Cancels` mirror (a farm.watch.ChannelWatch: subscribed first, then the sets read, and read again
on every resubscription, so a cancel sent while the worker was disconnected is not lost). The
worker asks the mirror, a set lookup, before it starts a task; a message naming a task that runs
in the process stops it at once (`on_cancel`). Either way the task settles once, as a `cancelled`
rollout (farm.schema.Status.cancelled), through the same settle script as any other rollout: a
cancel that races a finishing rollout yields one of the two, never both.

Open tasks. So that a cancel can say which of its ids were still queued or running, the client
records every task it submits in `{ns}:open` (task id, scored by submit time) and counts them per
run in `{ns}:open_runs`, in the pipeline that adds the tasks; the settle script removes both when
it settles the task. An id that is not open is unknown or already settled: cancelling it is a
no-op that says so. An id (or run) whose cancel is still recorded (sent within `cancel_ttl_s`) is
reported as already cancelled, whether or not its task has settled yet: the first cancel stands.
Records older than `OPEN_MAX_AGE_S` (a task whose stream was deleted) are dropped at the next
submit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from farm.errors import ConfigError
from farm.keys import Keys, text
from farm.transport import Outage
from farm.watch import ChannelWatch

CHUNK = 1000  # ids per message and per command
OPEN_MAX_AGE_S = 7 * 86400.0
PRUNE_EVERY_S = 60.0

OnCancel = Callable[[set[str], set[str]], None]  # (task ids, run ids) just cancelled


@dataclass
class CancelReport:
    """What one cancel call did: `open` ids were queued or running (each now ends in one
    `cancelled` rollout, or its own rollout when it was finishing at that moment);
    `already_cancelled` ids had a cancel sent before (within cancel_ttl_s; that one stands);
    `not_open` ids were unknown or already settled (nothing to stop). For a run, `open_count` is
    how many of its tasks were open; `run_known` is False for a run never seen (then nothing was
    recorded); `run_already_cancelled` says its cancel had been sent before."""

    open: list[str] = field(default_factory=list)
    not_open: list[str] = field(default_factory=list)
    already_cancelled: list[str] = field(default_factory=list)
    run_id: Optional[str] = None
    open_count: int = 0
    run_known: bool = True
    run_already_cancelled: bool = False
    drained: int = 0  # of open_count, tasks still queued, answered `cancelled` at once (farm.fairness)

    def line(self) -> str:
        """One line for a person."""
        if self.run_id is not None:
            if not self.run_known:
                return f"run {self.run_id} does not exist here (no tasks, no results): nothing cancelled"
            if not self.open_count and self.run_already_cancelled:
                return f"run {self.run_id} was already cancelled: nothing more to cancel"
            if not self.open_count:
                return (
                    f"run {self.run_id} has no queued or running tasks (unknown, or every task settled): "
                    "nothing to cancel"
                )
            drained = f" ({self.drained} still queued, answered at once)" if self.drained else ""
            if self.run_already_cancelled:
                return (
                    f"run {self.run_id} was already cancelled: {self.open_count} queued or running tasks "
                    f"still end as `cancelled`{drained}"
                )
            return f"cancelled run {self.run_id}: {self.open_count} queued or running tasks end as `cancelled`{drained}"
        parts = []
        if self.open:
            parts.append(f"cancelled {len(self.open)} queued or running tasks")
        if self.already_cancelled:
            parts.append(
                f"{len(self.already_cancelled)} already cancelled (a cancel was sent before; "
                f"e.g. {self.already_cancelled[0]})"
            )
        if self.not_open:
            parts.append(
                f"{len(self.not_open)} unknown or already finished (nothing to cancel; e.g. {self.not_open[0]})"
            )
        return "; ".join(parts) or "no task ids given"

    @property
    def nothing(self) -> bool:
        return not self.open and not self.open_count


def task_ids(tasks: Iterable[Any]) -> list[str]:
    """Ids of Task objects or of ids given as text, in order, once each; ConfigError for one that
    cannot be a task id (it would split a cancel message)."""
    out: dict[str, None] = {}
    for t in tasks:
        tid = t if isinstance(t, str) else getattr(t, "task_id", None)
        if not isinstance(tid, str):
            raise TypeError(f"cancel takes Task objects or task ids, not {type(t).__name__}")
        if not tid or len(tid) > 256 or any(c.isspace() for c in tid):
            raise ConfigError(f"{tid[:80]!r} is not a task id (no spaces, 1-256 characters)")
        out[tid] = None
    return list(out)


OPEN, ALREADY, NOT_OPEN = "open", "already_cancelled", "not_open"  # what send says of each id


async def send(r: Any, keys: Keys, ids: list[str], ttl_s: float, interrupt: bool = False) -> list[str]:
    """Record and announce cancels (or interrupts) of these task ids; returns, per id, ALREADY when
    one was still recorded, else OPEN or NOT_OPEN (queued or running, or not)."""
    now = time.time()
    expires = now + ttl_s
    states: list[str] = []
    recorded, word = (keys.interrupt_tasks(), "itask") if interrupt else (keys.cancel_tasks(), "task")
    for i in range(0, len(ids), CHUNK):
        chunk = ids[i : i + CHUNK]
        pipe = r.pipeline(transaction=True)
        pipe.zmscore(keys.open_tasks(), chunk)
        pipe.zmscore(recorded, chunk)
        pipe.zadd(recorded, {tid: expires for tid in chunk})
        pipe.zremrangebyscore(recorded, "-inf", now)
        pipe.publish(keys.cancel_events(), " ".join([word, f"{expires:.3f}", *chunk]))
        opened, before, *_ = await pipe.execute()
        for was_open, until in zip(opened, before):
            if until is not None and float(until) > now:
                states.append(ALREADY)
            else:
                states.append(OPEN if was_open is not None else NOT_OPEN)
    return states


async def send_run(r: Any, keys: Keys, run_id: str, ttl_s: float) -> tuple[Optional[int], bool]:
    """Record and announce a run's cancel; returns how many of its tasks were open, or None (and
    records nothing) for a run this namespace has never seen: no open task and no result stream;
    and whether a cancel of the run was still recorded."""
    pipe = r.pipeline(transaction=False)
    pipe.hget(keys.open_runs(), run_id)
    pipe.exists(keys.results(run_id))
    count, seen = await pipe.execute()
    if count is None and not seen:
        return None, False
    now = time.time()
    expires = now + ttl_s
    pipe = r.pipeline(transaction=True)
    pipe.hget(keys.open_runs(), run_id)
    pipe.zscore(keys.cancel_runs(), run_id)
    pipe.zadd(keys.cancel_runs(), {run_id: expires})
    pipe.zremrangebyscore(keys.cancel_runs(), "-inf", now)
    pipe.publish(keys.cancel_events(), f"run {expires:.3f} {run_id}")
    count, before, *_ = await pipe.execute()
    return max(0, int(count or 0)), before is not None and float(before) > now


async def send_run_interrupt(r: Any, keys: Keys, run_id: str, ttl_s: float) -> Optional[int]:
    """Record and announce an interrupt of every task of a run created until now (later ones, such
    as its continuations, run); how many of its tasks were open, or None for a run never seen."""
    pipe = r.pipeline(transaction=False)
    pipe.hget(keys.open_runs(), run_id)
    pipe.exists(keys.results(run_id))
    count, seen = await pipe.execute()
    if count is None and not seen:
        return None
    now = time.time()
    expires = now + ttl_s
    pipe = r.pipeline(transaction=True)
    pipe.zadd(keys.interrupt_runs(), {f"{run_id} {now:.3f}": expires})
    pipe.zremrangebyscore(keys.interrupt_runs(), "-inf", now)
    pipe.publish(keys.cancel_events(), f"irun {expires:.3f} {run_id} {now:.3f}")
    await pipe.execute()
    return max(0, int(count or 0))


OnInterrupt = Callable[[set[str], dict[str, float]], None]  # (task ids, run id -> created before)


class Cancels(ChannelWatch):
    """A worker process's mirror of every live cancel: `cancelled(task_id, run_id)` costs two set
    lookups; `on_cancel(task_ids, run_ids)` is called for each cancel message as it arrives."""

    what = "cancels"

    def __init__(self, redis: Any, keys: Keys, outage: Outage, on_cancel: Optional[OnCancel] = None):
        super().__init__(redis, keys.cancel_events(), outage)
        self.keys = keys
        self.on_cancel = on_cancel
        self.tasks: dict[str, float] = {}  # id -> when the cancel expires
        self.runs: dict[str, float] = {}
        # Interrupts (a task stopped with what it generated kept): task id -> expiry, and run id ->
        # (when its tasks created before it were interrupted, expiry).
        self.on_interrupt: Optional[OnInterrupt] = None
        self.itasks: dict[str, float] = {}
        self.iruns: dict[str, tuple[float, float]] = {}
        self._next_prune = time.monotonic() + PRUNE_EVERY_S

    def cancelled(self, task_id: str, run_id: str) -> bool:
        return task_id in self.tasks or run_id in self.runs

    def interrupted(self, task_id: str, run_id: str, created_at: float) -> bool:
        """Whether the task was interrupted (by id, or its run's interrupt came after it was created)."""
        if task_id in self.itasks:
            return True
        run = self.iruns.get(run_id)
        return run is not None and created_at <= run[0]

    async def _read(self) -> None:
        now = time.time()
        pipe = self.r.pipeline(transaction=False)
        pipe.zrangebyscore(self.keys.cancel_tasks(), now, "+inf", withscores=True)
        pipe.zrangebyscore(self.keys.cancel_runs(), now, "+inf", withscores=True)
        pipe.zrangebyscore(self.keys.interrupt_tasks(), now, "+inf", withscores=True)
        pipe.zrangebyscore(self.keys.interrupt_runs(), now, "+inf", withscores=True)
        tasks, runs, itasks, iruns = await pipe.execute()
        self.tasks = {text(k): float(v) for k, v in tasks}
        self.runs = {text(k): float(v) for k, v in runs}
        self.itasks = {text(k): float(v) for k, v in itasks}
        self.iruns = {}
        for member, until in iruns:
            run, _, at = text(member).partition(" ")
            self._interrupt_run(run, float(at or 0), float(until))
        if self.on_cancel is not None and (self.tasks or self.runs):
            self.on_cancel(set(self.tasks), set(self.runs))  # any that started while we were away
        if self.on_interrupt is not None and (self.itasks or self.iruns):
            self.on_interrupt(set(self.itasks), {run: at for run, (at, _) in self.iruns.items()})

    def _interrupt_run(self, run: str, at: float, until: float) -> None:
        known = self.iruns.get(run)
        if known is None or at > known[0]:
            self.iruns[run] = (at, until)

    def _apply(self, data: Any) -> None:
        what, expires, *ids = text(data).split(" ")
        try:
            until = float(expires)
        except ValueError:
            return
        if what in ("itask", "irun"):
            self._apply_interrupt(what, until, ids)
            return
        if what == "task":
            self.tasks.update(dict.fromkeys(ids, until))
            tasks, runs = set(ids), set()
        elif what == "run":
            self.runs.update(dict.fromkeys(ids, until))
            tasks, runs = set(), set(ids)
        else:
            return
        if self.on_cancel is not None:
            self.on_cancel(tasks, runs)
        if time.monotonic() >= self._next_prune:
            self._prune()

    def _apply_interrupt(self, what: str, until: float, ids: list[str]) -> None:
        if what == "itask":
            self.itasks.update(dict.fromkeys(ids, until))
            tasks, runs = set(ids), {}
        else:
            try:
                run, at = ids[0], float(ids[1])
            except (IndexError, ValueError):
                return
            self._interrupt_run(run, at, until)
            tasks, runs = set(), {run: at}
        if self.on_interrupt is not None:
            self.on_interrupt(tasks, runs)

    def _prune(self) -> None:
        """Forget cancels past their expiry (bounded memory; checked once a minute at most)."""
        self._next_prune = time.monotonic() + PRUNE_EVERY_S
        now = time.time()
        self.tasks = {k: v for k, v in self.tasks.items() if v > now}
        self.runs = {k: v for k, v in self.runs.items() if v > now}
        self.itasks = {k: v for k, v in self.itasks.items() if v > now}
        self.iruns = {k: v for k, v in self.iruns.items() if v[1] > now}
