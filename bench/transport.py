"""How much the farm itself costs: transport throughput, queueing latency, wire-format speed.

With the built-in `noop` agent a rollout does no work, so what is left is the farm's own
overhead: XADD by the producer, XREADGROUP by a worker, one settle script per task, XREAD
and decode by the consumer. A real rollout takes seconds (vLLM calls, tools, verifiers),
so this overhead only matters if it is large enough to starve a trainer or to delay a
task's start; these three figures say whether it is:

1. throughput   noop rollouts/s end to end through real Redis (FarmClient.submit ->
                `python -m farm worker` processes -> FarmClient.collect), with 1 and 2
                worker processes, after a warm-up batch so start-up is not timed.
                Target: >= 3,000 rollouts/s.
2. latency      enqueue-to-pickup (`timings.queue_wait_s`: pickup time minus the task's
                created_at) at a fixed offered load of 1,000 tasks/s, submitted in small
                paced ticks with created_at stamped at send time. Target: p99 < 10 ms.
3. codec        entry() + decode_rollout() of a Rollout carrying an 8,192-token trace,
                mean over many iterations. Target: < 0.1 ms.

Run on the target machine, with nothing else busy:

    python bench/transport.py [--redis-url URL] [--tasks 20000] [--concurrency 256]

Each run uses its own namespace (`bench-<uuid>`) and deletes its keys afterwards. If no
Redis answers at --redis-url, an embedded one (farm.embedded) is started in a temp dir.
The figures are printed as a table, then as one JSON line for scripts.

`--wait-replicas N` measures what WAIT costs (redis_wait_replicas, docs/failover.md): it starts
its own primary with N replicas (`redis-server --replicaof`) in a temp dir, instead of
--redis-url, and runs every pool on it twice, without WAIT and with WAIT for N replicas, and
prints the two side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlsplit

import msgspec
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import WorkerPool, answers, delete_namespace  # noqa: E402
from farm import schema  # noqa: E402
from farm.client import FarmClient  # noqa: E402
from farm.embedded import EmbeddedRedis, free_port, redis_server_binary  # noqa: E402
from farm.settings import load_settings  # noqa: E402

AGENT = "noop"
TARGETS = {"rollouts_per_s": 3000.0, "p99_ms": 10.0, "codec_ms": 0.1}


def row(i: int) -> dict:
    return {"responses_create_params": {"input": [{"role": "user", "content": f"bench task {i}"}]}}


def percentile(sorted_xs: list[float], q: float) -> float:
    return sorted_xs[min(len(sorted_xs) - 1, int(q * len(sorted_xs)))] if sorted_xs else float("nan")


# -- the three measurements ---------------------------------------------------------------------
async def measure_throughput(client: FarmClient, run_id: str, n: int) -> dict:
    """Submit n tasks while collecting their rollouts; the clock covers first XADD to last rollout."""
    tasks = [client.task(run_id=run_id, agent=AGENT, row=row(i)) for i in range(n)]
    start = time.perf_counter()
    _, rollouts = await asyncio.gather(client.submit(tasks), client.collect(tasks, timeout_s=300))
    wall = time.perf_counter() - start
    failed = sum(1 for r in rollouts.values() if not r.ok)
    if failed:
        raise SystemExit(f"{failed} of {n} noop rollouts failed")
    return {"tasks": n, "wall_s": wall, "rollouts_per_s": n / wall}


async def measure_latency(client: FarmClient, run_id: str, rate: float, seconds: float, tick_s: float) -> dict:
    """Offer `rate` tasks/s for `seconds`: `rate * tick_s` tasks per tick on an absolute schedule.

    The tasks are built up front (so the consumer can wait for their ids from the start) and
    get their created_at stamped just before their tick's XADD.
    """
    per_tick = max(1, round(rate * tick_s))
    ticks = max(1, int(seconds / tick_s))
    tasks = [client.task(run_id=run_id, agent=AGENT, row=row(i)) for i in range(ticks * per_tick)]

    async def produce() -> float:
        t0 = time.monotonic()
        for k in range(ticks):
            delay = t0 + k * tick_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            now = time.time()
            batch = [msgspec.structs.replace(t, created_at=now) for t in tasks[k * per_tick : (k + 1) * per_tick]]
            await client.submit(batch)
        return time.monotonic() - t0

    offered_s, rollouts = await asyncio.gather(produce(), client.collect(tasks, timeout_s=seconds + 60))
    waits = sorted(r.timings.queue_wait_s * 1000 for r in rollouts.values() if r.ok)
    if len(waits) != len(tasks):
        raise SystemExit(f"{len(tasks) - len(waits)} of {len(tasks)} paced rollouts failed or went missing")
    return {
        "tasks": len(tasks),
        "offered_per_s": len(tasks) / offered_s,
        "p50_ms": percentile(waits, 0.50),
        "p99_ms": percentile(waits, 0.99),
        "max_ms": waits[-1],
    }


def measure_codec(tokens: int = 8192, iterations: int = 5000) -> dict:
    trace = schema.TokenTrace.build(
        range(512), [i % 32000 for i in range(tokens)], [-0.5] * tokens, [1] * tokens, [(0, tokens)]
    )
    task = schema.Task.new(run_id="bench", agent=AGENT, row=row(0), reply_to="bench:results:bench")
    rollout = schema.Rollout.for_task(
        task,
        status=schema.Status.ok,
        reward=1.0,
        trace=trace,
        output=[{"type": "message", "role": "assistant", "content": "x" * 2000}],
    )
    assert schema.decode_rollout(schema.entry(rollout)) == rollout
    for _ in range(200):  # warm caches and the allocator
        schema.decode_rollout(schema.entry(rollout))
    start = time.perf_counter()
    for _ in range(iterations):
        schema.decode_rollout(schema.entry(rollout))
    mean_ms = (time.perf_counter() - start) / iterations * 1000
    return {
        "tokens": tokens,
        "iterations": iterations,
        "entry_bytes": len(schema.entry(rollout)[b"d"]),
        "mean_ms": mean_ms,
    }


async def bench_pool(url: str, processes: int, args: argparse.Namespace, log_dir: Path, wait: int = 0) -> dict:
    """Throughput and latency with `processes` fresh workers, in a namespace of their own; with
    `wait`, the workers' settles and the client's submits WAIT for that many replicas."""
    namespace = f"bench-{uuid.uuid4().hex[:12]}"
    settings = load_settings(env={}, overrides={"redis_url": url, "namespace": namespace, "redis_wait_replicas": wait})
    label = f"{processes}p-wait{wait}"
    waits_before = wait_calls(url)
    env = {"FARM_REDIS_WAIT_REPLICAS": str(wait)}
    try:
        with WorkerPool(url, namespace, AGENT, processes, args.concurrency, log_dir, label, **env) as pool:
            client = FarmClient(settings)
            try:
                await pool.ready(client)
                await measure_throughput(client, "warmup", args.warmup)
                throughput = await measure_throughput(client, "throughput", args.tasks)
                pool.check()
                latency = await measure_latency(client, "latency", args.rate, args.seconds, args.tick_ms / 1000)
                pool.check()
            finally:
                await client.aclose()
    finally:
        delete_namespace(url, namespace)
    return {
        "processes": processes,
        "concurrency": args.concurrency,
        "wait_replicas": wait,
        "wait_commands": wait_calls(url) - waits_before,
        "throughput": throughput,
        "latency": latency,
    }


def wait_calls(url: str) -> int:
    """WAIT commands the server has run (INFO commandstats): the proof that a side did WAIT, and how often."""
    client = redis.Redis.from_url(url)
    try:
        return int(client.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))
    finally:
        client.close()


def start_replicas(primary: EmbeddedRedis, n: int, tmp: Path, stack: ExitStack) -> None:
    """`n` redis-server replicas of `primary` (127.0.0.1, free ports, no persistence), stopped with
    the stack; returns once the primary counts them all online."""
    for i in range(n):
        port, workdir = free_port(), tmp / f"replica-{i}"
        workdir.mkdir()
        cmd = [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir)]
        cmd += ["--save", "", "--appendonly", "no", "--replicaof", "127.0.0.1", str(primary.port)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        stack.callback(proc.wait, 10)
        stack.callback(proc.terminate)
    client = redis.Redis.from_url(primary.url)
    deadline = time.monotonic() + 30
    while client.info("replication").get("connected_slaves", 0) < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"the {n} replicas did not attach to the primary within 30 s")
        time.sleep(0.1)
    while client.wait(n, 1000) < n:  # every replica has caught up
        if time.monotonic() > deadline:
            raise SystemExit(f"the {n} replicas did not catch up within 30 s")
    client.close()


def side_by_side(results: list[dict]) -> None:
    """Each pool's figures without WAIT and with it, in one table."""
    by = {(r["processes"], r["wait_replicas"]): r for r in results}
    waits = sorted({w for _, w in by if w})
    print(f"\n{'WAIT cost':<44} {'no WAIT':>12} " + " ".join(f"{f'WAIT {w}':>12}" for w in waits))
    print("-" * (58 + 13 * len(waits)))
    for p in sorted({p for p, _ in by}):
        lines = [
            (f"throughput, {p} proc (rollouts/s)", lambda r: f"{r['throughput']['rollouts_per_s']:,.0f}"),
            (f"pickup latency p50, {p} proc (ms)", lambda r: f"{r['latency']['p50_ms']:.2f}"),
            (f"pickup latency p99, {p} proc (ms)", lambda r: f"{r['latency']['p99_ms']:.2f}"),
            (f"WAIT commands run, {p} proc", lambda r: f"{r['wait_commands']:,}"),
        ]
        for name, shown in lines:
            print(f"{name:<44} {shown(by[(p, 0)]):>12} " + " ".join(f"{shown(by[(p, w)]):>12}" for w in waits))


def report(results: list[dict], codec: dict, meta: dict) -> dict:
    """Print the table, then the whole result as one JSON line."""
    rows = []  # (measurement, value, unit, target text, met)
    for res in results:
        p, t, lat = res["processes"], res["throughput"], res["latency"]
        if res.get("wait_replicas"):
            p = f"{p} (WAIT {res['wait_replicas']})"
        load = f"{lat['offered_per_s']:,.0f} tasks/s offered"
        rows += [
            (
                f"throughput, {p} proc x {res['concurrency']}, {t['tasks']:,} tasks",
                t["rollouts_per_s"],
                "/s",
                f">= {TARGETS['rollouts_per_s']:,.0f}/s",
                t["rollouts_per_s"] >= TARGETS["rollouts_per_s"],
            ),
            (f"pickup latency p50, {p} proc, {load}", lat["p50_ms"], "ms", "", None),
            (
                f"pickup latency p99, {p} proc, {load}",
                lat["p99_ms"],
                "ms",
                f"< {TARGETS['p99_ms']:g} ms",
                lat["p99_ms"] < TARGETS["p99_ms"],
            ),
        ]
    rows.append(
        (
            f"encode+decode, {codec['tokens']:,}-token rollout, mean",
            codec["mean_ms"],
            "ms",
            f"< {TARGETS['codec_ms']:g} ms",
            codec["mean_ms"] < TARGETS["codec_ms"],
        )
    )

    print(f"farm transport benchmark: {meta['redis']}, {meta['cpus']} CPUs, Python {meta['python']}")
    print(f"{'measurement':<52} {'value':>12}  {'target':<11} result")
    print("-" * 85)
    for name, value, unit, target, met in rows:
        shown = (
            f"{value:,.0f} {unit}" if unit == "/s" else f"{value:.4f} {unit}" if value < 1 else f"{value:.2f} {unit}"
        )
        print(f"{name:<52} {shown:>12}  {target:<11} {'' if met is None else 'ok' if met else 'MISSED'}")
    summary = {"meta": meta, "pools": results, "codec": codec, "targets": TARGETS}
    print(json.dumps(summary))
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--redis-url",
        default="redis://127.0.0.1:6379/0",
        help="Redis to measure against; if nothing answers, an embedded one is started",
    )
    p.add_argument("--tasks", type=int, default=20_000, help="tasks in the timed throughput batch")
    p.add_argument("--warmup", type=int, default=1_000, help="tasks run (untimed) before the timed batch")
    p.add_argument(
        "--concurrency",
        type=int,
        default=256,
        help="concurrent rollouts per worker process; a noop rollout takes no time, so "
        "this is in effect how many tasks one XREADGROUP may fetch",
    )
    p.add_argument("--processes", default="1,2", help="worker process counts to measure, comma-separated")
    p.add_argument("--rate", type=float, default=1000.0, help="offered load for the latency run, tasks/s")
    p.add_argument("--seconds", type=float, default=5.0, help="length of the latency run")
    p.add_argument("--tick-ms", type=float, default=5.0, help="submission tick of the latency run")
    p.add_argument("--codec-iterations", type=int, default=5000)
    p.add_argument(
        "--wait-replicas",
        type=int,
        default=0,
        help="also measure with WAIT for N replicas: starts a primary with N replicas instead of --redis-url",
    )
    args = p.parse_args(argv)

    codec = measure_codec(iterations=args.codec_iterations)
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="farm-bench-")))
        url = args.redis_url
        if args.wait_replicas > 0:
            primary = stack.enter_context(EmbeddedRedis(tmp / "redis", appendfsync="no"))
            start_replicas(primary, args.wait_replicas, tmp, stack)
            url = primary.url
        elif not answers(url):
            print(f"nothing answers at {url}; starting an embedded Redis", file=sys.stderr)
            url = stack.enter_context(EmbeddedRedis(tmp / "redis", appendfsync="no")).url
        info = redis.Redis.from_url(url).info("server")
        meta = {
            "redis": f"Redis {info['redis_version']} at {urlsplit(url).hostname}:{urlsplit(url).port}",
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        }
        sides = [0, args.wait_replicas] if args.wait_replicas > 0 else [0]
        meta["replicas"] = args.wait_replicas
        results = [
            asyncio.run(bench_pool(url, int(n), args, tmp, wait)) for n in args.processes.split(",") for wait in sides
        ]
        report(results, codec, meta)
        if args.wait_replicas > 0:
            side_by_side(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
