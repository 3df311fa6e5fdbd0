"""The farm as Redis holds it right now: the agents, each agent's queue and runs, and the live workers.

Read here once for everyone who looks: `farm status`, the dashboard and its Prometheus
metrics, the client (does an agent have a worker?), and whatever starts workers and waits for
them to come up (`farm up`, `farm collect --embedded`, `farm demo`, the benchmarks). A
worker is live while its heartbeat key (`{ns}:worker:{id}`, JSON, expiring after
heartbeat_ttl_s) exists; the keys are found with SCAN and read with one MGET.

Where an agent's tasks are (farm.fairness): queued in their run's queue (the agent's backlog,
`{ns}:backlog:{agent}` as long), then moved into the agent's stream as workers have free slots,
where they wait unread (the group's lag: 0 or 1 most of the time) until a worker takes them
(pending) and settles them. A task not yet taken by a worker is `waiting`: backlog plus lag.

What a read costs does not grow with the number of tasks: per agent one round trip, one
snapshot (MULTI/EXEC: the stream's length, the group summary, the delayed set's size, the dead
stream's length, the stats hash, the backlog's length, the runs hash and the fair zset), then one
pipelined round trip for the length of each run's queue when the agent has runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import redis
import redis.asyncio as aioredis

from farm.keys import GROUP, Keys, text


def agents(r: redis.Redis, keys: Keys) -> list[str]:
    """Every agent that ever had tasks, sorted."""
    return sorted(text(a) for a in r.smembers(keys.agents()))


@dataclass(frozen=True)
class RunState:
    """One run on one agent: its tasks queued (waiting for a slot), in flight (moved to the stream and
    not yet settled), its share and cap (0: none). The field names are `farm status --json`'s."""

    run_id: str
    queued: int
    in_flight: int
    share: float
    cap: int


def run_ids(runs_hash: dict, fair: Iterable[Any]) -> tuple[dict[str, str], list[str]]:
    """The runs hash as text, and the agent's runs, sorted: those with tasks queued (the fair zset's
    members) or in flight (a `flight:R` field). Replies of HGETALL runs and ZRANGE fair 0 -1."""
    fields = {text(k): text(v) for k, v in runs_hash.items()}
    flying = {k[len("flight:") :] for k in fields if k.startswith("flight:")}
    return fields, sorted({text(m) for m in fair} | flying)


def run_rows(fields: dict[str, str], runs: list[str], lengths: Iterable[Any]) -> list[RunState]:
    """Each run's state from the runs hash (run_ids) and its queue's length (LLEN, in runs' order)."""
    return [
        RunState(
            run_id=run,
            queued=int(n),
            in_flight=int(fields.get(f"flight:{run}", 0)),
            share=float(fields.get(f"share:{run}", 1)),
            cap=int(fields.get(f"cap:{run}", 0)),
        )
        for run, n in zip(runs, lengths)
    ]


def runs(r: redis.Redis, keys: Keys, agent: str) -> list[RunState]:
    """The agent's runs with tasks queued or in flight, by run id (two round trips; one with no runs)."""
    pipe = r.pipeline(transaction=False)
    pipe.hgetall(keys.runs(agent))
    pipe.zrange(keys.fair(agent), 0, -1)
    return _runs(r, keys, agent, *pipe.execute())


def _runs(r: redis.Redis, keys: Keys, agent: str, runs_hash: dict, fair: list) -> list[RunState]:
    fields, names = run_ids(runs_hash, fair)
    if not names:
        return []
    queues = {run: _queue_key(keys, agent, run) for run in names}
    pipe = r.pipeline(transaction=False)
    for key in queues.values():
        if key is not None:
            pipe.llen(key)
    lengths = iter(pipe.execute())
    return run_rows(fields, names, [0 if queues[run] is None else next(lengths) for run in names])


def _queue_key(keys: Keys, agent: str, run: str) -> Optional[str]:
    """The run's queue; None for a name no queue can have (a field written by hand): shown, never read."""
    try:
        return keys.queue(agent, run)
    except ValueError:
        return None


@dataclass(frozen=True)
class QueueState:
    """One agent's task stream, backlog, runs and side sets (the field names are `farm status --json`'s)."""

    length: int  # entries in the task stream: not yet delivered, or delivered and not yet settled
    pending: int  # delivered to a worker and not yet settled (in flight)
    lag: Optional[int]  # in the stream, not yet delivered, as the group says; None: no group yet (or no lag)
    consumers: int
    delayed: int  # retries waiting out their backoff
    dead: int  # dead letters kept
    counters: dict[str, int]  # the stats hash: done, failed, cancelled, retried, dead, duplicate
    backlog: int  # queued in the agent's run queues, not yet moved to the stream (the list KEDA reads)
    runs: tuple[RunState, ...]  # the runs with tasks queued or in flight, by run id

    @property
    def unread(self) -> int:
        """Entries in the stream no worker has taken yet: the group's lag, else what length and
        pending imply (before any worker read the stream, every entry)."""
        return self.lag if self.lag is not None else max(0, self.length - self.pending)

    @property
    def waiting(self) -> int:
        """Tasks no worker has taken yet: the backlog and the stream's unread entries."""
        return self.backlog + self.unread


def queue(r: redis.Redis, keys: Keys, agent: str) -> QueueState:
    stream = keys.tasks(agent)
    pipe = r.pipeline(transaction=True)  # one snapshot: a task moving from backlog to stream is counted once
    pipe.xlen(stream)
    pipe.xinfo_groups(stream)
    pipe.zcard(keys.delayed(agent))
    pipe.xlen(keys.dead(agent))
    pipe.hgetall(keys.stats(agent))
    pipe.llen(keys.backlog(agent))
    pipe.hgetall(keys.runs(agent))
    pipe.zrange(keys.fair(agent), 0, -1)
    length, groups, delayed, dead, stats, backlog, runs_hash, fair = pipe.execute(raise_on_error=False)
    for reply in (length, delayed, dead, stats, backlog, runs_hash, fair):
        if isinstance(reply, Exception):
            raise reply
    pending, consumers, lag = 0, 0, None
    if not isinstance(groups, redis.ResponseError):  # no stream yet: no group either
        if isinstance(groups, Exception):
            raise groups
        for g in groups:
            if text(g["name"]) == GROUP:
                pending, consumers, lag = int(g["pending"]), int(g["consumers"]), g.get("lag")
    return QueueState(
        length=int(length),
        pending=pending,
        lag=None if lag is None else int(lag),
        consumers=consumers,
        delayed=int(delayed),
        dead=int(dead),
        counters={text(k): int(v) for k, v in stats.items()},
        backlog=int(backlog),
        runs=tuple(_runs(r, keys, agent, runs_hash, fair)),
    )


@dataclass(frozen=True)
class LiveWorkers:
    """The heartbeats of the live workers, sorted by (agent, worker_id), and the keys of any that
    do not hold a JSON object. Its length counts both: every key is a worker that is up."""

    beats: list[dict[str, Any]]
    unreadable: list[str]

    @classmethod
    def parse(cls, names: Iterable[Any], values: Iterable[Any]) -> "LiveWorkers":
        beats, unreadable = [], []
        for name, raw in zip(names, values):
            if not raw:
                continue  # expired between SCAN and MGET: that worker is gone
            try:
                info = json.loads(raw)
            except ValueError:
                info = None
            if isinstance(info, dict):
                beats.append(info)
            else:
                unreadable.append(text(name))
        beats.sort(key=lambda w: (str(w.get("agent")), str(w.get("worker_id"))))
        return cls(beats, unreadable)

    def __len__(self) -> int:
        return len(self.beats) + len(self.unreadable)

    def agents(self) -> set[str]:
        """Agents with at least one live worker."""
        return {w["agent"] for w in self.beats if isinstance(w.get("agent"), str)}

    def listing(self) -> list[dict[str, Any]]:
        """Every live worker, an unreadable heartbeat as {worker_id: its key, error}: what `farm status` lists."""
        return self.beats + [{"worker_id": key, "error": "unreadable heartbeat"} for key in self.unreadable]


def live_workers(r: redis.Redis, keys: Keys) -> LiveWorkers:
    names = list(r.scan_iter(match=keys.worker_pattern(), count=500))
    return LiveWorkers.parse(names, r.mget(names) if names else [])


async def live_workers_async(r: aioredis.Redis, keys: Keys) -> LiveWorkers:
    names = [k async for k in r.scan_iter(match=keys.worker_pattern(), count=500)]
    return LiveWorkers.parse(names, await r.mget(names) if names else [])
