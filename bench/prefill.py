"""Prefill: does group-affine routing make policy replicas prefill a GRPO group's prompt once?

The real `farm worker` (tokens backend, the SmolLM2 tokenizer and chat template) runs GRPO-shaped
load, B groups x G samples, against R policy-stub replicas (workers/policy/stub) with the stub's
prefix-cache model on (`prefix_cache_tokens` per replica, an LRU over 16-token blocks like vLLM's
automatic prefix caching) and `prefill_s_per_token` charged on every uncached prompt token. The
same tasks run twice in one run, with fresh (cold) replicas and a fresh worker each time:

  least_outstanding  FARM_POLICY_ROUTING=least_outstanding, today's routing (the reference):
                     each new rollout to the replica with the fewest requests outstanding;
  group              FARM_POLICY_ROUTING=group: a group's G samples start on one replica.

Either way a rollout keeps its replica for all its turns. Prompts: a long system prefix shared by
every task (--system-words), then a per-group document and question (--doc-words): groups differ
only in the user message, as they often do. Each rollout makes three model calls through
`single_tool_call` and the stub's scripted replies: get_weather for Paris, get_weather for Lyon
(a second lookup: the env's max_steps is 3 and its verifier only asks that Paris was looked up),
then an answer; so every rollout is ok with reward 1, and its second and third prompts extend the
first by the replies and the tool results, as a real multi-turn session's do. Each reply starts
with --filler-tokens random word ids (24), so the G samples of a group differ after the shared
prompt, as sampled completions do: with identical replies a sample's next turn would be served
from another sample's cached completion, and group routing would look better than it is.

Printed side by side: prefilled (uncached) prompt tokens over all replicas and the ratio
least_outstanding / group (target >= 1.5), the cache hit rate (cached / prompt tokens), rollouts/s
(target: group not lower), the busiest / idlest replica's mean in-flight requests (sampled from
each stub's `pending` every --sample-every s while rollouts run; target <= 1.5) and total
requests, the replicas a group's samples started on, and rollouts ok.

    python bench/prefill.py [--groups 64] [--generations 8] [--replicas 4] [--rounds 2]

--rounds N runs both modes N times, alternating which goes first. The stubs, the worker, Redis
and this process share the machine's CPUs (the load average is printed). The run uses its own
namespaces on --redis-url and deletes them; the figures go to bench/out/prefill-<time>.json too.
bench/prefix_vllm.py runs the same workload against real vLLM replicas.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import WorkerPool, answers, delete_namespace  # noqa: E402
from workers.policy.stub import Script, StubProcess  # noqa: E402
from workers.supervise.stack import policy_env  # noqa: E402

AGENT = "single_tool_call"
QUESTION = "Given the document above, what is the weather in Paris? Answer in one short sentence."
MODES = ("least_outstanding", "group")
TARGETS = {"prefill_ratio": 1.5, "in_flight_ratio": 1.5}
CALLS = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>',
    "Paris is sunny today, and warmer than Lyon.",
]
WORDS = (
    "the report market river station signal policy quarter revenue north south east west field team "
    "account ledger harbour freight schedule weather forecast index volume margin supplier contract "
    "region office audit review summary figure table chapter section clause term notice"
).split()


# -- the workload ----------------------------------------------------------------------------------
def text(rng: random.Random, words: int) -> str:
    """Plausible filler: sentences of common words and figures (about one SmolLM2 token a word)."""
    out, n = [], 0
    while n < words:
        k = rng.randint(8, 16)
        sentence = " ".join(rng.choice(WORDS) if rng.random() > 0.1 else str(rng.randint(2, 999)) for _ in range(k))
        out.append(sentence.capitalize() + ".")
        n += k
    return " ".join(out)


def group_rows(groups: int, system_words: int, doc_words: int, seed: int = 0) -> list[dict]:
    """One row per group: the shared system prefix, then the group's own document and question."""
    rng = random.Random(seed)
    system = (
        "You are a weather assistant for a logistics company. Use the get_weather tool to look up the "
        "weather before answering. House rules follow.\n\n" + text(rng, system_words)
    )
    rows = []
    for g in range(groups):
        doc = text(rng, doc_words)
        user = f"Document {g}:\n{doc}\n\n{QUESTION}"
        rows.append(
            {
                "responses_create_params": {
                    "input": [{"role": "system", "content": system}, {"role": "user", "content": user}]
                },
                "agent_ref": {"type": "responses_api_agents", "name": AGENT},
                "expected_city": "Paris",
            }
        )
    return rows


def three_call_script(tok) -> Script:
    """The stub's replies: get_weather(Paris), get_weather(Lyon), the answer, each ending in EOS, and
    plain words as the filler each reply starts with (--filler-tokens), so that samples differ."""
    return Script(
        token_replies=[tok.encode(c) + [tok.eos_id] for c in CALLS],
        filler=sorted(set(tok.encode(" " + " ".join(WORDS)))),
        model="stub",
        max_model_len=8192,
    )


def first_prompt_tokens(tok, row: dict) -> int:
    from envs.single_tool_call import SingleToolCall
    from workers.policy.chat import chat_tools, input_messages

    schemas = chat_tools([t.schema() for t in SingleToolCall().tools()])
    history, tools = tok.with_tools(input_messages(row["responses_create_params"]), schemas)
    return len(tok.prompt_ids(history, tools))


# -- one mode's run through the farm ---------------------------------------------------------------
class InFlight:
    """Samples each replica's in-flight requests every `every_s` in a thread, while `running`."""

    def __init__(self, probes: list[Callable[[], float]], every_s: float):
        self.probes, self.every_s = probes, every_s
        self.samples: list[list[float]] = []
        self.running = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            if self.running:
                try:
                    self.samples.append([p() for p in self.probes])
                except OSError:
                    pass

    def __enter__(self) -> "InFlight":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def means(self) -> list[float]:
        n = max(1, len(self.samples))
        return [sum(s[i] for s in self.samples) / n for i in range(len(self.probes))]


async def farm_run(
    args: argparse.Namespace,
    urls: list[str],
    routing: str,
    rows: list[dict],
    model_dir: Path,
    tmp: Path,
    in_flight: list[Callable[[], float]],
    agent: str = AGENT,
    model: str = "stub",
    **env: str,
) -> dict:
    """Every row G times (one group each) through a fresh `farm worker` pool routing by `routing`."""
    from farm.client import FarmClient
    from farm.settings import load_settings

    namespace = f"bench-{uuid.uuid4().hex[:12]}"
    settings = load_settings(env={}, overrides={"redis_url": args.redis_url, "namespace": namespace})
    worker_env = {**policy_env(",".join(urls), model, model_dir), "FARM_POLICY_ROUTING": routing, **env}
    try:
        with WorkerPool(
            args.redis_url, namespace, agent, args.processes, args.concurrency, tmp, f"prefill-{routing}", **worker_env
        ) as pool:
            client = FarmClient(settings)
            try:
                await pool.ready(client, timeout_s=300.0)
                run_id = f"prefill-{routing}-{uuid.uuid4().hex[:6]}"
                tasks = []
                for row in rows:
                    group = uuid.uuid4().hex
                    tasks += [
                        client.task(run_id=run_id, agent=agent, row=row, group_id=group, sample_index=k)
                        for k in range(args.generations)
                    ]
                with InFlight(in_flight, args.sample_every) as sampler:
                    sampler.running = True
                    start = time.perf_counter()
                    _, got = await asyncio.gather(client.submit(tasks), client.collect(tasks, timeout_s=args.timeout))
                    wall = time.perf_counter() - start
                    sampler.running = False
                pool.check()
            finally:
                await client.aclose()
    finally:
        delete_namespace(args.redis_url, namespace)
    rollouts = list(got.values())
    starts: dict[str, set] = {}
    for r in rollouts:
        starts.setdefault(r.group_id, set()).add(r.metrics.get("replica"))
    return {
        "rollouts": len(rollouts),
        "ok": sum(r.ok for r in rollouts),
        "errors": sorted({f"{r.error.kind}: {r.error.message[:120]}" for r in rollouts if r.error})[:5],
        "mean_reward": statistics.mean(r.reward or 0.0 for r in rollouts) if rollouts else float("nan"),
        "mean_turns": statistics.mean(r.metrics.get("turns", 0) for r in rollouts) if rollouts else 0.0,
        "wall_s": wall,
        "rollouts_per_s": len(rollouts) / wall,
        "p50_rollout_s": statistics.median(r.timings.total_s for r in rollouts) if rollouts else float("nan"),
        "replicas_per_group": statistics.mean(len(s) for s in starts.values()) if starts else 0.0,
        "in_flight_mean": sampler.means(),
        "in_flight_samples": len(sampler.samples),
    }


def ratio(values: list[float]) -> float:
    lo, hi = min(values), max(values)
    return hi / lo if lo > 0 else float("inf")


async def stub_mode(args: argparse.Namespace, routing: str, rows: list[dict], script: Script, model_dir, tmp) -> dict:
    """One mode against R fresh stub replicas: the farm's figures plus the replicas' prefix-cache counters."""
    stubs = [
        StubProcess(
            script,
            latency_s=args.latency,
            jitter_s=args.jitter,
            seed=i,
            prefix_cache_tokens=args.cache_tokens,
            prefill_s_per_token=args.prefill_s_per_token,
            filler_tokens=args.filler_tokens,
            workdir=tmp,
        ).start()
        for i in range(args.replicas)
    ]
    try:
        probes = [lambda s=s: s.stats()["pending"] for s in stubs]
        res = await farm_run(args, [s.url for s in stubs], routing, rows, model_dir, tmp, probes)
        caches = [s.prefix_cache() for s in stubs]
    finally:
        for s in stubs:
            s.stop()
    prompt = sum(c["prompt_tokens"] for c in caches)
    cached = sum(c["cached_tokens"] for c in caches)
    requests = [c["requests"] for c in caches]
    return {
        **res,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "prefilled_tokens": prompt - cached,
        "hit_rate": cached / prompt if prompt else 0.0,
        "evicted_blocks": sum(c["evicted_blocks"] for c in caches),
        "requests": requests,
        "requests_ratio": ratio(requests),
        "in_flight_ratio": ratio(res["in_flight_mean"]),
    }


# -- report ----------------------------------------------------------------------------------------
def combine(runs: list[dict]) -> dict:
    """One mode's rounds: token counts summed, rates and ratios averaged."""
    out = {k: sum(r[k] for r in runs) for k in ("rollouts", "ok", "prompt_tokens", "cached_tokens", "prefilled_tokens")}
    for k in ("rollouts_per_s", "p50_rollout_s", "replicas_per_group", "in_flight_ratio", "requests_ratio", "wall_s"):
        out[k] = statistics.mean(r[k] for r in runs)
    out["hit_rate"] = out["cached_tokens"] / out["prompt_tokens"] if out["prompt_tokens"] else 0.0
    out["mean_turns"] = statistics.mean(r["mean_turns"] for r in runs)
    out["mean_reward"] = statistics.mean(r["mean_reward"] for r in runs)
    out["evicted_blocks"] = sum(r.get("evicted_blocks", 0) for r in runs)
    return out


def report(setup: dict, modes: dict[str, dict], path: Path) -> dict:
    ref, grp = modes["least_outstanding"], modes["group"]
    rows = [
        ("prefilled prompt tokens", "{:,.0f}", "prefilled_tokens"),
        ("prompt tokens", "{:,.0f}", "prompt_tokens"),
        ("cache hit rate (cached / prompt tokens)", "{:.1%}", "hit_rate"),
        ("blocks evicted", "{:,.0f}", "evicted_blocks"),
        ("rollouts/s", "{:.1f}", "rollouts_per_s"),
        ("rollout p50, s", "{:.2f}", "p50_rollout_s"),
        ("wall, s", "{:.1f}", "wall_s"),
        ("busiest / idlest replica, mean in flight", "{:.2f}", "in_flight_ratio"),
        ("busiest / idlest replica, requests", "{:.2f}", "requests_ratio"),
        ("replicas a group's samples started on", "{:.2f}", "replicas_per_group"),
        ("model calls per rollout", "{:.2f}", "mean_turns"),
        ("mean reward", "{:.2f}", "mean_reward"),
    ]
    print()
    print(f"{'figure':<44} {'least_outstanding':>18} {'group':>12}")
    print("-" * 76)
    for name, fmt, key in rows:
        print(f"{name:<44} {fmt.format(ref[key]):>18} {fmt.format(grp[key]):>12}")
    print(f"{'rollouts ok':<44} {ref['ok']:>10} of {ref['rollouts']:<5} {grp['ok']:>4} of {grp['rollouts']:<5}")
    prefill_ratio = ref["prefilled_tokens"] / max(1, grp["prefilled_tokens"])
    speed = grp["rollouts_per_s"] / ref["rollouts_per_s"]
    checks = [
        ("prefilled tokens, least_outstanding / group", f"{prefill_ratio:.2f}x", ">= 1.5x", prefill_ratio >= 1.5),
        ("rollouts/s, group / least_outstanding", f"{speed:.2f}x", ">= 1.0x", speed >= 1.0),
        ("busiest / idlest in flight, group", f"{grp['in_flight_ratio']:.2f}", "<= 1.5", grp["in_flight_ratio"] <= 1.5),
        ("rollouts ok, both modes", f"{ref['ok'] + grp['ok']} of {ref['rollouts'] + grp['rollouts']}", "all",
         ref["ok"] + grp["ok"] == ref["rollouts"] + grp["rollouts"]),
    ]  # fmt: skip
    print()
    for name, got, target, ok in checks:
        print(f"{name:<48} {got:>14} {target:>10}  {'ok' if ok else 'MISSED'}")
    out = {"setup": setup, "modes": modes, "prefill_ratio": prefill_ratio, "speed_ratio": speed}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"figures written to {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return out


def describe(args: argparse.Namespace, tok, rows: list[dict], agent: str = AGENT) -> dict:
    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_at_start": os.getloadavg(),
        "groups": args.groups,
        "generations": args.generations,
        "first_prompt_tokens": first_prompt_tokens(tok, rows[0]),
        "workers": f"{args.processes} x `farm worker --agent {agent} --concurrency {args.concurrency}`",
    }


async def run(args: argparse.Namespace, tmp: Path) -> int:
    from workers.policy.chat import ChatTokenizer
    from workers.policy.serving import default_cache, prepare_model

    started = time.monotonic()
    model_dir = prepare_model(default_cache())
    tok = ChatTokenizer(str(model_dir))
    rows = group_rows(args.groups, args.system_words, args.doc_words, args.seed)
    script = three_call_script(tok)
    setup = describe(args, tok, rows)
    setup["replicas"] = (
        f"{args.replicas} stubs: latency {args.latency} s +- {args.jitter} s, prefix cache "
        f"{args.cache_tokens:,} tokens each, prefill {args.prefill_s_per_token * 1e6:g} us per uncached token, "
        f"{args.filler_tokens} random ids before each scripted reply"
    )
    print(f"$ {setup['command']}")
    for k in ("groups", "generations", "first_prompt_tokens", "replicas", "workers"):
        print(f"  {k}: {setup[k]}")
    print(f"  {setup['cpus']} CPUs, Python {setup['python']}, load at start {setup['load_at_start']}", flush=True)
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for i in range(args.rounds):
        for mode in MODES if i % 2 == 0 else MODES[::-1]:
            res = await stub_mode(args, mode, rows, script, model_dir, tmp)
            runs[mode].append(res)
            print(
                f"  round {i + 1} {mode:<18} {res['ok']}/{res['rollouts']} ok in {res['wall_s']:.1f}s, "
                f"prefilled {res['prefilled_tokens']:,}, hit rate {res['hit_rate']:.1%}, "
                f"requests {res['requests']}, mean in flight {[round(x, 1) for x in res['in_flight_mean']]}"
                + (f", errors {res['errors']}" if res["errors"] else ""),
                flush=True,
            )
    setup["load_at_end"] = os.getloadavg()
    setup["runtime_s"] = time.monotonic() - started
    path = args.out or ROOT / "bench" / "out" / f"prefill-{time.strftime('%Y%m%d-%H%M%S')}.json"
    report(setup, {m: combine(r) | {"rounds": r} for m, r in runs.items()}, path)
    print(f"load average at end {setup['load_at_end']}; runtime {setup['runtime_s']:.0f}s")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--groups", type=int, default=64, help="B: groups (distinct per-group documents)")
    p.add_argument("--generations", type=int, default=8, help="G: samples per group")
    p.add_argument("--system-words", type=int, default=900, help="the shared system prefix, in words")
    p.add_argument("--doc-words", type=int, default=900, help="each group's document, in words")
    p.add_argument("--processes", type=int, default=1, help="worker processes")
    p.add_argument("--concurrency", type=int, default=64, help="rollouts in flight per worker process")
    p.add_argument("--rounds", type=int, default=2, help="runs of both modes, alternating which goes first")
    p.add_argument("--sample-every", type=float, default=0.05, help="seconds between in-flight samples")
    p.add_argument("--timeout", type=float, default=600.0, help="collect timeout per mode, seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="JSON of the figures (default bench/out/prefill-<time>.json)")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    p = parser()
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--latency", type=float, default=0.3, help="each model call's latency (decode), seconds")
    p.add_argument("--jitter", type=float, default=0.1, help="latency uniform in latency +- jitter")
    p.add_argument("--cache-tokens", type=int, default=65_536, help="each replica's prefix cache, tokens")
    p.add_argument("--prefill-s-per-token", type=float, default=1e-4, help="prefill seconds per uncached token")
    p.add_argument("--filler-tokens", type=int, default=24, help="random ids before each reply: samples differ")
    args = p.parse_args(argv)
    if not answers(args.redis_url):
        raise SystemExit(f"no Redis answers at {args.redis_url}")
    with tempfile.TemporaryDirectory(prefix="farm-bench-prefill-") as tmp:
        return asyncio.run(run(args, Path(tmp)))


if __name__ == "__main__":
    sys.exit(main())
