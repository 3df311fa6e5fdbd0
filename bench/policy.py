"""What the farm costs a policy-bound rollout: its generated tokens/s next to a plain client's.

A real rollout spends nearly all its time waiting on the policy. What the farm adds around
that wait (Redis in and out, the agent loop, chat templating, detokenizing, verifying, the
settle script) must not leave the policy idle or steal its CPU, or every trainer step pays
for it. So this benchmark puts the farm and the simplest possible client side by side, at
the same concurrency, against the same real vLLM (on the CPU, SmolLM2-135M-Instruct):

  farm    `python -m farm worker --concurrency C` running the `single_tool_call`
          environment's agent loop in single-turn mode, fed and drained through Redis by
          `farm.client.FarmClient`; tokens counted from the rollouts'
          `metrics['completion_tokens']`.
  plain   httpx asyncio, a semaphore of C, one POST /v1/completions per request; tokens
          counted from the responses' lengths.

Both sides send the same requests: the same prompt token ids (built by the worker's own
path: ChatTokenizer.with_tools + prompt_ids over the rows' messages and the environment's
tool schemas; the bench checks the farm's traces carry exactly these ids), and the same
body the farm's PolicyClient sends (temperature 1.0, top_p 1.0, logprobs 0, token ids
returned), with a fixed max_tokens and `ignore_eos: true`, so every request generates
exactly max_tokens tokens on both sides (checked too: a farm rollout that stops short
would mean the agent config's sampling keys did not reach vLLM).

Time is wall clock from the first request (or XADD) to the last response (or rollout),
after an untimed warm-up round on each side. The timed rounds run in ABBA order (plain,
farm, farm, plain, ...), so a linear drift in machine load does not favour either side;
each side's figure is its total tokens over its total time. Target: the farm reaches at
least 95% of the plain client's tokens/s at every concurrency. The table also gives the
fastest farm round over the fastest plain round, which a load spike in one round moves less.

On a 2-core machine the policy, the worker and this script share the CPU, so the table
also shows the CPU seconds each one used per round, and the load average (other people's
jobs skew the figures; run it with nothing else busy when the number matters):

    python bench/policy.py [--concurrency 8,32] [--max-tokens 64] [--requests N] [--rounds 2]

The run uses its own namespace (`bench-<uuid>`) on the Redis at --redis-url and deletes its
keys afterwards. The figures are printed as a table, then as one JSON line for scripts.
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
from contextlib import ExitStack
from pathlib import Path
from typing import Optional

import httpx
import redis
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import WorkerPool, answers, delete_namespace  # noqa: E402
from envs.single_tool_call import SingleToolCall, generate  # noqa: E402
from farm.client import FarmClient  # noqa: E402
from farm.schema import Sampling, Status  # noqa: E402
from farm.settings import load_settings  # noqa: E402
from workers.policy.chat import ChatTokenizer, chat_tools, input_messages  # noqa: E402
from workers.policy.serving import PolicyServer, default_cache, prepare_model  # noqa: E402
from workers.supervise.stack import policy_env  # noqa: E402

AGENT = "bench_weather"
TARGET_RATIO = 0.95
TICK = os.sysconf("SC_CLK_TCK")


# -- prompts and request bodies -------------------------------------------------------------------
def prompt_ids(tok: ChatTokenizer, rows: list[dict]) -> list[list[int]]:
    """The first prompt of each row exactly as the tokens backend builds it (workers/policy/token_policy.py)."""
    env = SingleToolCall()
    out = []
    for row in rows:
        params = row["responses_create_params"]
        schemas = chat_tools(params.get("tools") or [t.schema() for t in env.tools()])
        history, template_tools = tok.with_tools(input_messages(params), schemas)
        out.append(tok.prompt_ids(history, template_tools))
    return out


def request_body(model: str, prompt: list[int], max_tokens: int) -> dict:
    """The body workers/policy/tokens.py PolicyClient.complete sends for this bench's agent config."""
    return {
        "model": model,
        "prompt": prompt,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
        "temperature": 1.0,
        "top_p": 1.0,
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }


# -- CPU accounting (Linux /proc) ------------------------------------------------------------------
def _stat_fields(pid: int) -> Optional[list[str]]:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def cpu_seconds(pids: list[int]) -> float:
    """user+system CPU seconds of the given processes so far."""
    total = 0
    for pid in pids:
        f = _stat_fields(pid)
        if f:
            total += int(f[11]) + int(f[12])
    return total / TICK


def group_pids(pgid: int) -> list[int]:
    """Every live process in a process group (vLLM's API server, engine core, workers)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        f = _stat_fields(int(stat.parent.name))
        if f and int(f[2]) == pgid:
            pids.append(int(stat.parent.name))
    return pids


class CpuMeter:
    """CPU seconds used during a round by: vLLM's process group, the farm worker(s), this script."""

    def __init__(self, vllm_pgid: int, worker_pids: list[int]):
        self.vllm, self.workers = group_pids(vllm_pgid), worker_pids

    def __enter__(self) -> "CpuMeter":
        self.start = (cpu_seconds(self.vllm), cpu_seconds(self.workers), time.process_time())
        return self

    def __exit__(self, *exc) -> None:
        end = (cpu_seconds(self.vllm), cpu_seconds(self.workers), time.process_time())
        self.used = {
            k: round(b - a, 2) for k, a, b in zip(("vllm_cpu_s", "worker_cpu_s", "bench_cpu_s"), self.start, end)
        }


# -- one round on each side ---------------------------------------------------------------------
async def plain_round(server: PolicyServer, prompts: list[list[int]], max_tokens: int, concurrency: int) -> dict:
    """Every prompt once, at most `concurrency` in flight; the clock covers first POST to last response."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    gate = asyncio.Semaphore(concurrency)
    url = server.openai_url + "/completions"

    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=10.0), limits=limits) as http:

        async def one(prompt: list[int]) -> int:
            async with gate:
                resp = await http.post(url, json=request_body(server.served_model_name, prompt, max_tokens))
            resp.raise_for_status()
            return len(resp.json()["choices"][0]["logprobs"]["tokens"])

        start = time.perf_counter()
        lengths = await asyncio.gather(*(one(p) for p in prompts))
        wall = time.perf_counter() - start
    return {
        "requests": len(prompts),
        "tokens": sum(lengths),
        "short": sum(n != max_tokens for n in lengths),
        "wall_s": wall,
    }


async def farm_round(
    client: FarmClient, run_id: str, rows: list[dict], prompts: list[list[int]], max_tokens: int
) -> dict:
    """Every row as a task; the clock covers the first XADD to the last rollout."""
    tasks = [
        client.task(
            run_id=run_id, agent=AGENT, row=row, sampling=Sampling(temperature=1.0, top_p=1.0, max_tokens=max_tokens)
        )
        for row in rows
    ]
    start = time.perf_counter()
    _, rollouts = await asyncio.gather(client.submit(tasks), client.collect(tasks, timeout_s=600))
    wall = time.perf_counter() - start
    failed = [r for r in rollouts.values() if r.status is Status.failed]
    if failed:
        e = failed[0].error
        raise SystemExit(f"{len(failed)} of {len(tasks)} farm rollouts failed; first: {e.kind}: {e.message}")
    tokens, short, other_prompt = 0, 0, 0
    for task, prompt in zip(tasks, prompts):
        r = rollouts[task.task_id]
        n = r.metrics["completion_tokens"]
        tokens += n
        short += n != max_tokens
        other_prompt += list(r.trace.prompt()) != prompt
    return {"requests": len(tasks), "tokens": tokens, "short": short, "prompt_mismatch": other_prompt, "wall_s": wall}


async def bench_concurrency(
    url: str,
    server: PolicyServer,
    config: Path,
    concurrency: int,
    rows: list[dict],
    prompts: list[list[int]],
    args: argparse.Namespace,
    log_dir: Path,
) -> dict:
    """Warm-up on each side, then `rounds` timed rounds per side in ABBA order, with fresh workers."""
    namespace = f"bench-{uuid.uuid4().hex[:12]}"
    settings = load_settings(env={}, overrides={"redis_url": url, "namespace": namespace})
    per_process = max(1, concurrency // args.processes)
    load_before = os.getloadavg()
    rounds: list[dict] = []
    try:
        with WorkerPool(
            url,
            namespace,
            AGENT,
            args.processes,
            per_process,
            log_dir,
            f"c{per_process}",
            FARM_CONFIG=str(config),
            **policy_env(server.url, server.served_model_name, server.model_dir),
        ) as workers:
            client = FarmClient(settings)
            try:
                await workers.ready(client, timeout_s=120.0, every_s=0.2)
                warm = min(len(rows), concurrency)
                await plain_round(server, prompts[:warm], args.max_tokens, concurrency)
                await farm_round(client, "warmup", rows[:warm], prompts[:warm], args.max_tokens)
                order = [
                    side
                    for k in range(args.rounds)
                    for side in (("plain", "farm") if k % 2 == 0 else ("farm", "plain"))
                ]
                for k, side in enumerate(order):
                    with CpuMeter(server.proc.pid, workers.pids) as cpu:
                        if side == "plain":
                            res = await plain_round(server, prompts, args.max_tokens, concurrency)
                        else:
                            res = await farm_round(client, f"timed-{k}", rows, prompts, args.max_tokens)
                    workers.check()
                    res.update(side=side, tokens_per_s=res["tokens"] / res["wall_s"], **cpu.used)
                    rounds.append(res)
                    print(
                        f"  C={concurrency} round {k + 1}/{len(order)} {side:<5} {res['tokens']:>6} tokens "
                        f"in {res['wall_s']:6.1f}s = {res['tokens_per_s']:6.1f} tokens/s  "
                        f"(load {os.getloadavg()[0]:.2f})",
                        file=sys.stderr,
                        flush=True,
                    )
            finally:
                await client.aclose()
    finally:
        delete_namespace(url, namespace)

    def total(side: str) -> dict:
        rs = [r for r in rounds if r["side"] == side]
        tokens, wall = sum(r["tokens"] for r in rs), sum(r["wall_s"] for r in rs)
        return {
            "tokens": tokens,
            "wall_s": wall,
            "tokens_per_s": tokens / wall,
            "best_tokens_per_s": max(r["tokens_per_s"] for r in rs),
            "short": sum(r["short"] for r in rs),
        }

    plain, farm = total("plain"), total("farm")
    return {
        "concurrency": concurrency,
        "processes": args.processes,
        "requests_per_round": len(rows),
        "plain": plain,
        "farm": farm,
        "ratio": farm["tokens_per_s"] / plain["tokens_per_s"],
        "best_round_ratio": farm["best_tokens_per_s"] / plain["best_tokens_per_s"],
        "prompt_mismatch": sum(r.get("prompt_mismatch", 0) for r in rounds),
        "rounds": rounds,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }


# -- report -------------------------------------------------------------------------------------
def report(results: list[dict], meta: dict) -> dict:
    """Print the table, then the whole result as one JSON line."""
    print(
        f"farm vs plain client, tokens/s: {meta['model']} on vLLM (CPU), {meta['cpus']} CPUs, "
        f"max_tokens {meta['max_tokens']} with ignore_eos, {meta['redis']}"
    )
    print(f"load average 1/5/15 min: start {meta['load_start']}, end {meta['load_end']}")
    print(
        f"{'concurrency':<12} {'requests':>8} {'plain tok/s':>12} {'farm tok/s':>11} {'farm/plain':>11}  "
        f"{'target':<7} {'result':<7} {'best rounds':>11}  {'cpu s/round vllm|worker|bench, plain -> farm'}"
    )
    print("-" * 140)
    for res in results:

        def cpu(side: str) -> str:
            rs = [r for r in res["rounds"] if r["side"] == side]
            return "|".join(
                f"{sum(r[k] for r in rs) / len(rs):.1f}" for k in ("vllm_cpu_s", "worker_cpu_s", "bench_cpu_s")
            )

        met = res["ratio"] >= TARGET_RATIO
        print(
            f"C={res['concurrency']:<10} {res['requests_per_round']:>5} x{len(res['rounds']) // 2} "
            f"{res['plain']['tokens_per_s']:>12.1f} {res['farm']['tokens_per_s']:>11.1f} "
            f"{res['ratio'] * 100:>10.1f}%  >= {TARGET_RATIO:.0%}  {'ok' if met else 'MISSED':<7} "
            f"{res['best_round_ratio'] * 100:>10.1f}%  {cpu('plain')} -> {cpu('farm')}"
        )
    problems = []
    for res in results:
        if res["farm"]["short"] or res["plain"]["short"]:
            problems.append(
                f"C={res['concurrency']}: {res['farm']['short']} farm / {res['plain']['short']} plain "
                f"completions shorter than max_tokens (ignore_eos not honoured?)"
            )
        if res["prompt_mismatch"]:
            problems.append(f"C={res['concurrency']}: {res['prompt_mismatch']} farm prompts differ from the plain ones")
    for p in problems:
        print(f"WARNING: {p}")
    print(
        "farm/plain: total tokens over total time per side; best rounds: fastest farm round over fastest "
        "plain round (less sensitive to a load spike from other jobs)"
    )
    print(f"bench runtime {meta['runtime_s']:.0f}s")
    summary = {"meta": meta, "results": results, "target_ratio": TARGET_RATIO, "problems": problems}
    print(json.dumps(summary))
    return summary


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0", help="the Redis to run the farm on")
    p.add_argument("--concurrency", default="8,32", help="concurrencies to measure, comma-separated")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request (ignore_eos)")
    p.add_argument(
        "--requests", type=int, default=None, help="requests per timed round (default: max(32, 2 x concurrency))"
    )
    p.add_argument("--rounds", type=int, default=2, help="timed rounds per side, in ABBA order")
    p.add_argument(
        "--processes", type=int, default=1, help="farm worker processes; each runs concurrency / processes agent loops"
    )
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0, help="seed of the generated single_tool_call rows")
    args = p.parse_args(argv)
    if not answers(args.redis_url):
        raise SystemExit(f"no Redis answers at {args.redis_url}")

    load_start = [round(x, 2) for x in os.getloadavg()]
    model_dir = prepare_model(default_cache())
    tok = ChatTokenizer(str(model_dir))
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="farm-bench-policy-")))
        config = tmp / "farm.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "agents": {
                        AGENT: {
                            "env": "single_tool_call",
                            "loop": "single_turn",
                            "max_steps": 1,
                            "sampling": {"max_tokens": args.max_tokens, "ignore_eos": True},
                        }
                    }
                }
            )
        )
        server = PolicyServer(model_dir, max_model_len=args.max_model_len, log_path=tmp / "vllm.log")
        server.start()
        stack.callback(server.stop)
        info = redis.Redis.from_url(args.redis_url).info("server")
        results = []
        for c in (int(x) for x in args.concurrency.split(",")):
            n = args.requests or max(32, 2 * c)
            rows = generate(n, seed=args.seed)
            results.append(
                asyncio.run(
                    bench_concurrency(args.redis_url, server, config, c, rows, prompt_ids(tok, rows), args, tmp)
                )
            )
    meta = {
        "model": model_dir.name,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "redis": f"Redis {info['redis_version']}",
        "max_tokens": args.max_tokens,
        "load_start": load_start,
        "load_end": [round(x, 2) for x in os.getloadavg()],
        "runtime_s": round(time.monotonic() - started, 1),
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
    }
    report(results, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
