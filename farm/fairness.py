"""Fair share between runs: several trainings, evaluations and collections on one agent's workers.

A farm serves several runs at once. Each run's tasks wait in their own queue per agent
(`{ns}:queue:{agent}:{run}`, a list, first in first out), not in the agent's stream. Workers
take tasks through the FEED script (farm.scripts), run in the same round trip as their
XREADGROUP: it moves queued tasks into the stream, one run after another, until the stream
holds as many unread tasks as the worker has free slots. The next task comes from the run
with the lowest `(in_flight + 1) / share` among the runs with tasks queued (the members of the
agent's fair zset, `{ns}:fair:{agent}`) that are under their cap. So the agent's slots are
shared between the runs with a backlog in proportion to their shares (D'Hondt's rule), whoever
submitted first or faster; a run with no backlog takes nothing; a new run has nothing in flight
and is served at the next fetch. A run at its cap (`max_in_flight`) waits for one of its slots.
FEED reads the runs' counts once per call, so a settle only decrements its run's count.

Why slots and not tasks: what runs share is worker time. Counting slots held, a run whose
rollouts take ten times longer gets the same share of the workers, not ten times as much, and
a training run that comes back after its optimizer step with a small batch gets free slots at
once (it holds none), instead of waiting behind a collection's backlog in dispatch order.

In flight means fed to the stream and not yet settled (running, or waiting to be read, or a
retry in its backoff is not). Each entry FEED writes carries its run (`r`); the settle script
takes it out of that run's count, and RETRY/PROMOTE take it out and back in (farm.scripts).
Entries added to the stream any other way (a requeued dead letter) count for no run.

A run's share and cap are given when its tasks are submitted (`FarmClient.submit(tasks,
share=3)`, `farm collect --share 3 --max-in-flight 64`, the trainer's `share`); the last
submit's values hold. The agent's runs hash `{ns}:runs:{agent}` holds `share:R`, `cap:R` and
`flight:R`; `{ns}:backlog:{agent}` is a list one byte per queued task long, so that KEDA's Redis
list scaler can read the backlog (deploy/k8s) and `farm status` the agent's queued total.

Cancelling a run (`FarmClient.cancel_run`) drains its queues at once: each queued task is
answered with its `cancelled` rollout by the DRAIN script, which takes a task only while it is
still at its queue's head, so a task FEED moved in the meantime is settled by its worker
instead, as `cancelled`: one rollout either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from farm import schema, scripts
from farm.errors import ConfigError, SchemaError
from farm.keys import Keys
from farm.schema import Rollout
from farm.state import RunState, run_ids, run_rows

CHUNK = 1000  # tasks per DRAIN script
MAX_SHARE = 1e6


def check_share(share: Any) -> float:
    """A run's share: a finite number above 0 (a run's slots are proportional to it)."""
    try:
        value = float(share)
    except (TypeError, ValueError):
        raise ConfigError(f"share {share!r} must be a number above 0") from None
    if not math.isfinite(value) or not 0 < value <= MAX_SHARE:
        raise ConfigError(f"share {share!r} must be a number above 0 and at most {MAX_SHARE:,.0f}")
    return value


def check_cap(cap: Any) -> int:
    """A run's cap on tasks in flight per agent: 0 (none) or a positive whole number."""
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
        raise ConfigError(f"max_in_flight {cap!r} must be a whole number, 0 for no cap")
    return cap


def item(fields: dict) -> bytes:
    """A task entry as its run's queue holds it: `VERSION|BODY`."""
    return bytes(fields[b"v"]) + b"|" + bytes(fields[b"d"])


def enqueue(pipe: Any, keys: Keys, agent: str, run_id: str, items: list[bytes], share: float, cap: int) -> None:
    """Queue one run's tasks for an agent (ENQUEUE, sent as source: a client never meets NOSCRIPT)."""
    scripts.enqueue(
        fair=keys.fair(agent),
        runs=keys.runs(agent),
        queue=keys.queue(agent, run_id),
        backlog=keys.backlog(agent),
        run=run_id,
        share=share,
        cap=cap,
        items=items,
    ).queue_source(pipe)


def wake(pipe: Any, keys: Keys, agent: str, group: str) -> None:
    """Move one task into the stream when no worker has an unread one: that wakes a worker blocked
    on the stream, whose next fetch feeds the rest in fair order."""
    scripts.feed(
        fair=keys.fair(agent),
        runs=keys.runs(agent),
        stream=keys.tasks(agent),
        backlog=keys.backlog(agent),
        group=group,
        want=1,
        queue_prefix=keys.queue_prefix(agent),
    ).queue_source(pipe)


async def drain(r: Any, keys: Keys, agent: str, run_id: str, message: str) -> int:
    """Answer every task of `run_id` still queued for `agent` with its `cancelled` rollout; returns
    how many. An item that cannot be decoded is left for a worker, which dead-letters it."""
    queue = keys.queue(agent, run_id)
    done = 0
    while True:
        raw = await r.lrange(queue, 0, CHUNK - 1)
        if not raw:
            return done
        tasks = []
        for entry in raw:
            rollout = _cancelled(entry, keys, message)
            if rollout is None:
                break  # left for a worker: DRAIN takes only from the head, so stop here
            fields = schema.entry(rollout.rollout)
            tasks.append((entry, rollout.reply_to, rollout.rollout.task_id, fields[b"v"], fields[b"d"]))
        if not tasks:
            return done
        n = await scripts.drain(
            fair=keys.fair(agent),
            runs=keys.runs(agent),
            queue=queue,
            backlog=keys.backlog(agent),
            open_tasks=keys.open_tasks(),
            open_runs=keys.open_runs(),
            stats=keys.stats(agent),
            run=run_id,
            prefix=keys.results_prefix(),
            tasks=tasks,
        ).run_source(r)
        if n <= 0:
            return done  # nothing at the head any more (workers took it), or a bad reply stream
        done += n


@dataclass(frozen=True)
class _Answer:
    reply_to: str
    rollout: Rollout


def _cancelled(entry: bytes, keys: Keys, message: str) -> Optional[_Answer]:
    version, sep, body = bytes(entry).partition(b"|")
    if not sep:
        return None
    try:
        task = schema.decode_task({b"v": version, b"d": body})
    except SchemaError:
        return None
    if not keys.is_result_stream(task.reply_to):
        return None
    return _Answer(task.reply_to, Rollout.cancelled(task, message))


async def run_states(r: Any, keys: Keys, agent: str) -> list[RunState]:
    """The agent's runs with tasks queued or in flight, by run id (farm.state reads the same, blocking)."""
    fields, runs = run_ids(await r.hgetall(keys.runs(agent)), await r.zrange(keys.fair(agent), 0, -1))
    return run_rows(fields, runs, await _lengths(r, [keys.queue(agent, run) for run in runs]))


async def _lengths(r: Any, queues: list[str]) -> list[int]:
    if not queues:
        return []
    pipe = r.pipeline(transaction=False)
    for q in queues:
        pipe.llen(q)
    return [int(n) for n in await pipe.execute()]
