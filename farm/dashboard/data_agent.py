"""An agent's per-minute history for its charts (farm.history), read from Redis only.

A page costs one HGETALL per minute of its window, in one pipelined round trip, whatever the
number of tasks. The window starts at the first minute that holds any data when that is later
than `now - minutes`, so a farm started ten minutes ago fills its charts with those ten minutes
instead of squeezing them into the last pixels of three hours. Queue depth is a level that the
workers write on a clock (every DEPTH_EVERY_S, workers.delivery.runtime) as well as with their
counts, so a minute in which nothing settled still has one.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import redis

from farm import history
from farm.keys import Keys


def series(r: redis.Redis, keys: Keys, agent: str, minutes: int = 180, now: Optional[float] = None) -> dict:
    """Per-minute history of one agent for the charts: throughput (done, failed, cancelled), failures by
    kind, reward and pass rate, latency, queue depth (None in a minute no worker wrote one). `start` is
    the first minute shown, `trimmed` whether that is later than the window's start (no data before)."""
    now = time.time() if now is None else now
    span, _ = history.window(now, minutes)
    found = history.buckets(r, keys, agent, span)
    first = next((i for i, bucket in enumerate(found) if bucket), 0)
    points = [_point(m, bucket) for m, bucket in zip(span[first:], found[first:])]
    return {"agent": agent, "start": span[first], "now": now, "trimmed": first > 0, "points": points}


def _point(m: int, bucket: dict[str, float]) -> dict[str, Any]:
    s = history.summary(bucket, 1.0)
    return {
        "minute": m,
        "done": int(bucket.get("done", 0)),
        "depth": int(bucket["depth"]) if "depth" in bucket else None,
        "failed": int(bucket.get("failed", 0)),
        "cancelled": int(bucket.get("cancelled", 0)),
        "failures_by_kind": s["failures_by_kind"],
        "mean_reward": s["mean_reward"],
        "pass_rate": s["pass_rate"],
        "latency_p50_s": s["latency_p50_s"],
        "latency_p99_s": s["latency_p99_s"],
        "tokens_per_s": s["tokens_per_s"],
    }
