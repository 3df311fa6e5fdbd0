"""The farm as Redis holds it right now: the agents, each agent's queue, and the live workers.

Read here once for everyone who looks: `farm status`, the dashboard and its Prometheus
metrics, the client (does an agent have a worker?), and whatever starts workers and waits for
them to come up (`farm up`, `farm collect --embedded`, `farm demo`, the benchmarks). A
worker is live while its heartbeat key (`{ns}:worker:{id}`, JSON, expiring after
heartbeat_ttl_s) exists; the keys are found with SCAN and read with one MGET.

What a read costs does not grow with the number of tasks: per agent one pipelined round trip
(the stream's length, the delayed set's size, the dead stream's length, the stats hash) and
the group summary (XINFO GROUPS).
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
class QueueState:
    """One agent's task stream and its side sets (the field names are `farm status --json`'s)."""

    length: int  # entries in the task stream: not yet delivered, or delivered and not yet settled
    pending: int  # delivered to a worker and not yet settled (in flight)
    lag: Optional[int]  # not yet delivered, as the group says; None with no group yet (or no lag from Redis)
    consumers: int
    delayed: int  # retries waiting out their backoff
    dead: int  # dead letters kept
    counters: dict[str, int]  # the stats hash: done, failed, cancelled, retried, dead, duplicate

    @property
    def waiting(self) -> int:
        """Entries no worker has taken yet: the group's lag, else what length and pending imply
        (before any worker read the stream, every entry)."""
        return self.lag if self.lag is not None else max(0, self.length - self.pending)


def queue(r: redis.Redis, keys: Keys, agent: str) -> QueueState:
    stream = keys.tasks(agent)
    pipe = r.pipeline(transaction=False)
    pipe.xlen(stream)
    pipe.zcard(keys.delayed(agent))
    pipe.xlen(keys.dead(agent))
    pipe.hgetall(keys.stats(agent))
    length, delayed, dead, stats = pipe.execute()
    pending, consumers, lag = 0, 0, None
    try:
        for g in r.xinfo_groups(stream):
            if text(g["name"]) == GROUP:
                pending, consumers, lag = int(g["pending"]), int(g["consumers"]), g.get("lag")
    except redis.ResponseError:
        pass  # no stream yet
    return QueueState(
        length=int(length),
        pending=pending,
        lag=None if lag is None else int(lag),
        consumers=consumers,
        delayed=int(delayed),
        dead=int(dead),
        counters={text(k): int(v) for k, v in stats.items()},
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
