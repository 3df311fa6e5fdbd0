"""Held-out evaluation: one greedy (or fixed-seed) rollout per row, and its pass rate with a 95% interval.

`farm eval` collects the rows once each through the farm (the same path as `farm collect`),
then reads the rollouts back: a rollout passes when its reward reaches the pass threshold.
Rollouts that failed (a model error, a verifier crash, a deadline) carry no reward; they are
counted and reported apart, never as misses, so an outage cannot pass for a worse model.
Rollouts of tasks a client cancelled are neither: counted apart again, as `cancelled`.
The interval is Wilson's score interval, which stays inside [0, 1] and behaves at 0% and 100%
and at the few hundred rows a held-out set on one machine has.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from itertools import chain
from pathlib import Path
from typing import Any

Z95 = 1.959963984540054


def wilson(passes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (0, 1 when n is 0)."""
    if n <= 0:
        return 0.0, 1.0
    p = passes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _agent_rollouts(path: Path):
    if not path.exists():
        return
    with path.open("rb") as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                yield record["agent"], record["rollout"]


def score(output: Path, failures: Path, threshold: float = 1.0) -> dict[str, Any]:
    """Pass counts, rates and 95% intervals per agent and overall, from a collection's files."""
    fields = ("n", "passes", "failed", "cancelled")
    counts: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(fields, 0))
    for agent, rollout in chain(_agent_rollouts(output), _agent_rollouts(failures)):
        status, reward = rollout.get("status"), rollout.get("reward")
        if status == "cancelled":
            counts[agent]["cancelled"] += 1
        elif status in ("ok", "truncated") and reward is not None:
            counts[agent]["n"] += 1
            counts[agent]["passes"] += int(reward >= threshold)
        else:
            counts[agent]["failed"] += 1
    total = {k: sum(c[k] for c in counts.values()) for k in fields}
    return {"agents": {a: _rates(c) for a, c in sorted(counts.items())}, "overall": _rates(total)}


def _rates(c: dict[str, int]) -> dict[str, Any]:
    lo, hi = wilson(c["passes"], c["n"])
    return {**c, "pass_rate": c["passes"] / c["n"] if c["n"] else None, "ci95": [lo, hi]}


def render(result: dict[str, Any]) -> str:
    """The result as a table that fits 80 columns; cancelled rollouts, if any, in a line under it."""
    lines = [f"{'agent':<24} {'rows':>6} {'passed':>7} {'pass rate':>10} {'95% interval':>17} {'failed':>7}"]
    for name, r in [*result["agents"].items(), ("all", result["overall"])]:
        rate = "-" if r["pass_rate"] is None else f"{100 * r['pass_rate']:.1f}%"
        lo, hi = r["ci95"]
        interval = f"{100 * lo:.1f}% - {100 * hi:.1f}%"
        lines.append(f"{name[:24]:<24} {r['n']:>6} {r['passes']:>7} {rate:>10} {interval:>17} {r['failed']:>7}")
    if result["overall"].get("cancelled"):
        cancelled = ", ".join(f"{a} {r['cancelled']}" for a, r in result["agents"].items() if r["cancelled"])
        lines.append(f"cancelled (not failed, not scored): {cancelled}")
    return "\n".join(lines)
