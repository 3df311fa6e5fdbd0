"""Step time: does over-sampling shorten a synchronous GRPO step, and does cancelling cost anything?

A synchronous GRPO step waits for its slowest group, so with heavy-tailed rollout latency the
step's clock is the tail. This benchmark runs GRPO-shaped load (B groups x G samples per step)
through real `farm worker` processes against workers/policy/stub with lognormal model latency
(median L, sigma 1), using trainer.rollout.FarmRollout exactly as the trainer does
(`.generate(prompts)` per step, prompts = B rows each repeated G times, as JSON strings), and
prints, side by side in one run:

  reference   oversample 1.0: every step waits for all B groups;
  oversample  oversample 1.25 (--oversample): ceil(1.25 B) groups submitted, the first B clean
              ones trained on, the rest cancelled;
  dynamic     oversample 1.25 + drop_zero_variance_groups: all-equal groups replaced too;
  partial     oversample 1.25 + partial_rollouts: the groups not taken are interrupted, keeping
              what they generated, and resumed as the next step's extra groups.

The steps of the four alternate (reference, oversample, dynamic, partial, reference, ...), so a
change of load on the machine reaches all alike. For each: median and p90 of
`farm/batch_wall_s`, groups cancelled per step, zero-variance groups dropped per step,
cancelled and failed rollouts in the trainer's batch; the ratio of the medians; and the tokens:
generated (the stub's own count of the tokens it produced during the config's steps, those of
cancelled and interrupted requests included: the stub generates token by token, streamed to the
workers, which run with policy_stream), trained (sampled tokens in the batches), discarded
(generated, neither trained nor carried by the last step's interrupted groups), generated per
trained token, and the resumed rollouts per step and their age in policy versions.

The policy stub picks each answer at random (--call-weight 0.75: the weather tool call, else a
bare answer), so `single_tool_call` rewards are 1 (the tool was called for Paris) or 0, varied
within a group, and all-equal in about 0.75^G + 0.25^G of the groups (10% at G=8).

Then the cancel latency: N (--cancel-rollouts, 1,024) rollouts in flight against the stub at a
fixed 60 s, `await client.cancel_run(run_id)`, and from the stub's /aborts the p50/p99 of
(connection closed - cancel called), how many of the N requests were closed, and whether every
task came back `cancelled`.

Targets: median step >= 1.3x faster with 1.25x over-sampling; cancel p99 <= 200 ms; 0
cancelled or failed rollouts in the trainer's batch; partial rollouts discard >= 90% fewer
generated tokens than cancelling, at no worse a median step.

    python bench/step.py [--groups 32] [--generations 8] [--steps 20] [--latency 0.15] [--quick]

The stub, the workers, Redis and this process share the machine's CPUs. The run uses its own
namespace on --redis-url and deletes it; the figures go to bench/out/step-<time>.json too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import WorkerPool, answers, delete_namespace  # noqa: E402
from farm.client import FarmClient  # noqa: E402
from farm.schema import Status  # noqa: E402
from farm.settings import Settings, load_settings  # noqa: E402
from trainer.rollout import FarmRollout  # noqa: E402
from workers.policy.stub import StubProcess, weather_rows, weather_script  # noqa: E402
from workers.supervise.stack import policy_env  # noqa: E402

AGENT = "single_tool_call"
TARGETS = {"speedup": 1.3, "cancel_p99_ms": 200.0, "bad_in_batch": 0, "partial_fewer_discarded": 0.9}


@dataclass
class Config:
    name: str
    oversample: float
    drop_zero_variance_groups: bool
    partial: bool = False  # interrupt the groups not taken and resume them next step (partial_rollouts)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def training_rows(n: int) -> list[dict]:
    """n distinct single_tool_call rows, each asking for the weather in Paris (a numbered question,
    so every group has a prompt of its own)."""
    rows = weather_rows(n)
    for i, r in enumerate(rows):
        r["responses_create_params"]["input"][-1]["content"] = f"What is the weather in Paris? (question {i})"
    return rows


# -- the steps -----------------------------------------------------------------------------------
def run_steps(
    settings: Settings, tokenizer, configs: list[Config], args: argparse.Namespace, stub: StubProcess
) -> dict[str, list]:
    """args.steps steps of each config, alternating; per config, each step's metrics, with the
    tokens the stub generated during the step (cancelled and interrupted requests' included) and
    the tokens the batch trains on; a partial config's last step also says what it carries."""
    rows = training_rows(max(4 * args.groups, 256))
    trainers = {
        c.name: FarmRollout(
            settings,
            tokenizer=tokenizer,
            run_id=f"step-{c.name}-{uuid.uuid4().hex[:6]}",
            num_generations=args.generations,
            oversample=c.oversample,
            drop_zero_variance_groups=c.drop_zero_variance_groups,
            max_refills=args.max_refills,
            spare_rows=rows,
            timeout_s=args.step_timeout,
            partial_rollouts=c.partial,
        )
        for c in configs
    }
    out: dict[str, list] = {c.name: [] for c in configs}
    try:
        trainers[configs[0].name].generate(prompts_of(rows, 0, args))  # warm-up: connections, caches
        for step in range(args.steps):
            prompts = prompts_of(rows, step + 1, args)  # the same prompts for every config
            for c in configs:
                t0 = time.perf_counter()
                generated = stub.stats()["tokens_generated"]
                batch = trainers[c.name].generate(prompts)
                m = dict(batch.metrics, generate_s=time.perf_counter() - t0)
                m["bad_in_batch"] = float(sum(not r.ok for r in batch.rollouts))
                m["generated_tokens"] = float(stub.stats()["tokens_generated"] - generated)
                m["trained_tokens"] = float(sum(sum(x.env_mask) for x in batch.samples if x.reward is not None))
                m["carried_tokens"] = float(m.get("farm/tokens/carried", 0.0))
                out[c.name].append(m)
                print(
                    f"  step {step + 1:>3} {c.name:<10} {m['farm/batch_wall_s']:6.2f}s  "
                    f"cancelled groups {m.get('farm/groups/cancelled', 0):>3.0f}  "
                    f"zero-variance dropped {m.get('farm/groups/zero_variance_dropped', 0):>3.0f}  "
                    f"failed in batch {m['bad_in_batch']:.0f}",
                    flush=True,
                )
    finally:
        for t in trainers.values():
            t.close()
    return out


def prompts_of(rows: list[dict], step: int, args: argparse.Namespace) -> list[str]:
    """TRL's prompts for one step: B rows, each repeated G times in a row, as JSON strings."""
    picked = [rows[(step * args.groups + g) % len(rows)] for g in range(args.groups)]
    return [json.dumps(r) for r in picked for _ in range(args.generations)]


def summarize(steps: list[dict]) -> dict:
    wall = [m["farm/batch_wall_s"] for m in steps]
    generated = sum(m["generated_tokens"] for m in steps)
    trained = sum(m["trained_tokens"] for m in steps)
    carried = steps[-1]["carried_tokens"] if steps else 0.0  # held for a next step that never comes
    resumed = [m["farm/partial/resumed_age/mean"] for m in steps if m.get("farm/partial/resumed_in_batch")]

    def per_step(key: str) -> float:
        return statistics.mean(m.get(key, 0.0) for m in steps)

    return {
        "steps": len(steps),
        "median_s": statistics.median(wall),
        "p90_s": pct(wall, 0.9),
        "groups_cancelled_per_step": per_step("farm/groups/cancelled"),
        "cancelled_run_s_mean": per_step("farm/groups/cancelled_run_s/mean"),
        "zero_variance_dropped_per_step": per_step("farm/groups/zero_variance_dropped"),
        "refills_per_step": per_step("farm/groups/refills"),
        "cancelled_in_batch": sum(m.get("farm/rollouts/cancelled_in_batch", 0.0) for m in steps),
        "failed_in_batch": sum(m.get("farm/failed", 0.0) for m in steps),
        "not_ok_in_batch": sum(m["bad_in_batch"] for m in steps),
        "mean_reward": statistics.mean(m.get(f"farm/reward/{AGENT}/mean", float("nan")) for m in steps),
        "generated_tokens": generated,
        "trained_tokens": trained,
        "carried_tokens": carried,
        "discarded_tokens": generated - trained - carried,
        "generated_per_trained": generated / trained if trained else float("nan"),
        "resumed_per_step": sum(m.get("farm/partial/resumed_in_batch", 0.0) for m in steps) / max(1, len(steps)),
        "resumed_age_mean": statistics.mean(resumed) if resumed else 0.0,
    }


# -- the cancel latency ----------------------------------------------------------------------------
async def cancel_latency(settings: Settings, stub: StubProcess, n: int, slow_s: float) -> dict:
    """n rollouts held by a slow stub, then one cancel_run: how soon each model request is closed."""
    stub.control(latency_dist="fixed", latency_s=slow_s, pick="scripted")
    before = stub.stats()["pending"]
    client = FarmClient(settings)
    run_id = f"cancel-{uuid.uuid4().hex[:6]}"
    try:
        tasks = [client.task(run_id=run_id, agent=AGENT, row=r) for r in training_rows(n)]
        started = time.time()
        await client.submit(tasks)
        deadline = time.monotonic() + 60
        while (in_flight := stub.stats()["pending"] - before) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # let the last requests settle in
        called = time.time()
        report = await client.cancel_run(run_id)
        returned = time.time() - called
        got = await client.collect(tasks, timeout_s=60)
        back = time.time() - called
        await asyncio.sleep(0.5)  # late closes, so they are counted as late and not lost
        aborts = [a for a in stub.aborts() if a["received"] >= started]
    finally:
        await client.aclose()
    late_ms = [1000 * (a["closed"] - called) for a in aborts]
    statuses: dict[str, int] = {}
    for r in got.values():
        statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
    return {
        "rollouts": n,
        "in_flight_at_cancel": in_flight,
        "open_at_cancel": report.open_count,
        "cancel_call_ms": 1000 * returned,
        "all_back_ms": 1000 * back,
        "closed": len(aborts),
        "p50_ms": pct(late_ms, 0.5),
        "p99_ms": pct(late_ms, 0.99),
        "max_ms": max(late_ms, default=float("nan")),
        "statuses": statuses,
        "all_cancelled": statuses == {Status.cancelled.value: n},
    }


# -- report ----------------------------------------------------------------------------------------
def report(setup: dict, results: dict, cancel: Optional[dict], path: Path) -> None:
    ref, over = results["reference"], results["oversample"]
    speedup = ref["median_s"] / over["median_s"]
    print()
    print(
        f"{'config':<11} {'steps':>5} {'median s':>9} {'p90 s':>7} {'cancelled':>10} {'run s':>6} "
        f"{'zv dropped':>10} {'refills':>8} {'reward':>7} {'cancelled/failed in batch':>26}"
    )
    print("-" * 104)
    for name, r in results.items():
        print(
            f"{name:<11} {r['steps']:>5} {r['median_s']:>9.2f} {r['p90_s']:>7.2f} "
            f"{r['groups_cancelled_per_step']:>10.1f} {r['cancelled_run_s_mean']:>6.2f} "
            f"{r['zero_variance_dropped_per_step']:>10.1f} {r['refills_per_step']:>8.1f} {r['mean_reward']:>7.2f} "
            f"{'%.0f / %.0f' % (r['cancelled_in_batch'], r['failed_in_batch']):>26}"
        )
    print("cancelled, zv dropped, refills: groups per step; run s: mean time a cancelled group had run")
    print()
    head = ("config", "generated", "trained", "carried", "discarded", "gen/trained", "resumed/step", "age")
    print("{:<11} {:>10} {:>9} {:>8} {:>10} {:>12} {:>13} {:>5}".format(*head))
    for name, r in results.items():
        print(
            f"{name:<11} {r['generated_tokens']:>10.0f} {r['trained_tokens']:>9.0f} {r['carried_tokens']:>8.0f} "
            f"{r['discarded_tokens']:>10.0f} "
            f"{r['generated_per_trained']:>12.2f} {r['resumed_per_step']:>13.1f} {r['resumed_age_mean']:>5.1f}"
        )
    print(
        "tokens over the run: generated is the stub's count (cancelled and interrupted requests included); "
        "carried: held by the last step's interrupted groups; discarded = generated - trained - carried"
    )
    bad = sum(r["not_ok_in_batch"] for r in results.values())
    lines = [
        (
            "median step, reference / oversample",
            f"{speedup:.2f}x",
            f">= {TARGETS['speedup']}x",
            speedup >= TARGETS["speedup"],
        ),
        ("cancelled or failed rollouts in the trainer's batch", f"{bad:.0f}", "0", bad == 0),
    ]
    if "partial" in results:
        part = results["partial"]
        fewer = 1 - part["discarded_tokens"] / over["discarded_tokens"] if over["discarded_tokens"] else float("nan")
        lines += [
            (
                "discarded tokens, partial vs oversample (cancel): fewer by",
                f"{100 * fewer:.0f}%",
                f">= {100 * TARGETS['partial_fewer_discarded']:.0f}%",
                fewer >= TARGETS["partial_fewer_discarded"],
            ),
            (
                "median step, partial / oversample",
                f"{part['median_s'] / over['median_s']:.2f}x",
                "<= 1.00x",
                part["median_s"] <= over["median_s"],
            ),
        ]
    if cancel:
        lines += [
            (
                f"cancel -> connection closed, p50 / p99 ({cancel['rollouts']} in flight)",
                f"{cancel['p50_ms']:.0f} / {cancel['p99_ms']:.0f} ms",
                f"p99 <= {TARGETS['cancel_p99_ms']:.0f} ms",
                cancel["p99_ms"] <= TARGETS["cancel_p99_ms"],
            ),
            (
                "model requests closed by the cancel",
                f"{cancel['closed']} of {cancel['rollouts']}",
                f"{cancel['rollouts']}",
                cancel["closed"] == cancel["rollouts"],
            ),
            ("tasks back as cancelled", json.dumps(cancel["statuses"]), "all", cancel["all_cancelled"]),
        ]
    print()
    print(f"{'figure':<62} {'got':>22} {'target':>16}")
    print("-" * 108)
    for name, got, target, ok in lines:
        print(f"{name:<62} {got:>22} {target:>16}  {'ok' if ok else 'MISSED'}")
    if cancel:
        print(
            f"cancel_run returned in {cancel['cancel_call_ms']:.0f} ms; all {cancel['rollouts']} rollouts back "
            f"in {cancel['all_back_ms']:.0f} ms; slowest close {cancel['max_ms']:.0f} ms"
        )
    out = {"setup": setup, "configs": results, "speedup": speedup, "cancel": cancel, "targets": TARGETS}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"figures written to {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


async def run(args: argparse.Namespace, tmp: Path) -> int:
    from workers.policy.chat import ChatTokenizer
    from workers.policy.serving import default_cache, prepare_model

    started = time.monotonic()
    model_dir = prepare_model(default_cache())
    tok = ChatTokenizer(str(model_dir))
    w = args.call_weight
    stub = StubProcess(
        weather_script(tok),
        latency_s=args.latency,
        latency_dist="lognormal",
        sigma=args.sigma,
        seed=args.seed,
        pick="random",
        weights=[w, 1 - w],
        workdir=tmp,
    ).start()
    namespace = f"bench-{uuid.uuid4().hex[:12]}"
    settings = load_settings(env={}, overrides={"redis_url": args.redis_url, "namespace": namespace})
    configs = [
        Config("reference", 1.0, False),
        Config("oversample", args.oversample, False),
        Config("dynamic", args.oversample, True),
        Config("partial", args.oversample, False, partial=True),
    ]
    setup = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_at_start": os.getloadavg()[0],
        "groups": args.groups,
        "generations": args.generations,
        "steps": args.steps,
        "latency": f"lognormal, median {args.latency} s, sigma {args.sigma}, seed {args.seed}",
        "rewards": f"tool call (reward 1) with p {w}, else a bare answer (0)",
        "workers": f"{args.processes} x `farm worker --agent {AGENT} --concurrency {args.concurrency}`",
        "configs": [asdict(c) for c in configs],
        "max_refills": args.max_refills,
    }
    print(f"$ {setup['command']}")
    for k in ("groups", "generations", "steps", "latency", "rewards", "workers", "max_refills"):
        print(f"  {k}: {setup[k]}")
    print(f"  {setup['cpus']} CPUs, Python {setup['python']}, load at start {setup['load_at_start']:.2f}", flush=True)
    try:
        with WorkerPool(
            args.redis_url,
            namespace,
            AGENT,
            args.processes,
            args.concurrency,
            tmp,
            "step",
            **policy_env(stub.url, "stub", model_dir),
            FARM_POLICY_STREAM="1",  # every config: a turn interrupted midway keeps its ids (partial)
        ) as pool:
            client = FarmClient(settings)
            try:
                await pool.ready(client, timeout_s=120.0)
            finally:
                await client.aclose()
            steps = await asyncio.to_thread(run_steps, settings, tok.tok, configs, args, stub)
            pool.check()
            cancel = None
            if args.cancel_rollouts:
                print(f"cancel latency: {args.cancel_rollouts} rollouts against a {args.slow}s stub", flush=True)
                cancel = await cancel_latency(settings, stub, args.cancel_rollouts, args.slow)
            pool.check()
    finally:
        stub.stop()
        delete_namespace(args.redis_url, namespace)
    setup["load_at_end"] = os.getloadavg()[0]
    setup["runtime_s"] = time.monotonic() - started
    results = {name: summarize(ms) for name, ms in steps.items()}
    path = args.out or ROOT / "bench" / "out" / f"step-{time.strftime('%Y%m%d-%H%M%S')}.json"
    report(setup, results, cancel, path)
    print(f"load at end {setup['load_at_end']:.2f}; runtime {setup['runtime_s']:.0f}s")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--groups", type=int, default=32, help="B: groups a step trains on")
    p.add_argument("--generations", type=int, default=8, help="G: samples per group")
    p.add_argument("--steps", type=int, default=20, help="steps per config")
    p.add_argument("--latency", type=float, default=0.15, help="median model latency, seconds")
    p.add_argument("--sigma", type=float, default=1.0, help="lognormal shape of the model latency")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--call-weight", type=float, default=0.75, help="chance a model answer is the tool call")
    p.add_argument("--oversample", type=float, default=1.25)
    p.add_argument("--max-refills", type=int, default=4)
    p.add_argument("--step-timeout", type=float, default=120.0, help="FarmRollout timeout_s")
    p.add_argument("--processes", type=int, default=2, help="worker processes")
    p.add_argument("--concurrency", type=int, default=512, help="rollouts in flight per worker process")
    p.add_argument("--cancel-rollouts", type=int, default=1024, help="0: skip the cancel latency")
    p.add_argument("--slow", type=float, default=60.0, help="the stub's latency while cancelling, seconds")
    p.add_argument("--out", type=Path, help="JSON of the figures (default bench/out/step-<time>.json)")
    p.add_argument("--quick", action="store_true", help="smoke run: B=8, G=4, 3 steps, 128 cancelled")
    args = p.parse_args(argv)
    if args.quick:
        args.groups, args.generations, args.steps, args.cancel_rollouts = 8, 4, 3, min(args.cancel_rollouts, 128)
        args.latency = min(args.latency, 0.05)
    if args.cancel_rollouts > args.processes * args.concurrency:
        p.error(f"--cancel-rollouts {args.cancel_rollouts} > {args.processes} x {args.concurrency} slots")
    if not 0 < args.call_weight < 1:
        p.error("--call-weight must be in (0, 1)")
    if not answers(args.redis_url):
        raise SystemExit(f"no Redis answers at {args.redis_url}")
    with tempfile.TemporaryDirectory(prefix="farm-bench-step-") as tmp:
        return asyncio.run(run(args, Path(tmp)))


if __name__ == "__main__":
    sys.exit(main())
