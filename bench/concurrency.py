"""Concurrency: does one worker process keep C agent loops in flight at the speed of the model?

A policy that answers every request after L seconds bounds a worker at C concurrent
two-turn rollouts to C / (2 L) rollouts/s (Little's law). This benchmark measures how close
one `farm worker --agent single_tool_call --concurrency C` process comes to that bound,
side by side, in the same run, with the simplest client that could do the same work:

  farm    the real worker process (tokenizer, chat template, tool call, verifier, Redis in
          and out through farm.client.FarmClient), N = waves x C tasks, against
          workers/policy/stub answering the environment's two turns after L seconds
          (a Hermes tool call for get_weather, then an answer), with token ids.
  plain   a child process with one aiohttp session (TCPConnector(limit=C)) sending the same
          two /v1/completions bodies per "rollout", C at a time, N rollouts.

For each L in --latencies and C in --concurrency it prints: rollouts/s, the ratio to
C / (2 L), rollout latency p50/p99, CPU ms per rollout of the worker (or plain client)
process, its peak RSS, and failures by kind. Targets (issue: policy path at scale): >= 0.90
of Little's law up to C=2048 at L=10 s, >= 0.85 at C=4096, never below plain - 0.05, peak
RSS < 1 GB at C=4096, <= 2 ms worker CPU per rollout, zero failures.

    python bench/concurrency.py [--latencies 2,10] [--concurrency 256,1024,2048,4096] [--waves 3]

The stub, the worker, the plain client and Redis share this machine's CPUs; the table
prints the load average. The run uses its own namespace on --redis-url and deletes it.
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
from collections import Counter
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import WorkerPool, answers, delete_namespace  # noqa: E402
from workers.policy.stub import WEATHER_CALL, Script, StubProcess, weather_rows, weather_script  # noqa: E402
from workers.supervise.stack import policy_env  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def plain_bodies(tok, script: Script) -> list[bytes]:
    """The two request bodies the worker sends for one rollout (first prompt; prompt after the tool call)."""
    from envs.single_tool_call import SingleToolCall
    from workers.policy.chat import chat_tools, input_messages

    row = weather_rows(1)[0]
    env = SingleToolCall()
    history, tools = tok.with_tools(
        input_messages(row["responses_create_params"]), chat_tools([t.schema() for t in env.tools()])
    )
    first = tok.prompt_ids(history, tools)
    history.append({"role": "assistant", "content": WEATHER_CALL})
    env_ids = tok.append_ids(history, tools, [{"role": "tool", "content": json.dumps({"city": "Paris"})}])
    second = first + script.token_replies[0] + env_ids
    base = {
        "model": "stub",
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
        "temperature": 1.0,
        "top_p": 1.0,
        "max_tokens": 96,
    }
    return [json.dumps({**base, "prompt": p}).encode() for p in (first, second)]


# -- process accounting --------------------------------------------------------------------------
def cpu_s(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


# -- the plain client (a child process, so its CPU and memory are its own) ------------------------
async def plain_main(url: str, bodies: list[bytes], concurrency: int, n: int) -> dict:
    import aiohttp

    gate = asyncio.Semaphore(concurrency)
    fails: Counter = Counter()
    latencies: list[float] = []
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=concurrency), timeout=aiohttp.ClientTimeout(total=600)
    ) as http:

        async def one() -> None:
            async with gate:
                start = time.perf_counter()
                for body in bodies:
                    try:
                        async with http.post(url + "/v1/completions", data=body, headers=headers) as resp:
                            await resp.read()
                            if resp.status != 200:
                                fails[f"HTTP {resp.status}"] += 1
                                return
                    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                        fails[type(exc).__name__] += 1
                        return
                latencies.append(time.perf_counter() - start)

        cpu0, start = time.process_time(), time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    return {
        "wall_s": wall,
        "done": len(latencies),
        "failures": dict(fails),
        "cpu_s": cpu,
        "p50_s": pct(latencies, 0.5),
        "p99_s": pct(latencies, 0.99),
        "peak_rss_mb": peak_rss_mb(os.getpid()),
    }


def plain_round(url: str, bodies: list[bytes], concurrency: int, n: int, tmp: Path) -> dict:
    spec = tmp / "plain.json"
    spec.write_text(
        json.dumps({"url": url, "bodies": [b.decode() for b in bodies], "concurrency": concurrency, "n": n})
    )
    out = subprocess.run(
        [sys.executable, __file__, "--plain-child", str(spec)], capture_output=True, text=True, cwd=ROOT, timeout=3600
    )
    if out.returncode != 0:
        raise SystemExit(f"plain client failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- the farm ------------------------------------------------------------------------------------
async def farm_round(url: str, stub: StubProcess, model_dir: Path, concurrency: int, n: int, tmp: Path) -> dict:
    from farm.client import FarmClient
    from farm.settings import load_settings

    namespace = f"bench-{uuid.uuid4().hex[:12]}"
    settings = load_settings(env={}, overrides={"redis_url": url, "namespace": namespace})
    fails: Counter = Counter()
    try:
        with WorkerPool(
            url,
            namespace,
            "single_tool_call",
            1,
            concurrency,
            tmp,
            f"c{concurrency}",
            **policy_env(stub.url, "stub", model_dir),
        ) as pool:
            client = FarmClient(settings)
            try:
                await pool.ready(client, timeout_s=120.0)
                pid = pool.pids[0]
                tasks = [client.task(run_id="bench", agent="single_tool_call", row=r) for r in weather_rows(n)]
                cpu0, start = cpu_s(pid), time.perf_counter()
                _, got = await asyncio.gather(client.submit(tasks), client.collect(tasks, timeout_s=3600))
                wall, cpu = time.perf_counter() - start, cpu_s(pid) - cpu0
                pool.check()
                rss = peak_rss_mb(pid)
            finally:
                await client.aclose()
            stop_started = time.perf_counter()
        stop_s = time.perf_counter() - stop_started  # SIGTERM to exit (a killed worker: -9 below)
        exit_code = pool.children[0].returncode
    finally:
        delete_namespace(url, namespace)
    latencies = [r.timings.total_s for r in got.values() if r.ok]
    for r in got.values():
        if not r.ok:
            fails[r.error.kind] += 1
    rewards = [r.reward for r in got.values() if r.ok and r.reward is not None]
    return {
        "wall_s": wall,
        "done": len(latencies),
        "failures": dict(fails),
        "cpu_s": cpu,
        "p50_s": pct(latencies, 0.5),
        "p99_s": pct(latencies, 0.99),
        "peak_rss_mb": rss,
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        "sigterm_exit": f"{exit_code} in {stop_s:.1f}s",
    }


# -- report --------------------------------------------------------------------------------------
def summarize(side: str, res: dict, latency: float, concurrency: int, n: int) -> dict:
    rate = res["done"] / res["wall_s"]
    ideal = concurrency / (2 * latency)
    return {
        "side": side,
        "L": latency,
        "C": concurrency,
        "n": n,
        "rollouts_per_s": rate,
        "ratio": rate / ideal,
        "p50_s": res["p50_s"],
        "p99_s": res["p99_s"],
        "cpu_ms_per_rollout": 1000 * res["cpu_s"] / max(1, n),
        "peak_rss_mb": res["peak_rss_mb"],
        "failures": res["failures"],
        "mean_reward": res.get("mean_reward"),
        "sigterm_exit": res.get("sigterm_exit", ""),
    }


def print_row(r: dict) -> None:
    fails = ", ".join(f"{k}: {v}" for k, v in sorted(r["failures"].items())) or "0"
    reward = "" if r["mean_reward"] is None else f"{r['mean_reward']:.2f}"
    print(
        f"{r['L']:>4g} s {r['C']:>6} {r['side']:<6} {r['n']:>6} {r['rollouts_per_s']:>9.1f} {r['ratio']:>6.2f} "
        f"{r['p50_s']:>7.2f} {r['p99_s']:>7.2f} {r['cpu_ms_per_rollout']:>8.2f} {r['peak_rss_mb']:>8.0f}  "
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
    p.add_argument("--sides", default="farm,plain")
    p.add_argument("--plain-child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.plain_child:
        spec = json.loads(Path(args.plain_child).read_text())
        res = asyncio.run(plain_main(spec["url"], [b.encode() for b in spec["bodies"]], spec["concurrency"], spec["n"]))
        print(json.dumps(res))
        return 0
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
        f"one worker process vs a plain aiohttp client; policy stub with {kind}; {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}; load at start {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'L':>6} {'C':>6} {'side':<6} {'n':>6} {'rollout/s':>9} {'ratio':>6} {'p50 s':>7} {'p99 s':>7} "
        f"{'cpu ms/r':>8} {'rss MB':>8}  {'reward':>6}  {'SIGTERM exit':<12}  failures"
    )
    print("-" * 110)
    with tempfile.TemporaryDirectory(prefix="farm-bench-conc-") as tmp_name:
        tmp = Path(tmp_name)
        stub = StubProcess(script, latency_s=1.0, workdir=tmp).start()
        try:
            for latency in (float(x) for x in args.latencies.split(",")):
                stub.control(latency_s=latency, jitter_s=args.jitter * latency)
                for c in (int(x) for x in args.concurrency.split(",")):
                    n = args.waves * c
                    for side in sides:
                        if side == "farm":
                            res = asyncio.run(farm_round(args.redis_url, stub, model_dir, c, n, tmp))
                        else:
                            res = plain_round(stub.url, bodies, c, n, tmp)
                        row = summarize(side, res, latency, c, n)
                        results.append(row)
                        print_row(row)
        finally:
            stub.stop()
    print(
        f"ratio: rollouts/s over C / (2 L); cpu ms/r: CPU of the worker (or plain client) process per rollout; "
        f"load at end {os.getloadavg()[0]:.2f}; runtime {time.monotonic() - started:.0f}s"
    )
    print(json.dumps({"results": results, "command": " ".join(sys.argv)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
