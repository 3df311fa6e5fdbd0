"""Prometheus metrics of the whole farm, computed from Redis at each scrape (prometheus-client).

One scrape target for every agent: the dashboard's `/metrics`. Names are prefixed `farm_` and
carry an `agent` label; deploy/monitoring's Grafana panels and alert rules use only these.
Gauges are the overview's figures over its 5-minute window; `*_total` counters come from the
agents' stats hashes, which only grow. The `farm_run_*` gauges also carry a `run` label, one
series per run with tasks queued or in flight (a run's series ends when it has neither).
The `farm_judge_*` series carry a `judge` label instead (farm/judge_stats.py: what the worker
processes' judge pools counted). The `farm_sandbox*` series exist for agents whose workers run
sandboxes (farm/sandbox_stats.py): sums over the live workers' heartbeats, so the `*_total`
counters count since each live worker started and fall when one goes (Prometheus' rate() and
increase() read a fall as a counter reset). `router` serves them; `FarmCollector` computes them.
"""

from __future__ import annotations

from typing import Any, Callable

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from farm.dashboard import data
from farm.dashboard.deps import Read

GAUGES = {
    "farm_queue_depth": (
        "Tasks no worker has taken yet: queued in the runs' queues (farm_backlog) plus the stream's lag.",
        "queued",
    ),
    "farm_backlog": ("Tasks queued in the agent's run queues, not yet in its stream (the list KEDA reads).", "backlog"),
    "farm_stream_lag": (
        "Tasks in the agent's stream not yet read by a worker (part of farm_queue_depth; farm status: lag).",
        "lag",
    ),
    "farm_in_flight": ("Tasks delivered to a worker and not yet settled (farm status: pending).", "in_flight"),
    "farm_delayed_retries": ("Failed attempts waiting out their backoff.", "delayed"),
    "farm_dead_letters": ("Dead letters kept in the agent's dead-letter stream.", "dead"),
    "farm_live_workers": ("Worker processes with a fresh heartbeat.", "live_workers"),
    "farm_rollouts_per_minute": ("Rollouts that ended ok or truncated, per minute.", "done_per_min"),
    "farm_failed_per_minute": ("Rollouts that failed, per minute.", "failed_per_min"),
    "farm_cancelled_per_minute": ("Rollouts of tasks a client cancelled, per minute.", "cancelled_per_min"),
    "farm_failure_rate": (
        "Failed rollouts over the rollouts that ended (done + failed) in the window; NaN when none ended. "
        "Every end counts: a requeued dead letter that fails again counts again (denominator: farm_rollouts_ended).",
        "failure_rate",
    ),
    "farm_rollouts_ended": (
        "Rollouts that ended (done or failed) in the window: farm_failure_rate's denominator.",
        "rollouts",
    ),
    "farm_reward_mean": ("Mean reward of the rollouts that have one.", "mean_reward"),
    "farm_pass_rate": ("Share of rewarded rollouts at or above pass_threshold.", "pass_rate"),
    "farm_tokens_per_second": ("Completion tokens per second.", "tokens_per_s"),
}
RUN_GAUGES = {
    "farm_run_queued": ("A run's tasks queued for the agent, waiting for a slot.", "queued"),
    "farm_run_in_flight": ("A run's tasks moved to the agent's stream and not yet settled.", "in_flight"),
    "farm_run_share": ("A run's share of the agent's slots while other runs have a backlog.", "share"),
    "farm_run_cap": ("A run's cap on tasks in flight on the agent (0: none).", "cap"),
    "farm_run_rollouts_per_minute": ("A run's rollouts that ended ok or truncated, per minute.", "done_per_min"),
}
COUNTERS = {
    "farm_rollouts": (
        "Rollouts settled, by status (done, failed, dead, cancelled: a client cancelled the task).",
        ("done", "failed", "dead", "cancelled"),
    ),
    "farm_retries": ("Attempts that were retried.", ("retried",)),
    "farm_dead_letters_dropped": ("Dead letters trimmed past dead_maxlen.", ("dead_dropped",)),
}


class FarmCollector(Collector):
    """Yields the farm's metrics from `read()` (an overview dict, see farm.dashboard.data)."""

    def __init__(self, read: Callable[[], dict[str, Any]]):
        self.read = read

    def collect(self):
        view = self.read()
        agents: dict[str, dict] = view["agents"]
        for name, (doc, key) in GAUGES.items():
            g = GaugeMetricFamily(name, doc, labels=["agent"])
            for agent, row in agents.items():
                value = row.get(key)
                g.add_metric([agent], float(value) if value is not None else float("nan"))
            yield g
        latency = GaugeMetricFamily(
            "farm_rollout_latency_seconds",
            "Rollout latency from pickup to settle, by quantile.",
            labels=["agent", "quantile"],
        )
        kinds = GaugeMetricFamily(
            "farm_failures_per_minute", "Failed rollouts per minute, by failure kind.", labels=["agent", "kind"]
        )
        for agent, row in agents.items():
            for q, key in (("0.5", "latency_p50_s"), ("0.99", "latency_p99_s")):
                value = row.get(key)
                latency.add_metric([agent, q], float(value) if value is not None else float("nan"))
            minutes = view["window_minutes_elapsed"]
            for kind, n in row.get("failures_by_kind", {}).items():
                kinds.add_metric([agent, kind], n / minutes)
        yield latency
        yield kinds
        for name, (doc, key) in RUN_GAUGES.items():
            g = GaugeMetricFamily(name, doc, labels=["agent", "run"])
            for agent, row in agents.items():
                for run in row.get("runs", []):
                    g.add_metric([agent, run["run_id"]], float(run[key]))
            yield g
        for name, (doc, fields) in COUNTERS.items():
            c = CounterMetricFamily(name, doc, labels=["agent", "status"] if len(fields) > 1 else ["agent"])
            for agent, row in agents.items():
                for f in fields:
                    value = float(row.get("counters", {}).get(f, 0))
                    c.add_metric([agent, f] if len(fields) > 1 else [agent], value)
            yield c
        yield from judge_metrics(view.get("judges", {}))
        yield from sandbox_metrics(view.get("sandboxes", {}))


SANDBOX_COUNTERS = {
    "farm_sandbox_starts": ("Sandboxes started, summed over the live workers since each started.", "started"),
    "farm_sandbox_start_failures": (
        "Sandbox starts that failed (each try), summed over the live workers since each started.",
        "start_failed",
    ),
    "farm_sandbox_infrastructure_failures": (
        "Rollouts failed because no sandbox started, summed over the live workers since each started.",
        "infrastructure",
    ),
}


def sandbox_metrics(sandboxes: dict[str, dict[str, Any]]):
    """Per agent whose workers run sandboxes: those starting and running, the counters, start latency."""
    now = GaugeMetricFamily("farm_sandboxes", "Sandboxes starting or running now.", labels=["agent", "state"])
    for agent, row in sandboxes.items():
        for state in ("starting", "running"):
            now.add_metric([agent, state], float(row[state]))
    yield now
    for name, (doc, key) in SANDBOX_COUNTERS.items():
        c = CounterMetricFamily(name, doc, labels=["agent"])
        for agent, row in sandboxes.items():
            c.add_metric([agent], float(row[key]))
        yield c
    start = GaugeMetricFamily(
        "farm_sandbox_start_seconds",
        "Sandbox start latency: quantile 0.5 the median of the workers' p50s, 0.99 the worst worker's p99.",
        labels=["agent", "quantile"],
    )
    for agent, row in sandboxes.items():
        for q, key in (("0.5", "start_p50_s"), ("0.99", "start_p99_s")):
            value = row[key]
            start.add_metric([agent, q], float(value) if value is not None else float("nan"))
    yield start


JUDGE_COUNTERS = {
    "farm_judge_calls": ("Judge calls verifiers made (cache hits included).", "calls"),
    "farm_judge_answers": ("Judge requests answered.", "ok"),
    "farm_judge_failures": ("Judge calls that failed (the rollout failed as verifier).", "failed"),
    "farm_judge_deadline_failures": ("Judge calls that failed past the judge's deadline_s.", "deadline"),
    "farm_judge_cache_hits": ("Judge calls answered from the cache of identical requests.", "cache_hits"),
}


def judge_metrics(judges: dict[str, dict[str, Any]]):
    """Per judge (farm/judge_stats.py): counters, the latency histogram, calls/s and the peak in flight."""
    from prometheus_client.core import HistogramMetricFamily

    from farm.judge_stats import BUCKETS_S

    for name, (doc, key) in JUDGE_COUNTERS.items():
        c = CounterMetricFamily(name, doc, labels=["judge"])
        for judge, row in judges.items():
            c.add_metric([judge], row[key])
        yield c
    h = HistogramMetricFamily("farm_judge_latency_seconds", "Latency of answered judge requests.", labels=["judge"])
    for judge, row in judges.items():
        cumulative, buckets = 0.0, []
        for edge, n in zip(BUCKETS_S, row["buckets"]):
            cumulative += n
            buckets.append(("+Inf" if edge == float("inf") else f"{edge:g}", cumulative))
        h.add_metric([judge], buckets, sum_value=row["latency_s"])
    yield h
    rate = GaugeMetricFamily("farm_judge_calls_per_second", "Judge calls per second, last minutes.", labels=["judge"])
    peak = GaugeMetricFamily(
        "farm_judge_max_in_flight", "The most requests one worker process had at the judge at once.", labels=["judge"]
    )
    for judge, row in judges.items():
        rate.add_metric([judge], row["calls_per_s"])
        peak.add_metric([judge], row["max_in_flight"])
    yield rate
    yield peak


def registry(read: Callable[[], dict[str, Any]]) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(FarmCollector(read))
    return reg


router = APIRouter()


@router.get("/metrics")
def metrics(read: Read) -> Response:
    return Response(generate_latest(registry(lambda: read(data.overview))), media_type=CONTENT_TYPE_LATEST)
