"""Sandbox figures per agent, summed over the live workers' heartbeats, for `farm status`, the
dashboard and `/metrics`.

Each worker process of a sandboxed environment puts its `sandboxes` into its heartbeat
(workers/loops/sandboxes.py SandboxStats.snapshot): sandboxes starting and running now, starts
that succeeded and failed and rollouts failed for want of a sandbox (`infrastructure`) since
that process started, and the p50/p99 of its last 1,024 start latencies. A worker without
sandboxes has no such field, and its agent appears here only if another of its workers has.

Across an agent's workers: the counts are summed, so the "since" counts fall when a worker goes
(its heartbeat expires) and restart from 0 in the process that replaces it; start latency p50 is
the median of the workers' p50s (of those that have started a sandbox; the mean of the middle two
when their number is even) and p99 the worst worker's p99, a bound no worker's tail exceeds. The
workers' own samples are not in Redis, so the farm's exact quantiles cannot be computed here.
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable, Optional

# The heartbeat's counts, in the order `farm status` and the dashboard show them.
COUNTS = ("starting", "running", "started", "start_failed", "infrastructure")


def _count(value: Any) -> int:
    """A heartbeat's count; anything that is not a non-negative number (a hand-written key) is 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        return 0
    return int(value)


def _seconds(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        return None
    return float(value)


def by_agent(beats: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per agent whose live workers report sandboxes, sorted by agent: `workers` (those reporting),
    the summed COUNTS, `start_p50_s` and `start_p99_s` (None until one of them started a sandbox).
    `beats`: farm.state.LiveWorkers.beats."""
    found: dict[str, list[dict[str, Any]]] = {}
    for beat in beats:
        box, agent = beat.get("sandboxes"), beat.get("agent")
        if isinstance(box, dict) and isinstance(agent, str):
            found.setdefault(agent, []).append(box)
    out: dict[str, dict[str, Any]] = {}
    for agent in sorted(found):
        boxes = found[agent]
        p50s = [s for s in (_seconds(b.get("start_p50_s")) for b in boxes) if s is not None]
        p99s = [s for s in (_seconds(b.get("start_p99_s")) for b in boxes) if s is not None]
        out[agent] = {
            "workers": len(boxes),
            **{k: sum(_count(b.get(k)) for b in boxes) for k in COUNTS},
            "start_p50_s": statistics.median(p50s) if p50s else None,
            "start_p99_s": max(p99s) if p99s else None,
        }
    return out
