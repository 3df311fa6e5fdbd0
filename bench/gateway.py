"""Gateway: what an openai-SDK harness pays for going through the worker's model gateway, next to the
native agent loop on the same environment, stub, rows and model calls.

Both sides are one `farm worker --processes 1 --concurrency C` process against workers/policy/stub
answering the single_tool_call script (a tool call, then an answer: 2 model calls per rollout on
both sides, counted at the stub):

  native   agent `single_tool_call`: the farm's own tool_use loop over the token client.
  harness  agent `gateway_sdk` = {harness: examples.harnesses.plain_sdk:run, env: single_tool_call}
           in a FARM_CONFIG file: the openai SDK in the worker, its calls through the gateway's
           aiohttp server, the bridge, and the same token client.

  sdk alone  the same harness function and openai SDK in a fresh Python process with no farm at
           all: its client's transport waits L and answers the two replies from memory (no
           gateway, tokenizer, Redis or worker). What the SDK alone costs per call, and so the
           best ratio any gateway could reach with this harness in one process (scale only).

Three figures, each side by side:

1. cost    worker CPU ms per model call (utime + stime from /proc/PID/stat) at --cost-concurrency
           and a short --cost-latency, in two batches of one worker: `first` (a fresh process: its
           connections, caches and the SDK's lazy imports) and `warm` (the same process again);
           beside it, what the harness's openai SDK spends building each request (its params
           transform, timed in the bench's process), a cost the SDK pays with or without a gateway.
2. scale   --concurrency rollouts in flight in ONE worker against a stub answering after --latency L
           per call: rollouts/s against Little's law, C / (2 L), and their ratio (target >= 0.90),
           over --rollouts (default 3 waves of C), in a fresh worker (a first run).
3. fds     /proc/PID/fd of that worker while they are in flight, minus its count when idle, per
           rollout in flight (the stub's unanswered requests, sampled at the same moment).

    python bench/gateway.py [--concurrency 2048] [--latency 10] [--rollouts 6144] [--quick]

A rollout that does not make exactly 2 calls in 1 trace segment is flagged (calls/seg), since
the figures beside it would then measure other work. The stub, the worker and Redis share this
machine's CPUs. The run uses its own namespace on
--redis-url and deletes it; the JSON line at the end holds every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import answers, delete_namespace  # noqa: E402
from bench.procstat import cpu_s, peak_rss_mb  # noqa: E402
from workers.policy.stub import StubProcess, weather_rows, weather_script  # noqa: E402
from workers.supervise.stack import policy_env  # noqa: E402

CALLS = 2  # model calls per rollout on both sides: the tool call, then the answer
HARNESS = "examples.harnesses.plain_sdk:run"
SIDES = {"native": "single_tool_call", "harness": "gateway_sdk"}
COMPLETIONS = "POST /v1/completions"
TARGET_RATIO = 0.90


def fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


class FdSamples:
    """A thread that reads the worker's open descriptors and the stub's unanswered requests together,
    every `every_s`: what is open per rollout in flight, wherever the round is."""

    def __init__(self, pid: int, stub: StubProcess, every_s: float = 0.5):
        self.pid, self.stub, self.every_s = pid, stub, every_s
        self.samples: list[tuple[int, int]] = []  # (descriptors, rollouts in flight)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                pending = int(self.stub.stats().get("pending", 0))
            except OSError:
                continue
            self.samples.append((fds(self.pid), pending))

    def in_flight(self) -> tuple[int, int]:
        """(descriptors, rollouts in flight) at the fullest moment: the median count of the samples
        that saw the most rollouts in flight."""
        if not self.samples:
            return 0, 0
        top = max(p for _, p in self.samples)
        full = sorted(f for f, p in self.samples if p == top)
        return full[len(full) // 2], top

    def __enter__(self) -> "FdSamples":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


# -- one worker, one or more batches -------------------------------------------------------------
async def worker_batches(
    url: str, stub: StubProcess, env: dict, config: Path, agent: str, concurrency: int, batches: list[int], tmp: Path
) -> dict:
    """A fresh `farm worker --processes 1 --concurrency C` for `agent`, through each batch of rollouts in turn."""
    from farm.client import FarmClient
    from farm.settings import load_settings
    from workers.supervise.stack import LocalStack, Pool

    namespace = f"bench-{uuid.uuid4().hex[:12]}"
    settings = load_settings(config, env={}, overrides={"redis_url": url, "namespace": namespace})
    stack = LocalStack(
        settings,
        [Pool(agent, 1, concurrency, label=f"{agent}-c{concurrency}")],
        env={**env, "FARM_CONFIG": str(config)},
        log_dir=tmp,
        cwd=ROOT,
        stop_timeout_s=30.0,
    )
    out: dict = {"batches": []}
    try:
        with stack:
            pid = stack.procs[0].pid
            await asyncio.sleep(1.0)  # past the heartbeat: the agent's setup (the gateway's server) done
            out["idle_fds"] = fds(pid)
            client = FarmClient(settings)
            try:
                for n in batches:
                    tasks = [client.task(run_id="bench", agent=agent, row=r) for r in weather_rows(n)]
                    calls0 = stub.stats().get(COMPLETIONS, 0)
                    cpu0, start, epoch0 = cpu_s(pid), time.perf_counter(), time.time()
                    with FdSamples(pid, stub) as sampled:
                        _, got = await asyncio.gather(client.submit(tasks), client.collect(tasks, timeout_s=3600))
                        wall = time.perf_counter() - start
                    cpu = cpu_s(pid) - cpu0
                    if stack.exited() is not None:
                        raise SystemExit(f"the {agent} worker exited early; its log is in {tmp}")
                    ok = [r for r in got.values() if r.ok]
                    rewards = [r.reward for r in ok if r.reward is not None]
                    segments = [r.metrics["segments"] for r in ok if "segments" in r.metrics]
                    fd_then, in_flight = sampled.in_flight()
                    out["batches"].append(
                        {
                            "n": n,
                            "ok": len(ok),
                            "wall_s": wall,
                            "cpu_s": cpu,
                            "calls": stub.stats().get(COMPLETIONS, 0) - calls0,
                            "failures": dict(Counter(r.error.kind for r in got.values() if not r.ok)),
                            "mean_reward": sum(rewards) / len(rewards) if rewards else None,
                            "segments_per_rollout": sum(segments) / len(segments) if segments else None,
                            "p50_s": pct([r.timings.total_s for r in ok], 0.5),
                            "fds": fd_then,
                            "in_flight": in_flight,
                            "peak_fds": max((f for f, _ in sampled.samples), default=0),
                            "waves": waves(tasks, got, epoch0, concurrency),
                        }
                    )
                out["rss_mb"] = peak_rss_mb(pid)
            finally:
                await client.aclose()
    finally:
        delete_namespace(url, namespace)
    return out


def waves(tasks: list, got: dict, epoch0: float, concurrency: int) -> list[dict]:
    """When each wave of C rollouts (in the order they were picked up) was picked up and finished,
    seconds after the submit began, [first, median, last]: where a round's time beyond waves x 2 L went."""
    spans = sorted(
        (
            t.created_at + r.timings.queue_wait_s - epoch0,
            t.created_at + r.timings.queue_wait_s + r.timings.total_s - epoch0,
        )
        for t in tasks
        if (r := got.get(t.task_id)) is not None and r.ok
    )
    out = []
    for i in range(0, len(spans), concurrency):
        part = spans[i : i + concurrency]
        picks, ends = sorted(p for p, _ in part), sorted(e for _, e in part)
        out.append(
            {
                "picked": [round(x, 2) for x in (picks[0], pct(picks, 0.5), picks[-1])],
                "finished": [round(x, 2) for x in (ends[0], pct(ends, 0.5), ends[-1])],
            }
        )
    return out


def figures(batch: dict, idle_fds: int, concurrency: int, latency: float) -> dict:
    rate = batch["ok"] / batch["wall_s"]
    ideal = concurrency / (CALLS * latency)
    extra = batch["fds"] - idle_fds
    return {
        **batch,
        "cpu_ms_per_call": 1000 * batch["cpu_s"] / max(1, batch["calls"]),
        "cpu_ms_per_rollout": 1000 * batch["cpu_s"] / max(1, batch["ok"]),
        "cores": batch["cpu_s"] / batch["wall_s"],
        "calls_per_rollout": batch["calls"] / max(1, batch["n"]),
        "rollouts_per_s": rate,
        "little_per_s": ideal,
        "ratio": rate / ideal,
        "idle_fds": idle_fds,
        "fds_per_rollout": extra / batch["in_flight"] if batch["in_flight"] else float("nan"),
    }


def fails(r: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(r["failures"].items())) or "0"


# -- the SDK alone: the ceiling of any gateway for this harness in one process -------------------
def sdk_alone(concurrency: int, latency: float, rollouts: int) -> dict:
    """The harness and its SDK in a fresh process whose client's transport waits `latency` and
    answers from memory: rollouts/s and CPU with nothing of the farm in the way."""
    import subprocess

    argv = [sys.executable, __file__, "--sdk-alone-child", json.dumps([concurrency, latency, rollouts])]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=ROOT, timeout=3600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _chat_json(message: dict, finish: str) -> bytes:
    choice = {"index": 0, "finish_reason": finish, "message": {"role": "assistant", **message}}
    usage = {"prompt_tokens": 150, "completion_tokens": 20, "total_tokens": 170}
    body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "stub", "choices": [choice]}
    return json.dumps({**body, "usage": usage}).encode()


async def _sdk_alone_child(concurrency: int, latency: float, rollouts: int) -> dict:
    import httpx2
    from openai import AsyncOpenAI

    from envs.single_tool_call import SingleToolCall
    from examples.harnesses.plain_sdk import run as harness
    from workers.policy.chat import chat_tools, input_messages

    call = {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    replies = (
        _chat_json({"content": None, "tool_calls": [call]}, "tool_calls"),
        _chat_json({"content": "Sunny."}, "stop"),
    )
    calls = 0

    class Canned(httpx2.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            nonlocal calls
            raw = await request.aread()
            calls += 1
            await asyncio.sleep(latency)
            reply = replies[1] if b"tool_call_id" in raw else replies[0]
            return httpx2.Response(200, headers={"content-type": "application/json"}, content=reply, request=request)

    class Task:
        messages = input_messages(weather_rows(1)[0]["responses_create_params"])
        tools = chat_tools([t.schema() for t in SingleToolCall().tools()])
        model, limits = "stub", {"max_steps": 4}

        async def call_tool(self, name: str, arguments: str) -> str:
            return json.dumps({"city": "Paris", "conditions": "sunny"})

    http = httpx2.AsyncClient(transport=Canned(), timeout=httpx2.Timeout(None))
    slots = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with slots:
            client = AsyncOpenAI(base_url="http://sdk-alone/v1", api_key="k", max_retries=0, http_client=http)
            await harness(client, Task())

    cpu0, start = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one() for _ in range(rollouts)))
    wall = time.perf_counter() - start
    return {"n": rollouts, "ok": rollouts, "calls": calls, "wall_s": wall, "cpu_s": time.process_time() - cpu0}


# -- the run -------------------------------------------------------------------------------------
def sdk_transform_ms(repeat: int = 1000) -> list[float]:
    """CPU ms per call of the openai SDK's own request building (async_maybe_transform of the params)
    for the plain-SDK harness's two bodies, in this process: the part of the harness side's cost that
    its SDK pays wherever it runs, gateway or not."""
    from openai._utils._transform import async_maybe_transform
    from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming as Params

    from envs.single_tool_call import SingleToolCall
    from workers.policy.chat import chat_tools, input_messages

    messages = input_messages(weather_rows(1)[0]["responses_create_params"])
    tools = chat_tools([t.schema() for t in SingleToolCall().tools()])
    call = {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    result = {"role": "tool", "tool_call_id": "call_0", "content": '{"city": "Paris", "conditions": "sunny"}'}
    second = [*messages, {"role": "assistant", "tool_calls": [call]}, result]
    bodies = [{"model": "stub", "messages": m, "tools": tools} for m in (messages, second)]

    async def each() -> list[float]:
        out = []
        for body in bodies:
            await async_maybe_transform(body, Params)  # its caches filled
            t0 = time.process_time()
            for _ in range(repeat):
                await async_maybe_transform(body, Params)
            out.append(1000 * (time.process_time() - t0) / repeat)
        return out

    return asyncio.run(each())


def run(args: argparse.Namespace) -> dict:
    from workers.policy.chat import ChatTokenizer
    from workers.policy.serving import default_cache, prepare_model

    model_dir = prepare_model(default_cache())
    script = weather_script(ChatTokenizer(str(model_dir)))
    out: dict = {"cost": {}, "scale": {}, "sdk_transform_ms": sdk_transform_ms()}
    with tempfile.TemporaryDirectory(prefix="farm-bench-gateway-") as tmp_name:
        tmp = Path(tmp_name)
        config = tmp / "farm.yaml"
        config.write_text(f"agents:\n  {SIDES['harness']}:\n    harness: {HARNESS}\n    env: single_tool_call\n")
        stub = StubProcess(script, latency_s=args.cost_latency, workdir=tmp).start()
        env = {"FARM_LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT), **policy_env(stub.url, "stub", model_dir)}
        try:
            for side, agent in SIDES.items():
                batches = [args.cost_rollouts, args.cost_rollouts]
                res = asyncio.run(
                    worker_batches(args.redis_url, stub, env, config, agent, args.cost_concurrency, batches, tmp)
                )
                out["cost"][side] = [
                    figures(b, res["idle_fds"], args.cost_concurrency, args.cost_latency) for b in res["batches"]
                ]
            stub.control(latency_s=args.latency)
            for side, agent in SIDES.items():
                res = asyncio.run(
                    worker_batches(args.redis_url, stub, env, config, agent, args.concurrency, [args.rollouts], tmp)
                )
                out["scale"][side] = {
                    **figures(res["batches"][0], res["idle_fds"], args.concurrency, args.latency),
                    "rss_mb": res["rss_mb"],
                }
            alone = sdk_alone(args.concurrency, args.latency, args.rollouts)
            rate = alone["ok"] / alone["wall_s"]
            out["scale"]["sdk alone"] = {
                **alone,
                "rollouts_per_s": rate,
                "ratio": rate / (args.concurrency / (CALLS * args.latency)),
                "cpu_ms_per_call": 1000 * alone["cpu_s"] / max(1, alone["calls"]),
                "calls_per_rollout": alone["calls"] / alone["n"],
            }
        finally:
            stub.stop()
    return out


def per_rollout(r: dict) -> str:
    """Model calls and (harness) trace segments per rollout: 2 and 1, or the figures beside them mislead."""
    seg = "-" if r["segments_per_rollout"] is None else f"{r['segments_per_rollout']:.2f}"
    return f"{r['calls_per_rollout']:.2f}/{seg}"


def report(out: dict, args: argparse.Namespace, started: float) -> None:
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(
        f"machine: {os.cpu_count()} CPUs (nproc), Python {platform.python_version()}; "
        f"date {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; the stub, the worker and Redis share the CPUs"
    )
    print(
        f"sides: native = agent single_tool_call (the farm's loop); harness = {HARNESS} through the gateway, "
        "env single_tool_call; one worker process each; the stub answers a tool call, then an answer"
    )
    print()
    print(
        f"1. cost: C {args.cost_concurrency}, L {args.cost_latency:g} s, {args.cost_rollouts} rollouts a batch; "
        "first = a fresh worker, warm = its second batch"
    )
    print(
        f"{'side':<8} {'batch':<6} {'calls':>6} {'calls/seg':>9} {'wall s':>7} {'rollout/s':>9} "
        f"{'cpu ms/call':>11} {'cpu ms/r':>8} {'cores':>5} {'reward':>6}  failures"
    )
    for side, batches in out["cost"].items():
        for label, r in zip(("first", "warm"), batches):
            reward = "" if r["mean_reward"] is None else f"{r['mean_reward']:.2f}"
            print(
                f"{side:<8} {label:<6} {r['calls']:>6} {per_rollout(r):>9} {r['wall_s']:>7.1f} "
                f"{r['rollouts_per_s']:>9.1f} {r['cpu_ms_per_call']:>11.3f} {r['cpu_ms_per_rollout']:>8.3f} "
                f"{r['cores']:>5.2f} {reward:>6}  {fails(r)}"
            )
    ratios = [
        f"{label} {h['cpu_ms_per_call'] / n['cpu_ms_per_call']:.2f}x "
        f"(+{h['cpu_ms_per_call'] - n['cpu_ms_per_call']:.3f} ms)"
        for label, n, h in zip(("first", "warm"), out["cost"]["native"], out["cost"]["harness"])
    ]
    first, second = out["sdk_transform_ms"]
    print(f"harness / native cpu ms per call: {', '.join(ratios)}")
    print(
        f"the openai SDK's request building alone (async_maybe_transform of the params, timed in the bench's "
        f"process): {first:.3f} ms (call 1), {second:.3f} ms (call 2), paid by the harness with or without a gateway"
    )
    print()
    print(
        f"2. scale and 3. fds: C {args.concurrency} in one worker, L {args.latency:g} s a call, {args.rollouts} "
        f"rollouts ({args.rollouts / args.concurrency:g} waves), a fresh worker each (first run); "
        f"Little = C / ({CALLS} x L)"
    )
    print(
        f"{'side':<8} {'calls/seg':>9} {'rollout/s':>9} {'Little':>7} {'ratio':>6} {'target':>6} {'p50 s':>6} "
        f"{'cpu ms/call':>11} {'cores':>5} {'rss MB':>6} {'idle fd':>7} {'fd then':>7} {'in flight':>9} "
        f"{'fd/rollout':>10}  failures"
    )
    alone = out["scale"].pop("sdk alone")
    for side, r in out["scale"].items():
        target = f">={TARGET_RATIO:.2f}" if side == "harness" else "ref"
        print(
            f"{side:<8} {per_rollout(r):>9} {r['rollouts_per_s']:>9.1f} {r['little_per_s']:>7.1f} {r['ratio']:>6.3f} "
            f"{target:>6} {r['p50_s']:>6.2f} {r['cpu_ms_per_call']:>11.3f} {r['cores']:>5.2f} {r['rss_mb']:>6.0f} "
            f"{r['idle_fds']:>7} {r['fds']:>7} {r['in_flight']:>9} {r['fds_per_rollout']:>10.2f}  {fails(r)}"
        )
    for side, r in out["scale"].items():
        spans = "; ".join(
            f"{i} picked by {w['picked'][2]:.1f}, finished {'/'.join(f'{x:.1f}' for x in w['finished'])}"
            for i, w in enumerate(r["waves"], 1)
        )
        print(f"{side} waves, s after submit (finished first/median/last; ideal wave k ends at k x 2 L): {spans}")
    harness = out["scale"]["harness"]
    print(
        f"sdk alone (the harness and its openai SDK, no farm, replies from memory after L): "
        f"{alone['rollouts_per_s']:.1f} "
        f"rollouts/s = {alone['ratio']:.3f} of Little, {alone['cpu_ms_per_call']:.3f} cpu ms/call, "
        f"{alone['cpu_s'] / alone['wall_s']:.2f} cores: the ceiling of any gateway for this harness in one process; "
        f"the harness side reached {harness['ratio'] / alone['ratio']:.3f} of it"
    )
    out["scale"]["sdk alone"] = alone
    print(
        "calls/seg: model calls per rollout (counted at the stub) / trace segments per harness rollout; cpu: the "
        "worker's utime + stime; cores: the same per second of wall; fd then: the worker's descriptors while "
        "`in flight` rollouts (the stub's unanswered requests) were; fd/rollout = (fd then - idle fd) / in flight"
    )
    scale = {k: [v] for k, v in out["scale"].items() if k != "sdk alone"}
    odd = [
        f"{part} {side}"
        for part, rows in (("cost", out["cost"]), ("scale", scale))
        for side, batches in rows.items()
        for r in batches
        if r["calls_per_rollout"] != CALLS or r["segments_per_rollout"] not in (None, 1.0)
    ]
    if odd:
        print(f"WARNING: not {CALLS} calls in 1 segment per rollout in {', '.join(odd)}: those rows measure other work")
    print(f"runtime {time.monotonic() - started:.0f} s; load at end {open('/proc/loadavg').read().strip()}")


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--concurrency", type=int, default=2048, help="scale: rollouts in flight in the one worker")
    p.add_argument("--latency", type=float, default=10.0, help="scale: seconds the stub takes per model call")
    p.add_argument("--rollouts", type=int, default=0, help="scale: rollouts a side (default 3 waves: 3 x concurrency)")
    p.add_argument("--cost-concurrency", type=int, default=256)
    p.add_argument("--cost-latency", type=float, default=0.05)
    p.add_argument("--cost-rollouts", type=int, default=1024, help="cost: rollouts per batch (two batches a side)")
    p.add_argument("--quick", action="store_true", help="small sizes for a smoke run (overrides the sizes)")
    p.add_argument("--sdk-alone-child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.sdk_alone_child:
        print(json.dumps(asyncio.run(_sdk_alone_child(*json.loads(args.sdk_alone_child)))))
        return 0
    if args.quick:
        args.concurrency, args.latency, args.rollouts = 64, 1.0, 192
        args.cost_concurrency, args.cost_rollouts = 32, 64
    args.rollouts = args.rollouts or 3 * args.concurrency
    if not answers(args.redis_url):
        raise SystemExit(f"no Redis answers at {args.redis_url}")
    started = time.monotonic()
    out = run(args)
    report(out, args, started)
    print(json.dumps({"command": " ".join(sys.argv), "nproc": os.cpu_count(), **out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
