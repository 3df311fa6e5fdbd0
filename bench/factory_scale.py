"""TRL `environment_factory` classes at scale: does a TRL class keep up with a native environment?

Side by side, in the same run, the same measurement as bench/concurrency.py's farm side, once per
environment: one `farm worker --agent A --concurrency C` process (a `LocalStack` pool of one, as
`farm up` starts it), N rollouts submitted through farm.client.FarmClient, against the policy stub
(workers/policy/stub, a process of its own) answering every request after a fixed L seconds with
scripted token ids, one stub per side:

  single_tool_call  the native environment (envs/single_tool_call.py): the stub calls get_weather
                    for Paris, then answers; every row asks for Paris (reward 1).
  trl               the example TRL class (examples/trl_envs: `Calculator` and `correct_answer`,
                    its farm.yaml as FARM_CONFIG): reset's text in the prompt, the stub calls
                    `add(3, 4)` on the rollout's pooled instance, then answers "The sum is 7.";
                    every row is a = 3, b = 4 (reward 2: correct_answer and get_reward).

Each rollout is two model turns, so Little's law bounds the rate at min(C, N) / (turns x L). For
each side it prints rollouts completed, wall time (submit to last result), rollouts/s, the bound,
the ratio, rollout latency p50 / p99, the worker's CPU seconds in the round and peak RSS (its
VmHWM, start-up included), mean reward, and failures by kind. `--profile S` records the worker
with py-spy for S seconds from the submit on (bench.procstat.Profiles; its CPU then reads high).

    .venv/bin/python -m bench.factory_scale [--rollouts 1024] [--concurrency 1024] [--latency 2]

The stub, the worker and Redis share this machine's CPUs; each row prints the load average. Each
side uses its own namespace on --redis-url and deletes it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from bench.common import ROOT, WorkerPool, answers, delete_namespace
from bench.concurrency import pct
from bench.procstat import Profiles, cpu_s, peak_rss_mb
from workers.policy.stub import WEATHER_ANSWER, WEATHER_CALL, Script, StubProcess, weather_rows
from workers.supervise.stack import policy_env

EXAMPLE = ROOT / "examples" / "trl_envs"
ADD_CALL = '<tool_call>\n{"name": "add", "arguments": {"x": 3, "y": 4}}\n</tool_call>'
ADD_ANSWER = "The sum is 7."
QUESTION = [{"role": "user", "content": "What is the sum of the two numbers below? Answer with the number."}]


@dataclass(frozen=True)
class Side:
    """One environment under test: its agent, the stub's two replies, its rows, the worker's extra env."""

    name: str
    agent: str
    replies: tuple[str, str]
    rows: Callable[[int], list[dict]]
    env: dict[str, str] = field(default_factory=dict)


def calculator_rows(n: int) -> list[dict]:
    """`n` rows in TRL's shape for the example's Calculator, all for 3 + 4 (the stub's call and answer)."""
    return [{"prompt": QUESTION, "a": 3, "b": 4} for _ in range(n)]


SIDES = {
    "single_tool_call": Side("single_tool_call", "single_tool_call", (WEATHER_CALL, WEATHER_ANSWER), weather_rows),
    "trl": Side(
        "trl", "arithmetic", (ADD_CALL, ADD_ANSWER), calculator_rows, {"FARM_CONFIG": str(EXAMPLE / "farm.yaml")}
    ),
}


@dataclass
class Round:
    """What one side's round measured."""

    side: str
    n: int
    concurrency: int
    latency: float
    wall_s: float
    latencies: list[float]
    turns: list[int]
    rewards: list[float]
    failures: dict[str, int]
    cpu_s: float
    rss_mb: float
    load: float
    profile: Optional[str] = None


async def run_side(side: Side, stub: StubProcess, model_dir: Path, tmp: Path, opts: argparse.Namespace) -> Round:
    """One fresh worker of `side`'s agent through opts.rollouts rollouts, C in flight."""
    from farm.client import FarmClient
    from farm.settings import load_settings

    namespace = f"bench-{uuid.uuid4().hex[:12]}"
    url, n, c = opts.redis_url, opts.rollouts, opts.concurrency
    settings = load_settings(env={}, overrides={"redis_url": url, "namespace": namespace})
    env = {**policy_env(stub.url, "stub", model_dir), **side.env}
    try:
        with WorkerPool(url, namespace, side.agent, 1, c, tmp, side.name, **env) as pool:
            await pool.ready()
            pid = pool.pids[0]
            client = FarmClient(settings)
            try:
                tasks = [client.task(run_id="bench", agent=side.agent, row=r) for r in side.rows(n)]
                profiles = Profiles([pid], opts.profile, opts.profile_dir, side.name)
                cpu0, start = cpu_s(pid), time.perf_counter()
                with profiles:
                    _, got = await asyncio.gather(client.submit(tasks), client.collect(tasks, timeout_s=600))
                    wall = time.perf_counter() - start
                cpu, rss = cpu_s(pid) - cpu0, peak_rss_mb(pid)
                pool.check()
            finally:
                await client.aclose()
    finally:
        delete_namespace(url, namespace)
    ok = [r for r in got.values() if r.ok]
    return Round(
        side=side.name,
        n=n,
        concurrency=c,
        latency=opts.latency,
        wall_s=wall,
        latencies=[r.timings.total_s for r in ok],
        turns=[int(r.metrics.get("turns", 0)) for r in ok],
        rewards=[r.reward for r in ok if r.reward is not None],
        failures=dict(Counter(str(r.error.kind) for r in got.values() if not r.ok)),
        cpu_s=cpu,
        rss_mb=rss,
        load=os.getloadavg()[0],
        profile=str(profiles.paths[0]) if profiles.paths else None,
    )


def summarize(r: Round) -> dict:
    """The figures of one round; the bound is Little's law with the turns the rollouts took."""
    done = len(r.latencies)
    turns = sum(r.turns) / len(r.turns) if r.turns else 2.0
    rate = done / r.wall_s
    bound = min(r.concurrency, r.n) / (turns * r.latency)
    return {
        "side": r.side,
        "n": r.n,
        "C": r.concurrency,
        "L": r.latency,
        "completed": done,
        "wall_s": r.wall_s,
        "rollouts_per_s": rate,
        "turns": turns,
        "bound_per_s": bound,
        "ratio": rate / bound,
        "p50_s": pct(r.latencies, 0.5),
        "p99_s": pct(r.latencies, 0.99),
        "cpu_s": r.cpu_s,
        "cpu_ms_per_rollout": 1000 * r.cpu_s / max(1, r.n),
        "rss_mb": r.rss_mb,
        "mean_reward": sum(r.rewards) / len(r.rewards) if r.rewards else None,
        "failures": r.failures,
        "load": r.load,
        "profile": r.profile,
    }


HEADER = (
    f"{'side':<17}{'done':>6} {'wall s':>7} {'rollout/s':>9} {'bound':>7} {'ratio':>6} {'p50 s':>6} {'p99 s':>6} "
    f"{'cpu s':>6} {'ms/r':>5} {'rss MB':>7} {'reward':>6} {'load':>5}  failures"
)


def print_row(s: dict) -> None:
    fails = ", ".join(f"{k}: {v}" for k, v in sorted(s["failures"].items())) or "0"
    reward = "" if s["mean_reward"] is None else f"{s['mean_reward']:.2f}"
    print(
        f"{s['side']:<17}{s['completed']:>6} {s['wall_s']:>7.2f} {s['rollouts_per_s']:>9.1f} {s['bound_per_s']:>7.1f} "
        f"{s['ratio']:>6.2f} {s['p50_s']:>6.2f} {s['p99_s']:>6.2f} {s['cpu_s']:>6.2f} {s['cpu_ms_per_rollout']:>5.2f} "
        f"{s['rss_mb']:>7.0f} {reward:>6} {s['load']:>5.2f}  {fails}",
        flush=True,
    )


def run_factory_scale(opts: argparse.Namespace) -> list[dict]:
    """Each side in turn, its own stub (its two replies, latency L) and a fresh worker; the rows printed."""
    from workers.policy.chat import ChatTokenizer
    from workers.policy.serving import default_cache, prepare_model

    model_dir = prepare_model(default_cache())
    tok = ChatTokenizer(str(model_dir))
    out = []
    print(
        f"one `farm worker --concurrency {opts.concurrency}` per side, {opts.rollouts} rollouts, policy stub with "
        f"fixed latency {opts.latency:g} s; {os.cpu_count()} CPUs; load at start {open('/proc/loadavg').read().strip()}"
    )
    print(HEADER)
    print("-" * len(HEADER))
    with tempfile.TemporaryDirectory(prefix="farm-bench-factory-") as tmp_name:
        for name in opts.sides.split(","):
            side = SIDES[name]
            script = Script(token_replies=[tok.encode(t) + [tok.eos_id] for t in side.replies], model="stub")
            with StubProcess(script, latency_s=opts.latency, workdir=Path(tmp_name)) as stub:
                row = summarize(asyncio.run(run_side(side, stub, model_dir, Path(tmp_name), opts)))
            print_row(row)
            out.append(row)
    return out


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--rollouts", type=int, default=1024, help="rollouts per side")
    p.add_argument("--concurrency", type=int, default=1024, help="the worker's --concurrency (rollouts in flight)")
    p.add_argument("--latency", type=float, default=2.0, help="the stub's fixed latency L per model call, seconds")
    p.add_argument("--sides", default="single_tool_call,trl", help=f"comma-separated, of {', '.join(SIDES)}")
    p.add_argument("--profile", type=float, default=0.0, help="py-spy the worker for this many seconds")
    p.add_argument("--profile-dir", type=Path, default=Path("/tmp/farm-bench-profiles"))
    args = p.parse_args(argv)
    unknown = set(args.sides.split(",")) - set(SIDES)
    if unknown:
        p.error(f"unknown side(s) {sorted(unknown)}; known: {', '.join(SIDES)}")
    if args.profile and not Profiles([], 0, Path(), "").exe:
        p.error("--profile records with py-spy, which is not installed here (pip install py-spy)")
    if not answers(args.redis_url):
        raise SystemExit(f"no Redis answers at {args.redis_url}")
    started = time.monotonic()
    results = run_factory_scale(args)
    print(
        "bound: min(C, N) / (turns x L), turns as the rollouts took them; ratio: rollouts/s over it; cpu s: the "
        "worker's CPU in the round (ms/r: per rollout); rss MB: its peak (VmHWM); load: 1-min load average after "
        f"the row; load at end {open('/proc/loadavg').read().strip()}; runtime {time.monotonic() - started:.0f}s"
    )
    print(json.dumps({"results": results, "command": " ".join(sys.argv)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
