"""What streaming completions costs the hot path (policy_stream, which partial rollouts need).

An interrupted turn keeps the tokens generated so far only when the tokens client reads them as
the server sends them (`"stream": true`: one server-sent event per token) instead of one JSON body
at the end. This prints, side by side in one run, the tokens client (workers/policy/tokens.py
PolicyClient) with `stream` off and on:

  stub    against workers/policy/stub (every reply 40 tokens, --latency median, fixed), C loops
          each sending --requests requests in turn: completions/s and the client process's CPU
          per completion (what the worker pays: parsing 40 events instead of one body);
  vllm    (--vllm) against the embedded vLLM on the CPU (SmolLM2), C loops of --max-tokens
          greedy-free completions with `ignore_eos`: generated tokens/s, stream off and on.

Rounds alternate off, on, on, off (ABBA), so a drift in machine load reaches both alike.

    python bench/stream.py [--concurrency 64] [--requests 20] [--latency 0.05] [--vllm]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workers.policy.rotation import Session  # noqa: E402
from workers.policy.stub import StubProcess  # noqa: E402
from workers.policy.stub.model import Script  # noqa: E402
from workers.policy.tokens import PolicyClient, PolicyConfig, Sink  # noqa: E402

REPLY = list(range(1000, 1039)) + [2]  # 40 ids, the last one the stub model's EOS


def cpu_s() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


async def one_round(url: str, model: str, stream: bool, loops: int, requests: int, body: dict) -> dict:
    client = PolicyClient(PolicyConfig(urls=[url], model=model, stream=stream, max_connections=loops))
    prompt = list(range(10, 60))
    tokens = 0

    async def loop() -> None:
        nonlocal tokens
        for _ in range(requests):
            sink = Sink() if stream else None
            c = await client.complete(prompt, dict(body), Session(), sink=sink)
            tokens += len(c.ids)

    await client.complete(prompt, dict(body), Session(), sink=Sink() if stream else None)  # connect
    t0, c0 = time.perf_counter(), cpu_s()
    await asyncio.gather(*(loop() for _ in range(loops)))
    wall, cpu = time.perf_counter() - t0, cpu_s() - c0
    await client.aclose()
    n = loops * requests
    return {
        "completions": n,
        "tokens": tokens,
        "wall_s": wall,
        "per_s": n / wall,
        "tokens_per_s": tokens / wall,
        "cpu_us_per_completion": 1e6 * cpu / n,
    }


async def abba(url: str, model: str, loops: int, requests: int, body: dict, rounds: int) -> dict[str, dict]:
    out: dict[str, list[dict]] = {"off": [], "on": []}
    order = ["off", "on", "on", "off"] * max(1, rounds // 2)
    for side in order:
        out[side].append(await one_round(url, model, side == "on", loops, requests, body))
    total = {}
    for side, rs in out.items():
        n = sum(r["completions"] for r in rs)
        wall = sum(r["wall_s"] for r in rs)
        total[side] = {
            "completions": n,
            "per_s": n / wall,
            "tokens_per_s": sum(r["tokens"] for r in rs) / wall,
            "cpu_us_per_completion": sum(r["cpu_us_per_completion"] * r["completions"] for r in rs) / n,
        }
    return total


def show(name: str, r: dict[str, dict]) -> None:
    off, on = r["off"], r["on"]
    print(f"{name}: {'':<10} {'stream off':>12} {'stream on':>12} {'on / off':>9}")
    for key, label in (
        ("per_s", "completions/s"),
        ("tokens_per_s", "tokens/s"),
        ("cpu_us_per_completion", "client CPU us/completion"),
    ):
        print(f"  {label:<26} {off[key]:>12.1f} {on[key]:>12.1f} {on[key] / off[key]:>9.2f}")


async def main_async(a: argparse.Namespace) -> dict:
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        stub = StubProcess(Script(token_replies=[REPLY], model="stub"), latency_s=a.latency, workdir=Path(tmp)).start()
        try:
            results["stub"] = await abba(stub.url, "stub", a.concurrency, a.requests, {"max_tokens": 64}, a.rounds)
        finally:
            stub.stop()
    show(
        f"stub ({a.concurrency} loops x {a.requests} requests, {len(REPLY)}-token replies, latency {a.latency}s)",
        results["stub"],
    )
    if a.vllm:
        from workers.policy.serving import PolicyServer, default_cache, prepare_model

        server = PolicyServer(prepare_model(default_cache()), max_model_len=1024).start(timeout_s=600)
        try:
            body = {"max_tokens": a.max_tokens, "ignore_eos": True, "temperature": 1.0}
            results["vllm"] = await abba(server.url, server.served_model_name, a.vllm_concurrency, 4, body, a.rounds)
        finally:
            server.stop()
        show(f"vllm ({a.vllm_concurrency} loops x 4 requests, {a.max_tokens} tokens each)", results["vllm"])
    return results


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--requests", type=int, default=20, help="per loop, against the stub")
    p.add_argument("--latency", type=float, default=0.05)
    p.add_argument("--rounds", type=int, default=2, help="rounds per side (ABBA order)")
    p.add_argument("--vllm", action="store_true", help="also against the embedded vLLM")
    p.add_argument("--vllm-concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / f"stream-{int(time.time())}.json")
    a = p.parse_args(argv)
    print(
        f"$ {' '.join([Path(sys.executable).name, *sys.argv])}  ({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f})"
    )
    results = asyncio.run(main_async(a))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(results, indent=2))
    print(f"figures written to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
