"""What the dashboard shows, read from Redis only; every figure here is what a test checks.

The cost of a refresh grows with the number of agents, runs, workers and minutes shown, never
with the number of tasks: per agent the reads of farm.state.queue (a stream length, the group
summary, the delayed set's size, the dead stream's length, the stats hash, the backlog's length,
the runs hash and fair zset, then each queued run's queue length) and one HGETALL per minute of
history; the workers' heartbeats are read by their keys. No KEYS, no scan of task entries.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Any, Optional

import msgspec
import redis

from farm import history, judge_stats, sandbox_stats, schema, state
from farm.deadletters import STREAM_ID
from farm.errors import SchemaError
from farm.keys import Keys

OVERVIEW_MINUTES = 5  # the window of the overview's rates, percentiles and means
# Under this many rollouts ended in the window the failure rate is shown as its counts ("1 of 1"),
# not as a percentage: one requeued dead letter that fails again is not "100%" of an agent's traffic.
RATE_MIN_ROLLOUTS = 20
# The field of a sample entry holding the task's body (its `d`, same schema version as the rollout's),
# kept beside the rollout by the worker so the page can show the prompt the rollout answered.
SAMPLE_TASK_FIELD = b"t"


def workers(r: redis.Redis, keys: Keys) -> list[dict[str, Any]]:
    """Live workers from their heartbeats (they expire with a worker that is gone), by (agent, worker_id)."""
    return state.live_workers(r, keys).beats


def _queue(q: state.QueueState, rates: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The queue as the overview names it: queued is what no worker has taken yet (backlog, the tasks
    in the runs' queues, plus lag, those in the stream not yet read), in_flight what workers hold; per
    run (farm.state.RunState) its queued, in flight, share, cap and rates over the window."""
    return {
        "queued": q.waiting,
        "backlog": q.backlog,
        "in_flight": q.pending,
        "lag": q.unread,
        "delayed": q.delayed,
        "dead": q.dead,
        "counters": q.counters,
        "runs": [{**asdict(run), **history.run_rate(rates, run.run_id)} for run in q.runs],
    }


def failure_rate_text(failed: int, ended: int) -> str:
    """The failure rate as the pages show it: failed over the rollouts that ended (done + failed) in
    the window; '-' when none ended; the counts ('3 of 7') under RATE_MIN_ROLLOUTS, else a percentage
    with its denominator ('2.5% of 400')."""
    if not ended:
        return "-"
    if ended < RATE_MIN_ROLLOUTS:
        return f"{failed} of {ended}"
    return f"{100 * failed / ended:.1f}% of {ended}"


def overview(r: redis.Redis, keys: Keys, now: Optional[float] = None, window_min: int = OVERVIEW_MINUTES) -> dict:
    """One row per agent: queue state, rates and quality over the last window_min minutes, live workers;
    in each, one row per run with tasks queued or in flight (`runs`). Beside them the judges and, per
    agent whose workers run sandboxes, their sandboxes (farm/sandbox_stats.py; `{}` when none does)."""
    now = time.time() if now is None else now
    live = workers(r, keys)
    minutes, span = history.window(now, window_min)
    rows = {}
    for agent in state.agents(r, keys):
        bucket = history.merge(history.buckets(r, keys, agent, minutes))
        summary = history.summary(bucket, span)
        failed = int(bucket.get("failed", 0))
        rows[agent] = {
            **_queue(state.queue(r, keys, agent), history.run_rates(bucket, span)),
            **summary,
            "failed": failed,  # rollouts that failed in the window; `rollouts`: all that ended (done + failed)
            "failure_rate_text": failure_rate_text(failed, summary["rollouts"]),
            # a cancelled rollout is neither done nor failed (history.summary counts those two)
            "cancelled_per_min": bucket.get("cancelled", 0.0) / span,
            "live_workers": sum(1 for w in live if w.get("agent") == agent),
        }
    return {
        "at": now,
        "window_minutes": window_min,
        "window_minutes_elapsed": span,
        "rate_min_rollouts": RATE_MIN_ROLLOUTS,
        "agents": rows,
        "workers": live,
        "judges": judge_stats.summary(r, keys, now),  # per judge: calls/s, latency, failures, cache hits
        # per agent whose live workers run sandboxes: starting, running, started, failed, start p50/p99
        "sandboxes": sandbox_stats.by_agent(live),
    }


def rollout_summary(entry_id: str, ro: schema.Rollout) -> dict[str, Any]:
    """A sampled rollout's one-line facts (the rollout page's, and the lists' with more)."""
    return {
        "id": entry_id,
        "task_id": ro.task_id,
        "status": str(ro.status),
        "reward": ro.reward,
        "failure_kind": str(ro.error.kind) if ro.error else None,
        "failure": ro.error.message if ro.error else None,
        "policy_version": ro.policy_version,
        "total_s": round(ro.timings.total_s, 3),
        "finished_at": ro.finished_at,
    }


def rollout(r: redis.Redis, keys: Keys, agent: str, entry_id: str, *, max_entry_bytes: int) -> Optional[dict]:
    """One sampled rollout turn by turn: the prompt it answered, messages, tool calls and results, reward, tokens."""
    if not STREAM_ID.match(entry_id):
        return None
    found: Any = r.xrange(keys.samples(agent), entry_id, entry_id)
    if not found:
        return None
    fields = found[0][1]
    ro = schema.decode_rollout(fields, max_entry_bytes)
    turns = [_turn(item) for item in ro.output]
    trace = ro.trace
    tokens = {
        "prompt": len(trace.prompt()) if trace else ro.metrics.get("prompt_tokens"),
        "completion": sum(trace.mask()) if trace else ro.metrics.get("completion_tokens"),
    }
    return {
        **rollout_summary(entry_id, ro),
        "run_id": ro.run_id,
        "attempt": ro.attempt,
        "worker_id": ro.worker_id,
        "reward_components": ro.reward_components,
        "metrics": msgspec.to_builtins(ro.metrics),
        "prompt": prompt(fields, max_entry_bytes),
        "turns": turns,
        "tokens": tokens,
    }


def _content(content: Any) -> str:
    """A message's content as text: a string, or the text of its parts."""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def _turn(item: Any) -> dict[str, str]:
    kind = item.get("type", "message") if isinstance(item, dict) else "item"
    if kind == "message" and isinstance(item, dict):
        role = str(item.get("role", ""))
        return {
            "kind": "message",
            "role": "system" if role == "developer" else role,
            "text": _content(item.get("content")),
        }
    if kind == "function_call":
        return {"kind": "tool call", "role": str(item.get("name", "")), "text": str(item.get("arguments", ""))}
    if kind == "function_call_output":
        return {"kind": "tool result", "role": "", "text": str(item.get("output", ""))}
    return {"kind": str(kind), "role": "", "text": json.dumps(item, default=str)[:2000]}


def prompt_messages(row: Any) -> list[dict[str, str]]:
    """The prompt of a task's row (NeMo Gym `responses_create_params`): its instructions as a system
    message, then its input (a string: one user message; else each item, as the policy reads them)."""
    params = row.get("responses_create_params") if isinstance(row, dict) else None
    if not isinstance(params, dict):
        return []
    out = []
    if params.get("instructions"):
        out.append({"kind": "message", "role": "system", "text": _content(params["instructions"])})
    items = params.get("input")
    if isinstance(items, str):
        out.append({"kind": "message", "role": "user", "text": items})
    elif isinstance(items, list):
        out += [_turn(item) for item in items]
    return out


def prompt(fields: dict, max_entry_bytes: int) -> Optional[list[dict[str, str]]]:
    """The prompt a sampled rollout answered, from the task kept beside it (SAMPLE_TASK_FIELD); None
    when the worker kept none (an older worker); one line saying why when it cannot be read."""
    body = fields.get(SAMPLE_TASK_FIELD)
    if body is None:
        return None
    try:
        task = schema.decode_task({b"v": fields.get(b"v", b""), b"d": body}, max_entry_bytes)
    except SchemaError as exc:
        return [{"kind": "unreadable", "role": "", "text": str(exc)}]
    return prompt_messages(task.row)
