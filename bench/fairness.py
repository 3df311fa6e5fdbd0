"""Fair share between runs (farm.fairness): what a share buys, measured end to end.

1. shares     two `farm collect` processes on 240 noop rows of 0.1 s each, one `--share 3` and one
              `--share 1`, all 480 tasks queued before one worker (concurrency 8, so about 80
              rollouts/s) starts. Printed: how many of the share-1 run's rollouts were done when the
              share-3 run's last one finished (3:1 gives 80; the issue's bound is 70-92), failures,
              and the total time against 480/80 s.
2. backlog    a training run (share 1): steps of --batch noop rollouts (lognormal times, median
              --rollout-s, sigma --sigma, the same times in both runs), every
              step submitted after the previous one came back and a --train-s pause (the optimizer),
              alone, then beside a collection (share 1) with --backlog tasks queued first. Printed,
              side by side: the training run's rollout wait (submit to rollout back at the trainer)
              p50/p95 and its step time, and the ratio (the issue's bound: p95 at most 1.2x).
              Then the collection is cancelled: how long cancel_run took to answer its queue.

    python bench/fairness.py [--redis-url URL] [--backlog 100000] [--steps 10]

Each part runs in its own namespace (`bench-<uuid>`), deleted afterwards. If no Redis answers at
--redis-url, an embedded one (farm.embedded) is started in a temp dir. Figures are printed as
a table, then as one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import WorkerPool, answers, delete_namespace  # noqa: E402
from farm.client import FarmClient  # noqa: E402
from farm.embedded import EmbeddedRedis  # noqa: E402
from farm.settings import load_settings  # noqa: E402


def noop_row(i: int, sleep_s: float) -> dict:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": f"question {i}"}]},
        "agent_ref": {"type": "responses_api_agents", "name": "noop"},
        "noop": {"sleep_s": sleep_s},
    }


def shares(url: str, tmp: Path) -> dict:
    """Part 1: two farm collect runs, 3:1, queued before the worker starts."""
    import redis

    ns = f"bench-{uuid.uuid4().hex[:8]}"
    settings = load_settings(env={}, overrides={"redis_url": url, "namespace": ns})
    rows = tmp / "rows.jsonl"
    rows.write_text("".join(json.dumps(noop_row(i, 0.1)) + "\n" for i in range(240)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update(FARM_REDIS_URL=url, FARM_NAMESPACE=ns, FARM_LOG_LEVEL="WARNING", PYTHONPATH=str(ROOT))
    r = redis.Redis.from_url(url)
    procs = {}
    try:
        for run, share in (("second", "1"), ("first", "3")):  # the share-1 run queues first
            cmd = [sys.executable, "-m", "farm", "collect", "--input", str(rows), "--output", str(tmp / f"{run}.jsonl")]
            cmd += ["--run-id", run, "--share", share, "--no-progress"]
            procs[run] = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            deadline = time.monotonic() + 60
            while r.llen(settings.keys.queue("noop", run)) < 239:
                if time.monotonic() > deadline or procs[run].poll() is not None:
                    raise SystemExit(f"collect {run} did not queue its tasks: {procs[run].stderr.read().decode()}")
                time.sleep(0.05)
        started = time.time()
        with WorkerPool(url, ns, "noop", 1, 8, tmp, "shares"):
            for run, proc in procs.items():
                if proc.wait(timeout=300) != 0:
                    raise SystemExit(f"collect {run} failed: {proc.stderr.read().decode()}")
        out = {run: [json.loads(x) for x in (tmp / f"{run}.jsonl").read_text().splitlines()] for run in procs}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
        delete_namespace(url, ns)
    end_first = max(rec["rollout"]["finished_at"] for rec in out["first"])
    end_all = max(rec["rollout"]["finished_at"] for recs in out.values() for rec in recs)
    return {
        "second_done_when_first_ended": sum(rec["rollout"]["finished_at"] <= end_first for rec in out["second"]),
        "failed": sum(rec["rollout"]["status"] != "ok" for recs in out.values() for rec in recs),
        "total_s": end_all - started,
        "ideal_s": 480 / 80,
    }


def durations(seed: int, n: int, median_s: float, sigma: float) -> list[float]:
    """Rollout times, lognormal around median_s: the same seed gives the same times alone and beside."""
    rnd = random.Random(seed)
    return [median_s * rnd.lognormvariate(0.0, sigma) for _ in range(n)]


async def training(client: FarmClient, args) -> dict:
    """A training run's steps: submit a batch, wait for all of it, pause; per-rollout waits and step times."""
    run = f"train-{uuid.uuid4().hex[:6]}"
    waits: list[float] = []
    step_times: list[float] = []
    for step in range(args.steps):
        tasks = [
            client.task(run_id=run, agent="noop", row={"noop": {"sleep_s": d}, "i": i, "step": step})
            for i, d in enumerate(durations(step, args.batch, args.rollout_s, args.sigma))
        ]
        t0 = time.monotonic()
        await client.submit(tasks, share=1)
        async for rollout in client.results(tasks, timeout_s=600):
            if not rollout.ok:
                raise SystemExit(f"training rollout failed: {rollout.error}")
            waits.append(time.monotonic() - t0)
        step_times.append(time.monotonic() - t0)
        await asyncio.sleep(args.train_s)
    waits.sort()
    return {
        "p50_s": statistics.median(waits),
        "p95_s": waits[int(0.95 * (len(waits) - 1))],
        "step_s": statistics.median(step_times),
    }


async def backlog_part(url: str, tmp: Path, args) -> dict:
    """Part 2: the training run alone, then beside a queued collection."""
    out: dict = {}
    for label, backlog in (("alone", 0), ("beside", args.backlog)):
        ns = f"bench-{uuid.uuid4().hex[:8]}"
        settings = load_settings(env={}, overrides={"redis_url": url, "namespace": ns})
        client = FarmClient(settings)
        try:
            with WorkerPool(url, ns, "noop", args.processes, args.concurrency, tmp, label):
                if backlog:
                    t0 = time.monotonic()
                    times = durations(-1, backlog, args.rollout_s, args.sigma)
                    rows = ({"noop": {"sleep_s": d}, "i": i} for i, d in enumerate(times))
                    await client.submit(client.task(run_id="collection", agent="noop", row=row) for row in rows)
                    out["submit_backlog_s"] = time.monotonic() - t0
                    await asyncio.sleep(5 * args.rollout_s)  # every slot busy with the collection, out of step
                out[label] = await training(client, args)
                if backlog:
                    t0 = time.monotonic()
                    report = await client.cancel_run("collection")
                    out["cancel_s"] = time.monotonic() - t0
                    out["cancel_drained"] = report.drained
        finally:
            await client.aclose()
            delete_namespace(url, ns)
    out["p95_ratio"] = out["beside"]["p95_s"] / out["alone"]["p95_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--backlog", type=int, default=100_000, help="collection tasks queued before the training run")
    p.add_argument("--steps", type=int, default=10, help="training steps, alone and beside the backlog")
    p.add_argument("--batch", type=int, default=32, help="rollouts per training step")
    p.add_argument("--rollout-s", type=float, default=1.0, help="median seconds per noop rollout (both runs)")
    p.add_argument("--sigma", type=float, default=0.5, help="lognormal sigma of the rollout times")
    p.add_argument("--train-s", type=float, default=0.5, help="the pause between steps (the optimizer step)")
    p.add_argument("--processes", type=int, default=2, help="worker processes in part 2")
    p.add_argument("--concurrency", type=int, default=128, help="rollouts per worker process in part 2")
    p.add_argument("--skip-shares", action="store_true", help="only part 2")
    args = p.parse_args(argv)
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="farm-bench-")))
        url = args.redis_url
        if not answers(url):
            print(f"nothing answers at {url}; starting an embedded Redis", file=sys.stderr)
            url = stack.enter_context(EmbeddedRedis(tmp / "redis", appendfsync="no")).url
        part1 = None if args.skip_shares else shares(url, tmp)
        part2 = asyncio.run(backlog_part(url, tmp, args))
    print("farm fair-share benchmark")
    if part1:
        print(f"{'two collects, 3:1, 240 rows each':<58} {'value':>10}  target")
        print(
            f"{'  share-1 run done when the share-3 run ended':<58} {part1['second_done_when_first_ended']:>10}  70-92"
        )
        print(f"{'  failed':<58} {part1['failed']:>10}  0")
        print(f"{'  total time (ideal 480/80 = 6.0 s)':<58} {part1['total_s']:>9.2f}s  <= 7.5 s")
    a, b = part2["alone"], part2["beside"]
    print(
        f"training run, {args.steps} steps x {args.batch} rollouts "
        f"(median {args.rollout_s:g} s, sigma {args.sigma:g}), {args.processes}x{args.concurrency} slots"
    )
    print(f"{'':<34} {'alone':>10} {'beside ' + format(args.backlog, ','):>16}")
    for key, name in (("p50_s", "rollout wait p50"), ("p95_s", "rollout wait p95"), ("step_s", "step time median")):
        print(f"{name:<34} {a[key]:>9.3f}s {b[key]:>15.3f}s")
    print(f"{'p95 ratio (bound 1.2)':<34} {part2['p95_ratio']:>10.3f}")
    print(
        f"queued {args.backlog:,} collection tasks in {part2['submit_backlog_s']:.1f} s; cancel_run answered "
        f"{part2['cancel_drained']:,} queued ones in {part2['cancel_s']:.2f} s"
    )
    print(json.dumps({"shares": part1, "backlog": part2, "args": vars(args)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
