"""Per-minute history of every agent, kept in Redis for the dashboards.

A worker adds each settled rollout to its agent's bucket for the current minute,
`{ns}:hist:{agent}:{minute}` (a hash with a TTL): its Settler sums the increments of the
settles that acknowledged their task and writes each bucket's sum in the next pipelined round
trip it makes anyway (farm.streams.Settler), so the history costs no round trip and no Redis
work per task, and a task settled elsewhere is not counted twice. What a bucket holds:

  done, failed          rollouts that ended ok/truncated, and failed ones (dead letters included)
  cancelled             rollouts of tasks a client cancelled (neither done nor failed): settled by a
                        worker, or answered by the client while still queued (`drained`)
  run:<run>:<outcome>   the same three counts per run id (done, failed, cancelled), for each run's rates
  runfail:<run>:<kind>  a run's failures by ErrorKind
  runpv:<run>:<v>:<x>   per run and policy version v, of the rollouts with a reward: x = n (how many),
                        reward (their sum) and passed (reached `pass_threshold`): a run's learning curve
  fail:<kind>           failures by ErrorKind
  reward_sum, reward_n  the sum and count of rewards (rollouts that have one)
  passed                rollouts whose reward reached `pass_threshold`
  lt:<i>, lat_sum       rollout latency (pickup to finish) in the bins of LATENCY_EDGES_S
  tokens                completion tokens, for tokens per second
  depth                 tasks not yet settled (queued, waiting and in flight) when the minute's counts were
                        last written, and every 10 s by each live worker (AgentStream.record_depth)

Reading the last hours costs one HGETALL per agent and minute, whatever the number of tasks
(`buckets`: one pipelined round trip). A bucket holds one `run:` field per run and outcome that
settled in that minute (and one `runfail:` per run and failure kind, three `runpv:` per run and policy
version), so its size grows with the runs and versions an agent serves, not with their tasks. The
readers of the agent's figures (`summary`, `run_counts`) read none of the `runfail:`/`runpv:` fields;
`run_failures` and `run_versions` read them.
Percentiles are estimates from the bins, as Prometheus' histogram_quantile makes them: the bin
where the cumulative count crosses the quantile, interpolated within it (geometrically: the bins
grow by 2^(1/3), 26% each, from 1 ms to 2.3 h, so an estimate is within a bin's width of the
truth and usually much closer). Latencies past the last edge read as that edge.
"""

from __future__ import annotations

import bisect
import functools
import math
import time
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from farm.keys import Keys
from farm.schema import Rollout, Task

# Bin edges from 1 ms to 2.3 h, each 2^(1/3) of the one before. The fields are `lt:<i>` (buckets
# written with the coarser bins of earlier versions, `lat:<i>`, are not read as these).
LATENCY_EDGES_S = tuple(round(0.001 * 2 ** (k / 3), 6) for k in range(70))


@dataclass(frozen=True)
class Recording:
    """What a worker records beside each settle (the settings of the same names)."""

    history: bool = True
    ttl_s: int = 6 * 3600
    pass_threshold: float = 1.0
    sample_every: int = 10
    sample_keep: int = 200
    dead_maxlen: int = 100_000

    @classmethod
    def from_settings(cls, s: Any) -> "Recording":
        return cls(s.history, s.history_ttl_s, s.pass_threshold, s.sample_every, s.sample_keep, s.dead_maxlen)


LATENCY_FIELDS = tuple(f"lt:{i}" for i in range(len(LATENCY_EDGES_S) + 1))
RUN_OUTCOMES = ("done", "failed", "cancelled")  # the per-run fields: run:<run_id>:<outcome>
RUN_FAIL = "runfail:"  # runfail:<run_id>:<kind>
RUN_VERSION = "runpv:"  # runpv:<run_id>:<policy_version>:<stat>, stat one of RUN_VERSION_STATS
RUN_VERSION_STATS = ("n", "reward", "passed")
RUN_WINDOW_MINUTES = 2  # `farm status`'s rates per run: the last full minute and the current one so far


def minute(now: Optional[float] = None) -> int:
    """The epoch minute a bucket is keyed by."""
    return int((time.time() if now is None else now) // 60)


def latency_bin(seconds: float) -> int:
    """Index of the first edge >= seconds; len(LATENCY_EDGES_S) for anything longer."""
    return bisect.bisect_left(LATENCY_EDGES_S, seconds)


@functools.lru_cache(maxsize=4096)
def _run_fields(run: str, outcome: str) -> str:
    return f"run:{run}:{outcome}"


@functools.lru_cache(maxsize=4096)
def _version_fields(run: str, version: int) -> tuple[str, str, str]:
    prefix = f"{RUN_VERSION}{run}:{version}:"
    return prefix + "n", prefix + "reward", prefix + "passed"


def increments(rollout: Rollout, pass_threshold: float = 1.0) -> dict[str, float]:
    """What one settled rollout adds to its minute's bucket: counts as int, sums as float (finite).
    A run's field names are built once per run (and version), not once per rollout."""
    out: dict[str, float] = {}
    run = rollout.run_id
    if rollout.ok:
        outcome = "done"
    elif rollout.status == "cancelled" or rollout.status == "interrupted":
        outcome = str(rollout.status)
    else:
        outcome = "failed"
        kind = rollout.error.kind if rollout.error is not None else "unknown"
        out[f"fail:{kind}"] = 1
        if run:
            out[f"{RUN_FAIL}{run}:{kind}"] = 1
    out[outcome] = 1
    if run:
        out[_run_fields(run, outcome)] = 1
    if rollout.reward is not None and math.isfinite(rollout.reward):
        passed = rollout.reward >= pass_threshold
        out["reward_sum"] = float(rollout.reward)
        out["reward_n"] = 1
        if passed:
            out["passed"] = 1
        if run:
            n_key, reward_key, passed_key = _version_fields(run, rollout.policy_version)
            out[n_key] = 1
            out[reward_key] = float(rollout.reward)
            if passed:
                out[passed_key] = 1
    latency = rollout.timings.total_s if math.isfinite(rollout.timings.total_s) else 0.0
    out[LATENCY_FIELDS[latency_bin(latency)]] = 1
    out["lat_sum"] = float(latency)
    tokens = (rollout.metrics or {}).get("completion_tokens")
    if isinstance(tokens, (int, float)) and not isinstance(tokens, bool) and tokens > 0:
        out["tokens"] = int(tokens)
    return out


def drained(run_id: str, n: int) -> dict[str, float]:
    """What n tasks of a run cancelled while still queued add to the minute's bucket: they are
    answered `cancelled` by the client's DRAIN (farm.fairness), which no worker settles, so the
    client adds them (FarmClient.cancel_run), as what `increments` counts for such a rollout, n times."""
    task = Task.new(run_id=run_id, agent="-", row={}, reply_to="")
    return {k: v * n for k, v in increments(Rollout.cancelled(task, "cancelled while queued")).items()}


def decode_bucket(raw: dict) -> dict[str, float]:
    out = {}
    for k, v in raw.items():
        key = k.decode() if isinstance(k, bytes) else str(k)
        try:
            out[key] = float(v)
        except (TypeError, ValueError):
            continue
    return out


def buckets(r: Any, keys: Keys, agent: str, minutes: Iterable[int]) -> list[dict[str, float]]:
    """The agent's buckets of these epoch minutes (empty where none was written), in one round trip."""
    pipe = r.pipeline(transaction=False)
    for m in minutes:
        pipe.hgetall(keys.history(agent, m))
    return [decode_bucket(raw) for raw in pipe.execute()]


def merge(buckets: Iterable[dict[str, float]]) -> dict[str, float]:
    """Buckets added up (`depth`, a level rather than a count, is left out)."""
    total: dict[str, float] = {}
    for b in buckets:
        for k, v in b.items():
            if k != "depth":
                total[k] = total.get(k, 0.0) + v
    return total


def quantile(bucket: dict[str, float], q: float) -> Optional[float]:
    """The estimated q-quantile of the latencies a bucket counts (see the module docstring); None
    when it counts none."""
    counts = [bucket.get(field, 0.0) for field in LATENCY_FIELDS]
    n = sum(counts)
    if n <= 0:
        return None
    rank, seen = q * n, 0.0
    for i, c in enumerate(counts):
        if c and seen + c >= rank:
            if i == len(LATENCY_EDGES_S):
                return LATENCY_EDGES_S[-1]
            upper = LATENCY_EDGES_S[i]
            share = min(1.0, max(0.0, (rank - seen) / c))
            if i == 0:
                return upper * share
            lower = LATENCY_EDGES_S[i - 1]
            return round(lower * (upper / lower) ** share, 6)
        seen += c
    return LATENCY_EDGES_S[-1]


def summary(bucket: dict[str, float], minutes: float) -> dict[str, Any]:
    """The overview's figures from a bucket covering `minutes` minutes."""
    done, failed = bucket.get("done", 0.0), bucket.get("failed", 0.0)
    ended = done + failed
    reward_n = bucket.get("reward_n", 0.0)
    kinds = {k[5:]: int(v) for k, v in bucket.items() if k.startswith("fail:") and v}
    return {
        "done_per_min": done / minutes if minutes else 0.0,
        "failed_per_min": failed / minutes if minutes else 0.0,
        "failure_rate": failed / ended if ended else None,  # no rollout ended: no rate, not 0%
        "failures_by_kind": dict(sorted(kinds.items())),
        "mean_reward": bucket.get("reward_sum", 0.0) / reward_n if reward_n else None,
        "pass_rate": bucket.get("passed", 0.0) / reward_n if reward_n else None,
        "latency_p50_s": quantile(bucket, 0.5),
        "latency_p99_s": quantile(bucket, 0.99),
        "tokens_per_s": bucket.get("tokens", 0.0) / (minutes * 60) if minutes else 0.0,
        "rollouts": int(ended),
    }


def run_counts(bucket: dict[str, float]) -> dict[str, dict[str, float]]:
    """Per run id, the rollouts a bucket counts for it by outcome (its `run:<run_id>:<outcome>` fields)."""
    out: dict[str, dict[str, float]] = {}
    for k, v in bucket.items():
        if k.startswith("run:"):
            run, _, outcome = k[4:].rpartition(":")
            if run and outcome in RUN_OUTCOMES:
                counts = out.setdefault(run, dict.fromkeys(RUN_OUTCOMES, 0.0))
                counts[outcome] += v
    return out


def run_rates(bucket: dict[str, float], minutes: float) -> dict[str, dict[str, float]]:
    """Per run id, its rollouts per minute over a bucket covering `minutes` minutes, by outcome:
    {run: {"done_per_min": ..., "failed_per_min": ..., "cancelled_per_min": ...}}."""
    return {
        run: {f"{outcome}_per_min": n / minutes if minutes else 0.0 for outcome, n in counts.items()}
        for run, counts in run_counts(bucket).items()
    }


def run_rate(rates: dict[str, dict[str, float]], run_id: str) -> dict[str, float]:
    """One run's rates from run_rates: zeros for a run that settled nothing in the window."""
    return rates.get(run_id) or {f"{outcome}_per_min": 0.0 for outcome in RUN_OUTCOMES}


def run_failures(bucket: dict[str, float]) -> dict[str, dict[str, float]]:
    """Per run id, its failures a bucket counts by kind (its `runfail:<run_id>:<kind>` fields)."""
    out: dict[str, dict[str, float]] = {}
    for k, v in bucket.items():
        if k.startswith(RUN_FAIL):
            run, _, kind = k[len(RUN_FAIL) :].rpartition(":")
            if run and kind:
                kinds = out.setdefault(run, {})
                kinds[kind] = kinds.get(kind, 0.0) + v
    return out


def run_versions(bucket: dict[str, float]) -> dict[str, dict[int, dict[str, float]]]:
    """Per run id and policy version, of the rollouts with a reward a bucket counts: how many (`n`),
    their reward sum (`reward`) and how many passed (`passed`), from its `runpv:` fields."""
    out: dict[str, dict[int, dict[str, float]]] = {}
    for k, v in bucket.items():
        if not k.startswith(RUN_VERSION):
            continue
        parts = k[len(RUN_VERSION) :].rsplit(":", 2)  # from the right: the run id is the rest
        if len(parts) != 3 or not parts[0] or parts[2] not in RUN_VERSION_STATS or not _integer(parts[1]):
            continue
        run, version, stat = parts
        stats = out.setdefault(run, {}).setdefault(int(version), dict.fromkeys(RUN_VERSION_STATS, 0.0))
        stats[stat] += v
    return out


def _integer(s: str) -> bool:
    return s.lstrip("-").isdigit() and len(s) < 20


def window(now: float, minutes: int) -> tuple[list[int], float]:
    """The epoch minutes of the last `minutes` minutes up to now (the current one partly elapsed),
    and how many minutes that is, for rates that do not wait for a minute to end."""
    current = minute(now)
    span = (minutes - 1) + (now - current * 60) / 60
    return list(range(current - minutes + 1, current + 1)), max(span, 1 / 60)
