"""The judge pool under load: its concurrency limit holds, throughput follows it, an outage fails fast.

Two policy stubs in processes of their own (workers/policy/stub): one is the policy, one the
judge, the judge with heavy-tailed latency (lognormal, `--sigma`). N rollouts run at once in
one process, each as the worker runs it: one policy turn through the openai backend, then the
`llm_judge` verifier through workers/loops/env_calls.verify, whose `ctx.judge` goes to the
process's judge pool (`judges: {grader: {max_concurrency: C, deadline_s: D}}`). Every answer is
distinct, so the cache answers nothing and every rollout costs one judge request.

  limit     the judge stub's own count of requests it held at once (/stats max_pending) must
            be exactly C: never more (the limit) and C (the limit is used);
  rate      rollouts finish at the rate the limit allows: Little's law gives C / W, W the mean
            judge latency the pool measured; reported: the overall rate (policy turns and the
            tail included) and the steady rate (between the 10th and 90th percentile verdict,
            all slots busy), and the steady rate over C / W;
  outage    the judge stub is killed and N more rollouts run with deadline D: every one fails
            as `verifier` (JudgeFailure) within D plus a margin, while each of their policy
            turns still succeeds (the policy path does not wait on the judge).

    python bench/judges.py [--rollouts 1024] [--limit 32] [--latency 0.2] [--sigma 1.0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from envs.llm_judge import LLMJudge  # noqa: E402
from envs.sdk import JudgeConfig, Transcript  # noqa: E402
from farm.errors import RolloutFailure  # noqa: E402
from workers.loops.env_calls import verify  # noqa: E402
from workers.policy import judges  # noqa: E402
from workers.policy.config import PolicyConfig  # noqa: E402
from workers.policy.openai_pool import OpenAIPolicy  # noqa: E402
from workers.policy.rotation import Session  # noqa: E402
from workers.policy.stub.model import Script  # noqa: E402
from workers.policy.stub.process import StubProcess  # noqa: E402

VERDICT = "Same capital. [[A=B]]"


@dataclass
class Outcome:
    ok: int = 0
    verifier_failed: int = 0
    other_failed: int = 0
    policy_ok: int = 0
    failures_s: list[float] = field(default_factory=list)  # each verifier failure's time, from verify's start
    done_at: list[float] = field(default_factory=list)  # when each verdict came (perf_counter)

    def steady_rate(self) -> float:
        """Verdicts per second between the 10th and the 90th percentile verdict: the rate while the
        judge's slots are all busy, without the start (policy turns first) and the tail (fewer
        than the limit left)."""
        t = sorted(self.done_at)
        lo, hi = int(0.1 * len(t)), int(0.9 * len(t))
        return (hi - lo) / (t[hi] - t[lo]) if hi > lo and t[hi] > t[lo] else 0.0


async def rollouts(n: int, policy: OpenAIPolicy, env: LLMJudge, tag: str, verify_timeout_s: float) -> Outcome:
    """n rollouts at once: a policy turn, then the verifier (which asks the judge)."""
    out = Outcome()

    async def one(i: int) -> None:
        convo = policy.conversation([{"role": "user", "content": f"Capital of France? ({tag} {i})"}], [])
        await policy.turn(convo, {"max_tokens": 16}, Session(key=f"{tag}-{i}"), 0)
        out.policy_ok += 1
        row = env.check_row(
            {
                "responses_create_params": {"input": f"What is the capital of France? ({tag} {i})"},
                "expected_answer": "Paris",
            }
        )
        start = time.perf_counter()
        try:
            await verify(env, row, None, Transcript(f"Paris ({tag} {i})", [], []), verify_timeout_s)
            out.ok += 1
            out.done_at.append(time.perf_counter())
        except RolloutFailure as exc:
            if exc.kind.value == "verifier":
                out.verifier_failed += 1
                out.failures_s.append(time.perf_counter() - start)
            else:
                out.other_failed += 1

    await asyncio.gather(*(one(i) for i in range(n)))
    return out


async def measure(
    n: int, limit: int, latency_s: float, sigma: float, deadline_s: float, outage_deadline_s: float, workdir: Path
) -> dict[str, Any]:
    policy_stub = StubProcess(Script(chat_replies=[{"content": "Paris"}]), latency_s=0.01, workdir=workdir).start()
    judge_stub = StubProcess(
        Script(chat_replies=[{"content": VERDICT}]),
        latency_s=latency_s,
        latency_dist="lognormal",
        sigma=sigma,
        seed=0,
        workdir=workdir,
    ).start()
    policy = OpenAIPolicy(PolicyConfig(urls=[policy_stub.url], model="stub", max_connections=n), "chat")
    env = LLMJudge(judge="grader")
    try:
        config = JudgeConfig(urls=[judge_stub.url], model="stub", max_concurrency=limit, deadline_s=deadline_s)
        pool = judges.JudgePool({"grader": config})  # what AgentContext makes from the settings
        t0 = time.perf_counter()
        with judges.serving(pool):
            steady = await rollouts(n, policy, env, "steady", deadline_s * 4)
        elapsed = time.perf_counter() - t0
        stats = pool.judges["grader"].stats
        mean_latency = pool_latency(pool)
        stub_stats = judge_stub.stats()
        judge_stub.stop()  # the outage: nothing listens on the judge's port any more
        await pool.aclose()
        outage_pool = judges.JudgePool({"grader": msgspec.structs.replace(config, deadline_s=outage_deadline_s)})
        t1 = time.perf_counter()
        with judges.serving(outage_pool):
            outage = await rollouts(n, policy, env, "outage", outage_deadline_s * 4)
        outage_s = time.perf_counter() - t1
        await outage_pool.aclose()
    finally:
        await policy.aclose()
        policy_stub.stop()
        judge_stub.stop()
    return {
        "rollouts": n,
        "limit": limit,
        "judge_latency": {"dist": "lognormal", "median_s": latency_s, "sigma": sigma},
        "steady": {
            "ok": steady.ok,
            "failed": steady.verifier_failed + steady.other_failed,
            "seconds": round(elapsed, 2),
            "rollouts_per_s": round(n / elapsed, 1),
            "steady_rollouts_per_s": round(steady.steady_rate(), 1),
            "judge_max_in_flight_stub": stub_stats.get("max_pending"),
            "judge_max_in_flight_pool": stats.max_in_flight,
            "judge_requests": stub_stats.get("POST /v1/chat/completions"),
            "judge_mean_latency_s": round(mean_latency, 3),
            "littles_law_rate_per_s": round(limit / mean_latency, 1),
            "steady_rate_over_littles_law": round(steady.steady_rate() / (limit / mean_latency), 3),
        },
        "outage": {
            "deadline_s": outage_deadline_s,
            "verifier_failed": outage.verifier_failed,
            "ok": outage.ok,
            "other_failed": outage.other_failed,
            "policy_turns_ok": outage.policy_ok,
            "median_failure_s": round(sorted(outage.failures_s)[len(outage.failures_s) // 2], 2)
            if outage.failures_s
            else None,
            "slowest_failure_s": round(max(outage.failures_s, default=0.0), 2),
            "seconds": round(outage_s, 2),
        },
    }


def pool_latency(pool: judges.JudgePool) -> float:
    """The mean latency of the answered judge requests, as the pool measured it."""
    judge = pool.judges["grader"]
    return judge.stats.latency_s / max(1, judge.stats.ok)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rollouts", type=int, default=1024)
    p.add_argument("--limit", type=int, default=32, help="the judge's max_concurrency")
    p.add_argument("--latency", type=float, default=0.2, help="the judge's median latency (lognormal)")
    p.add_argument("--sigma", type=float, default=1.0, help="the log's standard deviation (heavier tail: larger)")
    p.add_argument("--deadline", type=float, default=600.0, help="deadline_s while the judge is up")
    p.add_argument("--outage-deadline", type=float, default=2.0, help="deadline_s once the judge is killed")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        result = asyncio.run(
            measure(args.rollouts, args.limit, args.latency, args.sigma, args.deadline, args.outage_deadline, Path(tmp))
        )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
