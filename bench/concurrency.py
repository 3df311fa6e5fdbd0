"""Concurrency: do `farm worker --processes P` keep C agent loops in flight at the speed of the model?

A policy that answers every request after L seconds bounds C concurrent two-turn rollouts to
C / (2 L) rollouts/s (Little's law). This benchmark measures how close the farm comes to that
bound, side by side, in the same run, with the simplest client that could do the same work:

  farm    `farm worker --agent single_tool_call --processes P --concurrency C/P` (a supervisor
          and P workers: tokenizer, chat template, tool call, verifier, Redis in and out through
          farm.client.FarmClient), N = waves x C tasks, against workers/policy/stub answering
          the environment's two turns after L seconds, with token ids. `farm-asyncio` and
          `farm-uvloop` pin the workers' event loop (FARM_EVENT_LOOP); `farm` takes the default.
  plain   --plain-processes child processes, each one aiohttp session (TCPConnector(limit=C/Q))
          sending the same two /v1/completions bodies per "rollout", C at a time in all.

For each L in --latencies and C in --concurrency it prints: rollouts/s, the ratio to
C / (2 L), rollout latency p50/p99, CPU ms per rollout of the workers (or plain clients) summed,
the cores they used, each one's peak RSS, their peak open sockets, the cores of the policy stub
and of Redis (shared with whatever else uses it), and failures by kind; the JSON line adds
per-process figures, the bench's own CPU, and when the first wave and the rest were picked up
and finished. `--profile S` records each worker with py-spy for S seconds after the first wave.

    python bench/concurrency.py [--latencies 2,10] [--concurrency 4096,8192,16384] [--processes 2]

The stub, the workers, the plain clients and Redis share this machine's CPUs; each row prints
the load average. The run uses its own namespace on --redis-url and deletes it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import answers, delete_namespace  # noqa: E402
from bench.plain import plain_bodies, plain_round  # noqa: E402
from bench.procstat import Profiles, SocketPeaks, children, cpu_s, peak_rss_mb, redis_pid  # noqa: E402
from workers.policy.stub import StubProcess, weather_rows, weather_script  # noqa: E402
from workers.supervise.stack import policy_env  # noqa: E402


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


# -- the farm ------------------------------------------------------------------------------------
async def farm_round(
    url: str,
    stub: StubProcess,
    model_dir: Path,
    latency: float,
    concurrency: int,
    n: int,
    tmp: Path,
    opts: argparse.Namespace,
    event_loop: Optional[str],
) -> dict:
    """One `farm worker --processes P --concurrency C/P` (its supervisor and P workers) through n rollouts."""
    from farm.client import FarmClient
    from farm.settings import load_settings
    from workers.supervise.stack import LocalStack, Pool

    namespace = f"bench-{uuid.uuid4().hex[:12]}"
    settings = load_settings(env={}, overrides={"redis_url": url, "namespace": namespace})
    fails: Counter = Counter()
    per = -(-concurrency // opts.processes)
    env = {"FARM_LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT), **policy_env(stub.url, "stub", model_dir)}
    if event_loop:
        env["FARM_EVENT_LOOP"] = event_loop
    stack = LocalStack(
        settings,
        [Pool("single_tool_call", opts.processes, per, label=f"c{concurrency}")],
        env=env,
        log_dir=tmp,
        cwd=ROOT,
        stop_timeout_s=30.0,
    )
    try:
        with stack:
            top = stack.procs[0].pid
            pids = children(top) if opts.processes > 1 else [top]
            client = FarmClient(settings)
            try:
                tasks = [client.task(run_id="bench", agent="single_tool_call", row=r) for r in weather_rows(n)]
                watched = [top, *pids] if opts.processes > 1 else pids
                others = {"stub": stub.proc.pid, "redis": redis_pid(int(url.rsplit(":", 1)[1].split("/")[0]))}
                cpu0, others0 = [cpu_s(p) for p in watched], {k: cpu_s(p) for k, p in others.items() if p}
                own0, start, epoch0 = time.process_time(), time.perf_counter(), time.time()
                # Past the first wave (its connections set up), until the last wave starts to end.
                delay_s, profile_s = 2 * latency + 2, min(opts.profile, 2 * latency * (n / concurrency - 1))
                profiles = Profiles(pids, profile_s, opts.profile_dir, f"c{concurrency}", delay_s)
                with SocketPeaks(pids) as socks, profiles:
                    _, got = await asyncio.gather(client.submit(tasks), client.collect(tasks, timeout_s=3600))
                    wall = time.perf_counter() - start
                cpu = [cpu_s(p) - c0 for p, c0 in zip(watched, cpu0)]
                others_cpu = {k: cpu_s(others[k]) - c0 for k, c0 in others0.items()}
                own_cpu = time.process_time() - own0
                if stack.exited() is not None:
                    raise SystemExit(f"a worker exited early; logs in {tmp}")
                rss = [peak_rss_mb(p) for p in pids]
            finally:
                await client.aclose()
            stop_started = time.perf_counter()
        stop_s = time.perf_counter() - stop_started  # SIGTERM to exit (a killed worker: -9 below)
        exit_code = stack.procs[0].returncode
    finally:
        delete_namespace(url, namespace)
    latencies = [r.timings.total_s for r in got.values() if r.ok]
    for r in got.values():
        if not r.ok:
            fails[r.error.kind] += 1
    rewards = [r.reward for r in got.values() if r.ok and r.reward is not None]
    return {
        "wall_s": wall,
        "latencies": latencies,
        "failures": dict(fails),
        "cpu_s": cpu[1:] if opts.processes > 1 else cpu,  # per worker; the supervisor's apart
        "supervisor_cpu_s": cpu[0] if opts.processes > 1 else 0.0,
        "rss_mb": rss,
        "sockets": [socks.peak[p] for p in pids],
        "others_cpu_s": others_cpu,
        "driver_cpu_s": own_cpu,
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        # Where a rollout's time went: waiting in the stream, in the two model turns (L each plus the
        # worker's delay in reading the answers), and the rest (tokenizing, the tool, the verifier).
        "timeline": timeline(tasks, got, epoch0, concurrency),
        "parts_p50_s": {
            part: pct([getattr(r.timings, part) for r in got.values() if r.ok], 0.5)
            for part in ("queue_wait_s", "model_s", "total_s")
        },
        "sigterm_exit": f"{exit_code} in {stop_s:.1f}s",
        "profiles": [str(x) for x in profiles.paths],
    }


def timeline(tasks: list, got: dict, epoch0: float, concurrency: int) -> dict:
    """When rollouts were picked up and finished, seconds after the submit began, min / p50 / max,
    for the first C tasks (the first wave) and the rest: where a round's time beyond waves x 2L went."""
    spans = []
    for t in tasks:
        r = got.get(t.task_id)
        if r is not None and r.ok:
            picked = t.created_at + r.timings.queue_wait_s - epoch0
            spans.append((picked, picked + r.timings.total_s))
    spans.sort()
    out = {}
    for name, part in (("first", spans[:concurrency]), ("rest", spans[concurrency:])):
        if part:
            picks, ends = sorted(p for p, _ in part), sorted(e for _, e in part)
            out[name] = {
                "picked": [round(x, 2) for x in (picks[0], pct(picks, 0.5), picks[-1])],
                "finished": [round(x, 2) for x in (ends[0], pct(ends, 0.5), ends[-1])],
            }
    return out


# -- report --------------------------------------------------------------------------------------
def summarize(side: str, res: dict, latency: float, concurrency: int, n: int) -> dict:
    rate = len(res["latencies"]) / res["wall_s"]
    ideal = concurrency / (2 * latency)
    ms = [1000 * c / max(1, n) for c in res["cpu_s"]]
    return {
        "side": side,
        "processes": len(res["cpu_s"]),
        "L": latency,
        "C": concurrency,
        "n": n,
        "rollouts_per_s": rate,
        "ratio": rate / ideal,
        "p50_s": pct(res["latencies"], 0.5),
        "p99_s": pct(res["latencies"], 0.99),
        "cpu_ms_per_rollout": sum(ms),
        "cpu_ms_per_rollout_each": ms,
        "cpu_cores": sum(res["cpu_s"]) / res["wall_s"],
        "rss_mb_each": res["rss_mb"],
        "rss_mb": sum(res["rss_mb"]),
        "sockets_each": res["sockets"],
        "sockets": sum(res["sockets"]),
        **{f"{k}_cores": v / res["wall_s"] for k, v in res.get("others_cpu_s", {}).items()},
        "driver_cpu_ms_per_rollout": 1000 * res.get("driver_cpu_s", 0.0) / max(1, n),
        "failures": res["failures"],
        "mean_reward": res.get("mean_reward"),
        "sigterm_exit": res.get("sigterm_exit", ""),
        "load": os.getloadavg()[0],
        "profiles": res.get("profiles", []),
        "parts_p50_s": res.get("parts_p50_s"),
        "timeline": res.get("timeline"),
    }


def print_row(r: dict) -> None:
    fails = ", ".join(f"{k}: {v}" for k, v in sorted(r["failures"].items())) or "0"
    reward = "" if r["mean_reward"] is None else f"{r['mean_reward']:.2f}"
    each = "/".join(f"{x:.0f}" for x in r["rss_mb_each"])
    stub, redis_ = (f"{r[k]:.2f}" if k in r else "" for k in ("stub_cores", "redis_cores"))
    print(
        f"{r['L']:>4g} s {r['C']:>6} {r['side']:<12}{r['processes']:>2} {r['n']:>6} {r['rollouts_per_s']:>9.1f} "
        f"{r['ratio']:>6.2f} {r['p50_s']:>7.2f} {r['p99_s']:>7.2f} {r['cpu_ms_per_rollout']:>8.2f} "
        f"{r['cpu_cores']:>5.2f} {each:>11} {r['sockets']:>6} {stub:>5} {redis_:>5} {r['load']:>5.2f}  "
        f"{reward:>6}  {r['sigterm_exit']:<12}  {fails}",
        flush=True,
    )


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--latencies", default="2,10", help="model latencies L in seconds, comma-separated")
    p.add_argument("--concurrency", default="256,1024,2048,4096", help="concurrencies C, comma-separated")
    p.add_argument("--waves", type=int, default=3, help="rollouts per round = waves x C")
    p.add_argument(
        "--jitter",
        type=float,
        default=0.0,
        help="answer latency uniform in L +- jitter x L (0: fixed, every wave answered at once)",
    )
    p.add_argument(
        "--sides",
        default="farm,plain",
        help="farm (the workers' default event loop), farm-asyncio, farm-uvloop (FARM_EVENT_LOOP), plain",
    )
    p.add_argument("--processes", type=int, default=2, help="farm side: `farm worker --processes P`, C split")
    p.add_argument("--plain-processes", type=int, default=1, help="plain side: clients at once, C split")
    p.add_argument("--profile", type=float, default=0.0, help="py-spy each worker for up to this many seconds")
    p.add_argument("--profile-dir", type=Path, default=Path("/tmp/farm-bench-profiles"))
    args = p.parse_args(argv)
    if any(int(c) % args.processes or int(c) % args.plain_processes for c in args.concurrency.split(",")):
        p.error("each --concurrency must divide evenly among --processes and --plain-processes")
    if args.profile and not Profiles([], 0, Path(), "").exe:
        p.error("--profile records with py-spy, which is not installed here (pip install py-spy)")
    if not answers(args.redis_url):
        raise SystemExit(f"no Redis answers at {args.redis_url}")

    from workers.policy.chat import ChatTokenizer
    from workers.policy.serving import default_cache, prepare_model

    started = time.monotonic()
    model_dir = prepare_model(default_cache())
    tok = ChatTokenizer(str(model_dir))
    script = weather_script(tok)
    bodies = plain_bodies(tok, script)
    sides = args.sides.split(",")
    results = []
    kind = f"latency L +- {args.jitter:.0%}" if args.jitter else "fixed latency"
    print(
        f"`farm worker --processes {args.processes}` vs {args.plain_processes} plain aiohttp client(s); "
        f"policy stub with {kind}; {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}; load at start {open('/proc/loadavg').read().strip()}"
    )
    print(
        f"{'L':>6} {'C':>6} {'side':<12}{'P':>2} {'n':>6} {'rollout/s':>9} {'ratio':>6} {'p50 s':>7} {'p99 s':>7} "
        f"{'cpu ms/r':>8} {'cores':>5} {'rss MB each':>11} {'socks':>6} {'stub':>5} {'redis':>5} {'load':>5}  "
        f"{'reward':>6}  {'SIGTERM exit':<12}  failures"
    )
    print("-" * 130)
    with tempfile.TemporaryDirectory(prefix="farm-bench-conc-") as tmp_name:
        tmp = Path(tmp_name)
        stub = StubProcess(script, latency_s=1.0, workdir=tmp).start()
        try:
            for latency in (float(x) for x in args.latencies.split(",")):
                stub.control(latency_s=latency, jitter_s=args.jitter * latency)
                for c in (int(x) for x in args.concurrency.split(",")):
                    n = args.waves * c
                    for side in sides:
                        if side.startswith("farm"):
                            loop = side.partition("-")[2] or None
                            res = asyncio.run(
                                farm_round(args.redis_url, stub, model_dir, latency, c, n, tmp, args, loop)
                            )
                        else:
                            res = plain_round(stub.url, bodies, c, n, tmp, args.plain_processes)
                        row = summarize(side, res, latency, c, n)
                        results.append(row)
                        print_row(row)
        finally:
            stub.stop()
    print(
        "ratio: rollouts/s over C / (2 L); cpu ms/r: CPU of the workers (or plain clients) per rollout, summed; "
        "cores: the same per second of wall time; socks: their peak open sockets, summed; stub: the policy "
        "stub's cores; redis: Redis's cores; load: 1-min load average after the row; "
        f"load at end {open('/proc/loadavg').read().strip()}; runtime {time.monotonic() - started:.0f}s"
    )
    print(json.dumps({"results": results, "command": " ".join(sys.argv)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
