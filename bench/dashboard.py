"""What watching the farm costs: the dashboard's Redis work per refresh, and the workers' history.

1. refresh cost   Redis commands (INFO commandstats, before and after) and milliseconds of one
                  overview refresh (what the page and /metrics compute), after 2,000 and after
                  20,000 settled tasks, with 1 and with 4 agents. Target: the same command count
                  whatever the number of tasks (it may grow with agents and workers only).
2. history cost   noop rollouts/s of one worker process with the per-minute history buckets on
                  against off (FARM_HISTORY=false), the sample stream off in both
                  (FARM_SAMPLE_EVERY=0), alternating rounds; the median of --rounds each.
                  Target: on >= 97% of off. The defaults (buckets and a sample of 1 rollout in
                  10) are measured too, for information.

Run on the target machine, with nothing else busy:

    python bench/dashboard.py [--redis-url URL] [--tasks 20000] [--rounds 3]

Needs the `dashboard` extra. Each measurement uses its own namespace (`bench-<uuid>`) and deletes
its keys; the figures print as a table, then as one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import WorkerPool, answers, delete_namespace  # noqa: E402
from transport import measure_throughput  # noqa: E402

from farm.client import FarmClient  # noqa: E402
from farm.dashboard import data  # noqa: E402
from farm.embedded import EmbeddedRedis  # noqa: E402
from farm.settings import load_settings  # noqa: E402

TARGET_RATIO = 0.97


def commands(r: redis.Redis) -> int:
    return sum(int(v["calls"]) for v in r.info("commandstats").values())


def refresh_cost(r: redis.Redis, settings) -> tuple[int, float]:
    """(commands, ms) of one overview, measured around a second call (the first warms the pool)."""
    data.overview(r, settings.keys)
    before = commands(r)
    start = time.perf_counter()
    data.overview(r, settings.keys)
    ms = (time.perf_counter() - start) * 1000
    return commands(r) - before - 1, ms  # the INFO call itself counts once


async def settle(url: str, namespace: str, agents: list[str], n: int, log_dir: Path) -> None:
    settings = load_settings(env={}, overrides={"redis_url": url, "namespace": namespace})
    client = FarmClient(settings)
    try:
        pools = [WorkerPool(url, namespace, a, 1, 256, log_dir, a, impl="noop") for a in agents]
        for pool in pools:
            pool.__enter__()
        try:
            for pool in pools:
                await pool.ready(client)
            tasks = [client.task(run_id="fill", agent=agents[i % len(agents)], row={}) for i in range(n)]
            for start in range(0, n, 5000):
                batch = tasks[start : start + 5000]
                await asyncio.gather(client.submit(batch), client.collect(batch, timeout_s=300))
        finally:
            for pool in pools:
                pool.__exit__(None, None, None)
    finally:
        await client.aclose()


async def bench_refresh(url: str, sizes: list[int], log_dir: Path) -> list[dict]:
    out = []
    r = redis.Redis.from_url(url)
    for n_agents in (1, 4):
        namespace = f"bench-{uuid.uuid4().hex[:12]}"
        settings = load_settings(env={}, overrides={"redis_url": url, "namespace": namespace})
        agents = [f"agent{i}" for i in range(n_agents)]
        done = 0
        try:
            for size in sizes:
                await settle(url, namespace, agents, size - done, log_dir)
                done = size
                calls, ms = refresh_cost(r, settings)
                out.append({"agents": n_agents, "tasks": size, "commands": calls, "ms": ms})
        finally:
            delete_namespace(url, namespace)
    r.close()
    return out


MODES = {
    "off": {"FARM_HISTORY": "false", "FARM_SAMPLE_EVERY": "0"},
    "on": {"FARM_SAMPLE_EVERY": "0"},
    "defaults": {},
}


async def one_round(url: str, tasks: int, log_dir: Path, mode: str) -> float:
    namespace = f"bench-{uuid.uuid4().hex[:12]}"
    settings = load_settings(env={}, overrides={"redis_url": url, "namespace": namespace})
    try:
        with WorkerPool(url, namespace, "noop", 1, 256, log_dir, mode, **MODES[mode]) as pool:
            client = FarmClient(settings)
            try:
                await pool.ready(client)
                await measure_throughput(client, "warmup", 2000)
                result = await measure_throughput(client, "timed", tasks)
            finally:
                await client.aclose()
    finally:
        delete_namespace(url, namespace)
    return result["rollouts_per_s"]


async def bench_history(url: str, tasks: int, rounds: int, log_dir: Path) -> dict:
    runs: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(rounds):
        for mode in MODES:
            runs[mode].append(await one_round(url, tasks, log_dir, mode))
    median = {mode: statistics.median(xs) for mode, xs in runs.items()}
    return {"tasks": tasks, "rounds": rounds, "runs": runs, "median": median, "ratio": median["on"] / median["off"]}


def report(refresh: list[dict], hist: dict) -> None:
    print(f"{'measurement':<52}{'value':>14}  target")
    print("-" * 78)
    for row in refresh:
        label = f"one refresh, {row['agents']} agent(s), {row['tasks']:,} tasks settled"
        print(f"{label:<52}{row['commands']:>6} cmds {row['ms']:>5.1f} ms")
    for n_agents in (1, 4):
        counts = {row["commands"] for row in refresh if row["agents"] == n_agents}
        verdict = "ok" if len(counts) == 1 else "GROWS WITH TASKS"
        print(f"{f'  commands independent of tasks ({n_agents} agent(s))':<52}{'':>14}  {verdict}")
    n = hist["rounds"]
    for mode, label in (("off", "history off"), ("on", "history on"), ("defaults", "history and samples on")):
        print(f"{f'noop rollouts/s, {label} (median of {n})':<52}{hist['median'][mode]:>12,.0f}/s")
    ok = "ok" if hist["ratio"] >= TARGET_RATIO else "BELOW TARGET"
    print(f"{'  on / off':<52}{hist['ratio']:>13.1%}  >= {TARGET_RATIO:.0%} {ok}")
    print(json.dumps({"refresh": refresh, "history": hist, "target_ratio": TARGET_RATIO}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--tasks", type=int, default=20_000, help="tasks per timed history round, and the larger fill")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="farm-bench-") as tmp:
        server = None
        url = args.redis_url
        if not answers(url):
            server = EmbeddedRedis(Path(tmp) / "redis", port=6399).start()
            url = server.url
        try:
            refresh = asyncio.run(bench_refresh(url, [2000, args.tasks], Path(tmp)))
            hist = asyncio.run(bench_history(url, args.tasks, args.rounds, Path(tmp)))
        finally:
            if server is not None:
                server.stop()
    report(refresh, hist)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
