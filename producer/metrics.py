"""Per-agent aggregates of a collection, computed from the files it wrote.

Computing from the output and failures files (not from what one process saw) makes the
figures right after any number of crashes and `--resume` runs, and lets the aggregate be
recomputed for any finished file. Both files are streamed; a row's samples are held only
until all of its `num_repeats` have been seen.

Definitions (per agent, over the rows' repeats):
- mean reward: over answered rollouts (ok, truncated); a failed rollout has no reward, it is
  counted under `failures` by kind, never as a 0.
- cancelled: rollouts of tasks a client cancelled or interrupted. Not answers and not failures (the model and
  the farm did nothing wrong): counted apart, left out of the reward, the latency and the row
  rates; a row whose samples were all cancelled is not rated at all.
- pass@k: the share of rows where at least one of the k samples passes (reward >=
  `pass_threshold`); a failed sample does not pass.
- majority@k: the share of rows whose most frequent answer passes. The answer is the
  rollout's `extracted_answer` / `answer` metric when the environment reports one, else
  the final assistant text; ties go to the answer seen first (lowest repeat index).
- latency: the rollout's own time on the worker (timings.total_s), mean / p50 / p99.
- tokens/s: completion tokens over the agent's active span (first submission to last
  finish), i.e. the throughput this collection saw.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

from producer.output import read_records

ANSWERED = ("ok", "truncated")  # the statuses that carry an answer (and maybe a reward)
STOPPED = ("cancelled", "interrupted")  # a client stopped it: counted as cancelled, never a failure


def answer_of(rollout: dict) -> str:
    metrics = rollout.get("metrics") or {}
    for key in ("extracted_answer", "answer"):
        if metrics.get(key) is not None:
            return str(metrics[key]).strip()
    for item in reversed(rollout.get("output") or []):
        if item.get("type") == "message" and item.get("role", "assistant") == "assistant":
            content = item.get("content")
            if isinstance(content, list):
                return "".join(c.get("text", "") for c in content if isinstance(c, dict)).strip()
            return str(content or "").strip()
    return ""


def _percentile(sorted_values: array, q: float) -> Optional[float]:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


@dataclass
class AgentStats:
    rows: int = 0
    rollouts: int = 0
    ok: int = 0
    truncated: int = 0
    cancelled: int = 0
    failures: Counter = field(default_factory=Counter)
    reward_sum: float = 0.0
    rewarded: int = 0
    passed_rows: int = 0
    majority_rows: int = 0
    repeats: Counter = field(default_factory=Counter)
    latencies: array = field(default_factory=lambda: array("d"))
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_submit: float = math.inf
    last_finish: float = 0.0

    def add(self, rec: dict) -> None:
        r = rec["rollout"]
        self.rollouts += 1
        status = r["status"]
        if status in ANSWERED:
            self.ok += status == "ok"
            self.truncated += status == "truncated"
            if r.get("reward") is not None:
                self.reward_sum += float(r["reward"])
                self.rewarded += 1
        elif status in STOPPED:
            self.cancelled += 1
        else:
            self.failures[(r.get("error") or {}).get("kind", "unknown")] += 1
        timings = r.get("timings") or {}
        if status in ANSWERED and timings.get("total_s"):
            self.latencies.append(float(timings["total_s"]))
        metrics = r.get("metrics") or {}
        trace = r.get("trace") or {}
        self.prompt_tokens += int(metrics.get("prompt_tokens", len(trace.get("prompt_ids", ()))))
        self.completion_tokens += int(metrics.get("completion_tokens", sum(trace.get("env_mask", ()))))
        self.first_submit = min(self.first_submit, float(rec.get("submitted_at") or math.inf))
        self.last_finish = max(self.last_finish, float(r.get("finished_at") or 0.0))

    def add_group(self, samples: list[dict], k: int, threshold: float) -> None:
        """One row's samples (any order, failed and cancelled ones included)."""
        self.repeats[k] += 1
        if all(s["rollout"]["status"] in STOPPED for s in samples):
            return  # no sample was let run to an answer or a failure: nothing to rate
        self.rows += 1
        samples = sorted(samples, key=lambda rec: rec["repeat_index"])
        scored = [
            (answer_of(s["rollout"]), s["rollout"].get("reward"))
            for s in samples
            if s["rollout"]["status"] in ANSWERED and s["rollout"].get("reward") is not None
        ]
        if any(reward >= threshold for _, reward in scored):
            self.passed_rows += 1
        if scored:
            counts = Counter(answer for answer, _ in scored)
            top = max(counts.values())
            majority = next(answer for answer, _ in scored if counts[answer] == top)
            reward = next(reward for answer, reward in scored if answer == majority)
            self.majority_rows += reward >= threshold

    def summary(self) -> dict[str, Any]:
        lat = array("d", sorted(self.latencies))
        span = self.last_finish - self.first_submit if self.first_submit < math.inf else 0.0
        k = self.repeats.most_common(1)[0][0] if self.repeats else 0
        return {
            "rows": self.rows,
            "k": k,
            "count": self.rollouts,
            "ok": self.ok,
            "truncated": self.truncated,
            "failed": sum(self.failures.values()),
            "failures": dict(self.failures),
            "cancelled": self.cancelled,
            "mean_reward": self.reward_sum / self.rewarded if self.rewarded else None,
            f"pass@{k}": self.passed_rows / self.rows if self.rows else None,
            f"majority@{k}": self.majority_rows / self.rows if self.rows else None,
            "pass_at_k": self.passed_rows / self.rows if self.rows else None,
            "majority_at_k": self.majority_rows / self.rows if self.rows else None,
            "latency_mean_s": sum(lat) / len(lat) if lat else None,
            "latency_p50_s": _percentile(lat, 0.5),
            "latency_p99_s": _percentile(lat, 0.99),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "tokens_per_s": self.completion_tokens / span if span > 0 else None,
        }


def aggregate(records: Iterable[dict], threshold: float = 1.0) -> dict[str, dict[str, Any]]:
    """Per-agent summaries of output records (ok, failed and cancelled lines, any order)."""
    stats: dict[str, AgentStats] = defaultdict(AgentStats)
    open_rows: dict[tuple[str, int], list[dict]] = {}
    for rec in records:
        agent = rec["agent"]
        stats[agent].add(rec)
        key = (agent, rec["row_index"])
        group = open_rows.setdefault(key, [])
        group.append(rec)
        if len(group) >= rec["num_repeats"]:
            stats[agent].add_group(open_rows.pop(key), rec["num_repeats"], threshold)
    for (agent, _), group in open_rows.items():  # rows cut short (an interrupted run)
        stats[agent].add_group(group, group[0]["num_repeats"], threshold)
    return {agent: s.summary() for agent, s in sorted(stats.items())}


def aggregate_files(*paths: Path, threshold: float = 1.0) -> dict[str, dict[str, Any]]:
    def records() -> Iterable[dict]:
        for path in paths:
            yield from read_records(path)

    return aggregate(records(), threshold)


def render(metrics: dict[str, dict[str, Any]], title: str = "farm collect") -> None:
    """The per-agent table, in 80 columns: the essentials here, every figure in the metrics file.
    Cancelled rollouts get a line under it, not a column: they are rare, a column of zeros would
    not fit 80 columns, and under `failed` a client's cancel would read as the model failing."""
    from rich.console import Console

    from farm.status import agent_table

    console = Console(width=min(80, Console().width))
    # 80 columns: the row count is in the metrics file (and rollouts / k); truncations are shown,
    # since a truncated rollout carries a reward that the model did not finish earning.
    columns = ("rollouts", "trunc", "failed", "reward", "pass@k", "maj@k", "p50 s", "tok/s")
    t = agent_table(title, columns, 16)
    f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
    for agent, m in metrics.items():
        t.add_row(
            agent,
            f"{m['count']:,}",
            f"{m['truncated']:,}",
            f"{sum(m['failures'].values()):,}",
            f(m["mean_reward"], ".3f"),
            f"{f(m['pass_at_k'], '.2f')}@{m['k']}",
            f(m["majority_at_k"], ".2f"),
            f(m["latency_p50_s"], ".2f"),
            f(m["tokens_per_s"], ",.0f"),
        )
    console.print(t)
    for agent, m in metrics.items():
        if m["failures"]:
            console.print(
                f"{agent} failures: " + ", ".join(f"{k} {v}" for k, v in sorted(m["failures"].items())), highlight=False
            )
        if m.get("cancelled"):
            console.print(f"{agent} cancelled: {m['cancelled']:,} (not failed, not scored)", highlight=False)
