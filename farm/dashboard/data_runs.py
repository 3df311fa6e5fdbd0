"""The runs (collections, evaluations, training runs) and one worker, as the dashboard's run and
worker pages show them; read from Redis only.

Where a run's numbers come from: its rollouts settled in the history window (the history kept,
`history_ttl_s`) are the `run:`, `runfail:` and `runpv:` fields of every agent's per-minute buckets
(farm.history): done, failed and cancelled, failures by kind, and per policy version the rollouts
with a reward, their mean reward and pass rate. Its open tasks (submitted, not yet settled) are its
field of `{ns}:open_runs` (farm.cancel), so "settled of N submitted" is N = settled + open. Its
share, cap, queued and in flight per agent are farm.state.runs'.

What a page costs: per agent one pipelined round trip of one HGETALL per minute of the window and
the two round trips of farm.state.runs, then one HGETALL of open_runs; it grows with agents, runs
and minutes, never with tasks. A worker's page is one GET of its heartbeat and one XREVRANGE of its
agent's newest dead letters.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import redis

from farm import history, state
from farm.deadletters import list_dead
from farm.keys import Keys, check_name, text

RATE_MINUTES = 5  # the window of a run's rates, as the overview's
LETTERS_SCANNED = 200  # a worker's recent failures: among its agent's newest dead letters
OUTCOMES = history.RUN_OUTCOMES


def href(run_id: str) -> str:
    """The run's page; every character of the id quoted, so an id holding '/', '?' or '#' is one segment."""
    return "/runs/" + urllib.parse.quote(run_id, safe="")


@dataclass
class _Run:
    """What the buckets say of one run, summed over agents and minutes."""

    first: int = 0
    last: int = 0
    agents: set[str] = field(default_factory=set)
    totals: dict[str, float] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0.0))
    recent: dict[str, float] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0.0))
    kinds: dict[str, float] = field(default_factory=dict)
    versions: dict[int, dict[str, float]] = field(default_factory=dict)
    minutes: dict[int, dict[str, float]] = field(default_factory=dict)

    def add(self, agent: str, m: int, counts: dict[str, float], is_recent: bool) -> None:
        self.agents.add(agent)
        self.first = min(self.first, m) if self.first else m
        self.last = max(self.last, m)
        per_minute = self.minutes.setdefault(m, dict.fromkeys(OUTCOMES, 0.0))
        for outcome, n in counts.items():
            self.totals[outcome] += n
            per_minute[outcome] += n
            if is_recent:
                self.recent[outcome] += n


def _scan(r: redis.Redis, keys: Keys, now: float, window_min: int) -> tuple[dict[str, _Run], dict[str, list]]:
    """Every run in the agents' buckets of the window, and each agent's runs with tasks queued or in flight."""
    minutes, _ = history.window(now, max(window_min, RATE_MINUTES))
    recent = set(history.window(now, RATE_MINUTES)[0])
    found: dict[str, _Run] = {}
    placed: dict[str, list] = {}
    for agent in state.agents(r, keys):
        for m, bucket in zip(minutes, history.buckets(r, keys, agent, minutes)):
            if not bucket:
                continue
            for rid, counts in history.run_counts(bucket).items():
                found.setdefault(rid, _Run()).add(agent, m, counts, m in recent)
            for rid, kinds in history.run_failures(bucket).items():
                acc = found.setdefault(rid, _Run()).kinds
                for kind, n in kinds.items():
                    acc[kind] = acc.get(kind, 0.0) + n
            for rid, versions in history.run_versions(bucket).items():
                into = found.setdefault(rid, _Run()).versions
                for version, stats in versions.items():
                    have = into.setdefault(version, dict.fromkeys(history.RUN_VERSION_STATS, 0.0))
                    for stat, n in stats.items():
                        have[stat] += n
        for row in state.runs(r, keys, agent):
            placed.setdefault(row.run_id, []).append({"agent": agent, **asdict(row)})
    return found, placed


def _open_runs(r: redis.Redis, keys: Keys) -> dict[str, int]:
    raw: Any = r.hgetall(keys.open_runs())
    out = {}
    for k, v in raw.items():
        try:
            out[text(k)] = max(0, int(v))
        except ValueError:
            continue
    return out


def _row(run_id: str, acc: _Run, placement: list, open_n: int, now: float, span: float) -> dict[str, Any]:
    settled = int(sum(acc.totals.values()))
    submitted = settled + open_n
    ended = acc.totals["done"] + acc.totals["failed"]
    queued = sum(p["queued"] for p in placement)
    in_flight = sum(p["in_flight"] for p in placement)
    active = bool(open_n or queued or in_flight)
    return {
        "run_id": run_id,
        "href": href(run_id),
        "agents": sorted(acc.agents | {p["agent"] for p in placement}),
        **{outcome: int(n) for outcome, n in acc.totals.items()},
        "settled": settled,
        "open": open_n,
        "submitted": submitted,
        "progress": settled / submitted if submitted else None,
        "queued": queued,
        "in_flight": in_flight,
        "failure_rate": acc.totals["failed"] / ended if ended else None,
        **{f"{outcome}_per_min": n / span for outcome, n in acc.recent.items()},
        "active": active,
        # newest first: a run with open tasks is active now; else the last minute it settled one
        "last_minute": history.minute(now) if active else acc.last,
        "first_minute": acc.first,
    }


def runs(r: redis.Redis, keys: Keys, window_min: int, now: Optional[float] = None) -> dict[str, Any]:
    """Every run seen in the window or with tasks open, queued or in flight, newest first: those with
    tasks open first, then by the last minute they settled a rollout, then by the first."""
    now = time.time() if now is None else now
    found, placed = _scan(r, keys, now, window_min)
    open_runs = _open_runs(r, keys)
    _, span = history.window(now, RATE_MINUTES)
    names = set(found) | set(placed) | {rid for rid, n in open_runs.items() if n > 0}
    rows = [_row(rid, found.get(rid) or _Run(), placed.get(rid, []), open_runs.get(rid, 0), now, span) for rid in names]
    rows.sort(key=lambda x: (not x["active"], -x["last_minute"], -x["first_minute"], x["run_id"]))
    return {"at": now, "window_minutes": window_min, "rate_minutes": RATE_MINUTES, "runs": rows}


def run(r: redis.Redis, keys: Keys, run_id: str, window_min: int, now: Optional[float] = None) -> Optional[dict]:
    """One run: its row (as in `runs`), where it runs (per agent: share, cap, queued, in flight),
    failures by kind, its learning curve (per policy version: rollouts with a reward, mean reward,
    pass rate) and its rollouts per minute since it first settled one in the window; None when
    the window holds none of its rollouts and none of its tasks is open, queued or in flight."""
    now = time.time() if now is None else now
    found, placed = _scan(r, keys, now, window_min)
    held: Any = r.hget(keys.open_runs(), run_id)
    try:
        open_n = max(0, int(held or 0))
    except ValueError:
        open_n = 0
    acc, placement = found.get(run_id), placed.get(run_id, [])
    if acc is None and not placement and not open_n:
        return None
    acc = acc or _Run()
    _, span = history.window(now, RATE_MINUTES)
    curve = [
        {
            "version": version,
            "n": int(stats["n"]),
            "mean_reward": stats["reward"] / stats["n"] if stats["n"] else None,
            "pass_rate": stats["passed"] / stats["n"] if stats["n"] else None,
        }
        for version, stats in sorted(acc.versions.items())
    ]
    rewarded = sum(stats["n"] for stats in acc.versions.values())
    current = history.minute(now)
    start = acc.first or current
    return {
        **_row(run_id, acc, placement, open_n, now, span),
        "at": now,
        "window_minutes": window_min,
        "rate_minutes": RATE_MINUTES,
        "placement": sorted(placement, key=lambda p: p["agent"]),
        "failures_by_kind": sorted(((k, int(n)) for k, n in acc.kinds.items() if n), key=lambda kv: (-kv[1], kv[0])),
        "curve": curve,
        "rewarded": int(rewarded),
        "mean_reward": sum(s["reward"] for s in acc.versions.values()) / rewarded if rewarded else None,
        "pass_rate": sum(s["passed"] for s in acc.versions.values()) / rewarded if rewarded else None,
        "per_minute": [
            {"minute": m, **acc.minutes.get(m, dict.fromkeys(OUTCOMES, 0.0))} for m in range(start, current + 1)
        ],
    }


HEARTBEAT = ("worker_id", "agent", "host", "pid", "concurrency", "inflight", "started_at", "version", "ts")


def worker(
    r: redis.Redis, keys: Keys, worker_id: str, *, max_entry_bytes: int, scanned: int = LETTERS_SCANNED
) -> Optional[dict[str, Any]]:
    """A live worker from its heartbeat, with its counters (every other number it holds) and its recent
    failures: its agent's dead letters that name it as their worker, among the newest `scanned`.
    None when no heartbeat holds that id (gone, or never was)."""
    if not worker_id or len(worker_id) > 512:
        return None
    raw: Any = r.get(keys.worker(worker_id))
    if raw is None:
        return None
    try:
        beat = json.loads(raw)
    except ValueError:
        beat = None
    if not isinstance(beat, dict):
        return {"worker_id": worker_id, "unreadable": True, "counters": {}, "failures": [], "scanned": 0}
    counters = {
        str(k): v
        for k, v in sorted(beat.items())
        if k not in HEARTBEAT and isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    agent = beat.get("agent")
    failures: list[dict] = []
    seen = 0
    try:
        valid = isinstance(agent, str) and check_name(agent, "agent name") == agent
    except ValueError:
        valid = False
    if valid:
        letters = list_dead(r, keys, str(agent), count=scanned, max_entry_bytes=max_entry_bytes)
        seen = len(letters)
        failures = [x for x in letters if x.get("worker") == worker_id]
    facts = {k: beat.get(k) for k in HEARTBEAT}
    return {
        **facts,
        "worker_id": worker_id,
        "agent_link": valid,
        "counters": counters,
        "failures": failures,
        "scanned": seen,
    }
