"""Adaptive load: do per-replica in-flight limits read from /metrics beat a fixed concurrency?

R policy-stub replicas (workers/policy/stub) run in engine mode: continuous batching in decode
steps of `--step-s + --step-s-per-seq x running` seconds (throughput rises with the batch), at
most `--max-num-seqs` running, a KV cache of `--kv-tokens` per replica, and recompute preemption
when it is full (a preempted request prefills its prompt and the tokens it had generated again,
at `--prefill-s-per-token`). The load is the real policy client (workers/policy/tokens.py
PolicyClient, routing "group", G samples per group) driven by N concurrent loops in this
process, each sending one completion (a `--prompt-tokens` prompt, a `--reply-tokens` reply)
after another. Two arms per load, each on fresh replicas and a fresh client:

  fixed     adaptive_load off: every loop's request is sent at once (today's behaviour);
  adaptive  adaptive_load on: each replica's in-flight limit follows its /metrics
            (workers/policy/load.py), requests over it wait for a slot.

Two loads: `overload` (--overload loops, more than the KV caches hold: fixed preempts) and
`normal` (--normal loops, which fit). Measured after --warmup s for --measure s: completions/s
and completion tokens/s delivered to the client, the replicas' preemptions, tokens they
generated (each decoded once: a recompute prefills them again, it does not count them again),
and the limits each replica ended at. `--sweep 8,16,...` first runs one replica under fixed
loads of those sizes: where its throughput peaks, and how much overload takes from the peak. Targets: adaptive >= 1.3x
fixed tokens/s under overload, within 5% of it without.

    python bench/adaptive.py [--replicas 4] [--overload 256] [--normal 32] [--measure 30]

Wrap it in `flock /tmp/farm-quiet` so no other benchmark shares the CPUs. The figures go to
bench/out/adaptive-<time>.json too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
import zlib
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workers.policy.rotation import Session  # noqa: E402
from workers.policy.stub import Script, StubProcess  # noqa: E402
from workers.policy.tokens import PolicyClient, PolicyConfig  # noqa: E402

ARMS = ("fixed", "adaptive")
TARGETS = {"overload": 1.3, "normal": 0.95}
EOS = 2


def engine_options(args: argparse.Namespace) -> dict:
    return {
        "engine": True,
        "step_s": args.step_s,
        "step_s_per_seq": args.step_s_per_seq,
        "max_num_seqs": args.max_num_seqs,
        "kv_capacity_tokens": args.kv_tokens,
        "prefill_s_per_token": args.prefill_s_per_token,
    }


async def arm(args: argparse.Namespace, adaptive: bool, loops: int, tmp: Path, replicas: int = 0) -> dict:
    """One arm: fresh replicas, a fresh client, `loops` loops; the figures of its measured window."""
    script = Script(token_replies=[[1000 + i for i in range(args.reply_tokens - 1)] + [EOS]], model="m")
    n = replicas or args.replicas
    stubs = [StubProcess(script, latency_s=0.0, workdir=tmp, **engine_options(args)) for _ in range(n)]
    for s in stubs:
        s.start()
    client = PolicyClient(
        PolicyConfig(
            urls=[s.url for s in stubs],
            model="m",
            max_connections=loops,
            adaptive_load=adaptive,
            load_poll_s=args.poll_s,
            retry_budget_s=600.0,
        )
    )
    window = {"open": False, "completions": 0, "tokens": 0}
    stop = asyncio.Event()

    async def loop(i: int) -> None:
        k = 0
        while not stop.is_set():
            group = f"{i // args.generations}-{k}"
            prompt = [10_000 + (zlib.crc32(group.encode()) + j) % 20_000 for j in range(args.prompt_tokens)]
            session = Session(group=group, key=f"{i}-{k}")
            try:
                c = await client.complete(prompt, {"max_tokens": args.reply_tokens}, session)
            finally:
                session.end()
            if window["open"]:
                window["completions"] += 1
                window["tokens"] += len(c.ids)
            k += 1

    try:
        tasks = [asyncio.create_task(loop(i)) for i in range(loops)]
        await asyncio.sleep(args.warmup)
        before = [s.stats() for s in stubs]
        window["open"] = True
        t0 = time.monotonic()
        await asyncio.sleep(args.measure)
        window["open"] = False
        elapsed = time.monotonic() - t0
        after = [s.stats() for s in stubs]
        caps = [r.cap for r in client.replicas]
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await client.aclose()
        for s in stubs:
            s.stop()
    generated = sum(a["tokens_generated"] - b["tokens_generated"] for a, b in zip(after, before))
    return {
        "loops": loops,
        "completions_per_s": window["completions"] / elapsed,
        "tokens_per_s": window["tokens"] / elapsed,
        "preemptions": sum(a["engine"]["preemptions"] - b["engine"]["preemptions"] for a, b in zip(after, before)),
        "generated_tokens_per_s": generated / elapsed,
        "limits_at_end": caps,
        "running_at_end": [a["engine"]["running"] for a in after],
        "waiting_at_end": [a["engine"]["waiting"] for a in after],
    }


async def sweep(args: argparse.Namespace, tmp: Path) -> list[dict]:
    """One replica under a fixed load of each size: where its throughput peaks, and what overload costs."""
    points = []
    for loops in args.sweep:
        res = await arm(args, False, loops, tmp, replicas=1)
        points.append(res)
        print(
            f"  sweep    1 replica, {loops:3d} in flight: generated {res['generated_tokens_per_s']:6.0f} tokens/s, "
            f"{res['preemptions']:4d} preemptions",
            flush=True,
        )
    return points


async def run(args: argparse.Namespace, tmp: Path) -> dict:
    loads = {"overload": args.overload, "normal": args.normal}
    results: dict[str, dict] = {}
    if args.sweep:
        results["sweep"] = {"points": await sweep(args, tmp)}
        if args.sweep_only:
            return results
    for load, loops in loads.items():
        results[load] = {}
        for name in ARMS:
            res = await arm(args, name == "adaptive", loops, tmp)
            results[load][name] = res
            print(
                f"  {load:<8} {name:<8} {loops} loops: {res['tokens_per_s']:8.0f} tokens/s "
                f"{res['completions_per_s']:6.2f} completions/s, {res['preemptions']:5d} preemptions, "
                f"generated {res['generated_tokens_per_s']:6.0f} tokens/s, limits {res['limits_at_end']}",
                flush=True,
            )
        fixed, adaptive = results[load]["fixed"], results[load]["adaptive"]
        ratio = adaptive["tokens_per_s"] / max(fixed["tokens_per_s"], 1e-9)
        generated = adaptive["generated_tokens_per_s"] / max(fixed["generated_tokens_per_s"], 1e-9)
        results[load] |= {"ratio": ratio, "generated_ratio": generated, "target": TARGETS[load]}
        results[load]["met"] = ratio >= TARGETS[load]
        print(
            f"  {load}: adaptive / fixed = {ratio:.2f}x delivered tokens/s, {generated:.2f}x generated "
            f"(target >= {TARGETS[load]}x)",
            flush=True,
        )
    return results


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--overload", type=int, default=256, help="loops of the load that overloads the KV caches")
    p.add_argument("--normal", type=int, default=32, help="loops of the load that fits them")
    p.add_argument("--generations", type=int, default=8, help="G: loops sharing a group at a time")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--reply-tokens", type=int, default=512)
    p.add_argument("--kv-tokens", type=int, default=16384, help="each replica's KV cache, tokens")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--step-s", type=float, default=0.004, help="a decode step's fixed seconds")
    p.add_argument("--step-s-per-seq", type=float, default=0.0002, help="a decode step's seconds per running request")
    p.add_argument("--prefill-s-per-token", type=float, default=1e-4, help="prefill seconds per token")
    p.add_argument("--poll-s", type=float, default=0.5, help="the adaptive arm's /metrics poll interval")
    p.add_argument("--warmup", type=float, default=20.0, help="seconds before the measured window")
    p.add_argument("--measure", type=float, default=30.0, help="the measured window, seconds")
    p.add_argument(
        "--sweep",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[],
        help="first, one replica under fixed loads of these sizes (comma-separated), e.g. 8,16,20,24,32,64",
    )
    p.add_argument("--sweep-only", action="store_true", help="only the sweep")
    p.add_argument("--out", type=Path, help="JSON of the figures (default bench/out/adaptive-<time>.json)")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    import tempfile

    args = parser().parse_args(argv)
    started = time.monotonic()
    command = "python bench/adaptive.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(f"$ {command.strip()}")
    print(
        f"  {args.replicas} stub replicas, engine mode: KV {args.kv_tokens:,} tokens, max_num_seqs "
        f"{args.max_num_seqs}, step {args.step_s * 1e3:g} ms + {args.step_s_per_seq * 1e3:g} ms/seq, prefill "
        f"{args.prefill_s_per_token * 1e6:g} us/token; prompt {args.prompt_tokens}, reply {args.reply_tokens} tokens",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="farm-bench-adaptive-") as tmp:
        results = asyncio.run(run(args, Path(tmp)))
    setup = {
        "command": command.strip(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_at_end": os.getloadavg(),
        "runtime_s": time.monotonic() - started,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    path = args.out or ROOT / "bench" / "out" / f"adaptive-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"setup": setup, "results": results}, indent=2))
    print(f"wrote {path}; runtime {setup['runtime_s']:.0f}s, load average at end {setup['load_at_end']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
