"""Judge figures in Redis: what every worker process's judge pool did, for `farm status`, the
dashboard and `/metrics` (which read Redis only, like every other farm figure).

{ns}:judge:{name}            hash of counters since the farm began: calls, ok, failed, deadline,
                             cache_hits, latency_s (the sum of answered requests' latencies),
                             b0..bN (their latency histogram, BUCKETS_S)
{ns}:judge:{name}:{minute}   the same counters for one epoch minute (expires after HISTORY_S)
{ns}:judges                  set of judge names that were ever asked
{ns}:judges:max_in_flight    zset: judge -> the most requests in flight one process had at once

Writers (workers/policy/judges.py) add their deltas every few seconds; `calls` counts what
verifiers asked (cache hits included), `ok + failed` the requests sent to the judge.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from farm.keys import Keys, check_name

BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, float("inf"))
COUNTERS = ("calls", "ok", "failed", "deadline", "cache_hits", "latency_s")
HISTORY_S = 3600
WINDOW_MINUTES = 5


def names_key(keys: Keys) -> str:
    return f"{keys.ns}:judges"


def max_key(keys: Keys) -> str:
    return f"{keys.ns}:judges:max_in_flight"


def totals_key(keys: Keys, judge: str) -> str:
    return f"{keys.ns}:judge:{check_name(judge, 'judge name')}"


def minute_key(keys: Keys, judge: str, minute: int) -> str:
    return f"{totals_key(keys, judge)}:{minute}"


def bucket(seconds: float) -> int:
    return next(i for i, edge in enumerate(BUCKETS_S) if seconds <= edge)


def quantile(counts: list[float], q: float) -> Optional[float]:
    """The upper edge of the histogram bucket holding quantile q (None when empty)."""
    total = sum(counts)
    if total <= 0:
        return None
    seen = 0.0
    for edge, n in zip(BUCKETS_S, counts):
        seen += n
        if seen >= q * total:
            return edge
    return BUCKETS_S[-1]


def _num(raw: dict, name: str) -> float:
    value = raw.get(name) or raw.get(name.encode()) or 0
    return float(value)


def summary(r: Any, keys: Keys, now: Optional[float] = None) -> dict[str, dict[str, Any]]:
    """Per judge: its totals, latency histogram, and over the last WINDOW_MINUTES its calls per
    second, failures per minute, mean latency and p50/p99 (bucket upper edges). `r`: sync Redis."""
    now = time.time() if now is None else now
    current = int(now // 60)
    minutes = list(range(current - WINDOW_MINUTES + 1, current + 1))
    span_s = (WINDOW_MINUTES - 1) * 60 + (now - current * 60)
    out: dict[str, dict[str, Any]] = {}
    peaks = {(k.decode() if isinstance(k, bytes) else k): v for k, v in r.zrange(max_key(keys), 0, -1, withscores=True)}
    for raw_name in sorted(r.smembers(names_key(keys))):
        name = raw_name.decode() if isinstance(raw_name, bytes) else raw_name
        pipe = r.pipeline()
        pipe.hgetall(totals_key(keys, name))
        for m in minutes:
            pipe.hgetall(minute_key(keys, name, m))
        total, *recent = pipe.execute()
        win = {c: sum(_num(h, c) for h in recent) for c in (*COUNTERS, *(f"b{i}" for i in range(len(BUCKETS_S))))}
        answered = win["ok"]  # latency is measured on answered requests
        hist = [win[f"b{i}"] for i in range(len(BUCKETS_S))]
        out[name] = {
            **{c: _num(total, c) for c in COUNTERS},
            "buckets": [_num(total, f"b{i}") for i in range(len(BUCKETS_S))],
            "max_in_flight": peaks.get(name, 0.0),
            "calls_per_s": win["calls"] / span_s,
            "failed_per_min": win["failed"] / (span_s / 60),
            "cache_hits_window": win["cache_hits"],
            "latency_mean_s": win["latency_s"] / answered if answered else None,
            "latency_p50_s": quantile(hist, 0.5),
            "latency_p99_s": quantile(hist, 0.99),
        }
    return out
