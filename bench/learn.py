"""Does GRPO through the farm learn? Held-out pass rate before and after a short CPU run.

    python -m bench.learn                      # the defaults: easy mcqa, LoRA, about 40 minutes here
    python -m bench.learn --steps 4 --eval-rows 40 --out /tmp/learn-smoke   # a smoke run
    python -m bench.learn --eval-only          # the before figure alone (same seed, same figure)

One command, on this machine: a vLLM server of its own serving SmolLM2-135M-Instruct (with the
dev endpoints weight sync uses), a `farm worker` pool for the environment against Redis
(FARM_REDIS_URL or 127.0.0.1:6379, a fresh namespace), then

  1. `farm eval` on held-out rows (greedy): the pass rate before, with its 95% interval;
  2. GRPO with TRL through the farm (FarmRollout as rollout_func), LoRA adapters by default,
     the merged weights reloaded into vLLM in place after every step;
  3. `farm eval` on the same held-out rows: the pass rate after.

The environment is mcqa in its easy setting (3 options, capital and largest-number questions,
answered with the line of the chosen option and graded by the option text on it), where the base
model starts at about a third: it writes "A: ..." whatever the question, often with an option
that is not listed, or none. Held-out rows come from another seed, and any row
whose prompt is also a training prompt is dropped from them.

Writes `learn.json` (every figure), `steps.csv` (per step: reward, time split into generation,
weight sync and training) and `learn.png` (training reward per step, and the held-out pass rate
before and after with its interval) under --out.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EASY = {"options": 3, "kinds": ["capital", "largest"], "answer_format": "text"}


def _callback():
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self):
            self.began = 0.0
            self.steps: list[float] = []

        def on_step_begin(self, args, state, control, **kw):
            self.began = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.steps.append(time.perf_counter() - self.began)

    return StepClock()


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="mcqa")
    p.add_argument("--env-options", default=json.dumps(EASY), help="the environment's options, as JSON")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--prompts", type=int, default=4, help="distinct prompts per step")
    p.add_argument("--num-generations", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=12, help="per policy call")
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--lora-r", type=int, default=16, help="LoRA rank; 0 trains every parameter")
    p.add_argument("--rows", type=int, default=480, help="training rows")
    p.add_argument("--eval-rows", type=int, default=300, help="held-out rows")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--oversample", type=float, default=1.0, help="submit this many times the groups a step needs")
    p.add_argument(
        "--drop-zero-variance", action="store_true", help="drop groups whose rewards are all equal and refill"
    )
    p.add_argument(
        "--partial-rollouts",
        action="store_true",
        help="interrupt the groups a step does not take and resume them next step (workers stream completions)",
    )
    p.add_argument("--eval-only", action="store_true", help="only the held-out evaluation of the base model")
    p.add_argument("--out", default=str(ROOT / "bench" / "out" / "learn"))
    return p.parse_args(argv)


def held_out(env, size: int, seed: int, train: list[dict]) -> list[dict]:
    """`size` rows from another seed whose prompts are not training prompts."""
    seen = {json.dumps(r["responses_create_params"], sort_keys=True) for r in train}
    rows: list[dict] = []
    k = 0
    while len(rows) < size:
        for r in env.generate(size, seed=seed + 10_000 + k):
            if json.dumps(r["responses_create_params"], sort_keys=True) not in seen and len(rows) < size:
                seen.add(json.dumps(r["responses_create_params"], sort_keys=True))
                rows.append(r)
        k += 1
    return rows


def evaluate(rows_path: Path, out: Path, env: dict, max_tokens: int) -> dict:
    """`farm eval` (greedy) against the running worker pool; its JSON result."""
    cmd = [sys.executable, "-m", "farm", "eval", "--input", str(rows_path), "--output", str(out)]
    cmd += ["--max-tokens", str(max_tokens), "--temperature", "0", "--json", "--timeout", "600"]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"farm eval failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout)


def start(a, out: Path):
    """The vLLM server, the rows on disk, the worker pool; (server, settings, env, worker, train rows)."""
    from envs.sdk import load_env
    from farm.settings import load_settings
    from workers.policy.serving import PolicyServer, default_cache, prepare_model
    from workers.supervise.stack import policy_env

    model_dir = prepare_model(default_cache())
    redis_url = os.environ.get("FARM_REDIS_URL", "redis://127.0.0.1:6379/0")
    settings = load_settings(env={}, overrides={"redis_url": redis_url, "namespace": f"learn{uuid.uuid4().hex[:6]}"})
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"
    server = PolicyServer(model_dir, max_model_len=1024, log_path=out / "vllm.log").start(timeout_s=600)
    options = json.loads(a.env_options)
    env = load_env(a.env, options)
    train = env.generate(a.rows, seed=a.seed)
    (out / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    heldout = held_out(env, a.eval_rows, a.seed, train)
    (out / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in heldout))
    agents = {a.env: {"env": a.env, "env_options": options, "sampling": {"max_tokens": a.max_tokens}}}
    (out / "workers.yaml").write_text(json.dumps({"agents": agents, "policy_stream": a.partial_rollouts}))
    child = dict(
        os.environ,
        FARM_REDIS_URL=redis_url,
        FARM_NAMESPACE=settings.namespace,
        PYTHONPATH=str(ROOT),
        **policy_env(server.url, server.served_model_name, model_dir),
        FARM_CONFIG=str(out / "workers.yaml"),
    )
    log = open(out / "worker.log", "w")
    worker = subprocess.Popen(
        [sys.executable, "-m", "farm", "worker", "--agent", a.env, "--concurrency", "64"],
        env=child,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return server, settings, child, worker, model_dir


def train(a, out: Path, settings, server, model_dir):
    """GRPO through the farm; (per-step rows, seconds)."""
    from trainer.config import TrainConfig
    from trainer.train import build_trainer
    from trainer.weights import VllmReload

    cfg = TrainConfig(
        model_name=str(model_dir),
        dataset_path=str(out / "train.jsonl"),
        output_dir=str(out / "run"),
        task=f"learn-{a.env}",
        max_steps=a.steps,
        num_generations=a.num_generations,
        per_device_train_batch_size=a.prompts * a.num_generations,
        learning_rate=a.lr,
        max_completion_length=a.max_tokens,
        rollout_timeout_s=600,
        weight_sync_steps=1,
        save_steps=10**6,
        seed=a.seed,
        torch_threads=a.threads,
        lora_r=a.lora_r or None,
        oversample=a.oversample,
        drop_zero_variance_groups=a.drop_zero_variance,
        partial_rollouts=a.partial_rollouts,
    )
    clock = _callback()
    t0 = time.perf_counter()
    trainer, rollout, sync_cb = build_trainer(
        settings, cfg, weight_sync=VllmReload([server.url], out / "weights"), callbacks=[clock]
    )
    try:
        trainer.train()
    finally:
        rollout.close()
    steps = []
    for i, (batch, step_s) in enumerate(zip(rollout.batches, clock.steps), 1):
        scored = [s.reward for s in batch.samples if s.reward is not None]
        gen = batch.metrics["farm/batch_wall_s"]
        sync = sync_cb.syncs[i - 1].save_s + sync_cb.syncs[i - 1].reload_s if i - 1 < len(sync_cb.syncs) else 0.0
        steps.append(
            {
                "step": i,
                "reward_mean": sum(scored) / len(scored) if scored else float("nan"),
                "scored": len(scored),
                "failed": int(batch.metrics["farm/failed"]),
                "groups_cancelled": int(batch.metrics.get("farm/groups/cancelled", 0)),
                "zero_variance_dropped": int(batch.metrics.get("farm/groups/zero_variance_dropped", 0)),
                "tokens_generated": int(batch.metrics.get("farm/tokens/generated", 0)),
                "tokens_trained": int(batch.metrics.get("farm/tokens/trained", 0)),
                "tokens_discarded": int(batch.metrics.get("farm/tokens/discarded", 0)),
                "resumed_in_batch": int(batch.metrics.get("farm/partial/resumed_in_batch", 0)),
                "generation_s": round(gen, 2),
                "sync_s": round(sync, 2),
                "training_s": round(step_s - gen - sync, 2),
                "step_s": round(step_s, 2),
            }
        )
    return steps, time.perf_counter() - t0


def plot(path: Path, steps: list[dict], before: dict, after: dict, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6), gridspec_kw={"width_ratios": [3, 1]})
    xs = [r["step"] for r in steps]
    left.plot(xs, [r["reward_mean"] for r in steps], marker=".", alpha=0.5, label="training reward (per step)")
    k = 5
    if len(steps) >= k:
        ma = [sum(r["reward_mean"] for r in steps[i - k + 1 : i + 1]) / k for i in range(k - 1, len(steps))]
        left.plot(xs[k - 1 :], ma, label=f"moving mean ({k})")
    left.set_xlabel("GRPO step")
    left.set_ylabel("reward")
    left.set_ylim(0, 1)
    left.legend(loc="lower right")
    for i, (name, r) in enumerate((("before", before["overall"]), ("after", after["overall"]))):
        lo, hi = r["ci95"]
        right.errorbar([i], [r["pass_rate"]], yerr=[[r["pass_rate"] - lo], [hi - r["pass_rate"]]], fmt="o", capsize=6)
        right.annotate(f"{100 * r['pass_rate']:.1f}%", (i, r["pass_rate"]), textcoords="offset points", xytext=(8, -3))
    right.set_xticks([0, 1], ["before", "after"])
    right.set_xlim(-0.5, 1.8)
    right.set_ylim(0, 1)
    right.set_title(f"held-out pass rate (n={before['overall']['n']}, 95% CI)", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    a = parse(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup below on `kill`
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    server, settings, child, worker, model_dir = start(a, out)
    try:
        t = time.perf_counter()
        before = evaluate(out / "heldout.jsonl", out / "eval_before.jsonl", child, a.max_tokens)
        eval_before_s = time.perf_counter() - t
        print(f"[learn] before: {json.dumps(before['overall'])} ({eval_before_s:.0f}s)", flush=True)
        if a.eval_only:
            (out / "before.json").write_text(json.dumps(before, indent=2) + "\n")
            return 0
        steps, train_s = train(a, out, settings, server, model_dir)
        t = time.perf_counter()
        after = evaluate(out / "heldout.jsonl", out / "eval_after.jsonl", child, a.max_tokens)
        eval_after_s = time.perf_counter() - t
        print(f"[learn] after: {json.dumps(after['overall'])} ({eval_after_s:.0f}s)", flush=True)
    finally:
        worker.terminate()
        worker.wait(timeout=60)
        server.stop()
    with open(out / "steps.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(steps[0]))
        w.writeheader()
        w.writerows(steps)
    b, c = before["overall"], after["overall"]
    mean = lambda key: round(sum(r[key] for r in steps) / len(steps), 2)  # noqa: E731
    summary = {
        "env": a.env,
        "env_options": json.loads(a.env_options),
        "model": "SmolLM2-135M-Instruct",
        "lora_r": a.lora_r,
        "learning_rate": a.lr,
        "steps": len(steps),
        "samples_per_step": a.prompts * a.num_generations,
        "seed": a.seed,
        "oversample": a.oversample,
        "drop_zero_variance_groups": a.drop_zero_variance,
        "partial_rollouts": a.partial_rollouts,
        "groups_cancelled": sum(r["groups_cancelled"] for r in steps),
        "tokens_generated": sum(r["tokens_generated"] for r in steps),
        "tokens_trained": sum(r["tokens_trained"] for r in steps),
        "tokens_discarded": sum(r["tokens_discarded"] for r in steps),
        "resumed_in_batch": sum(r["resumed_in_batch"] for r in steps),
        "zero_variance_dropped": sum(r["zero_variance_dropped"] for r in steps),
        "heldout_rows": b["n"],
        "pass_before": b["pass_rate"],
        "ci95_before": b["ci95"],
        "pass_after": c["pass_rate"],
        "ci95_after": c["ci95"],
        "gain_points": round(100 * (c["pass_rate"] - b["pass_rate"]), 1),
        "intervals_overlap": c["ci95"][0] <= b["ci95"][1] and b["ci95"][0] <= c["ci95"][1],
        "step_s": {k: mean(k) for k in ("generation_s", "sync_s", "training_s", "step_s")},
        "train_s": round(train_s, 1),
        "eval_s": [round(eval_before_s, 1), round(eval_after_s, 1)],
        "total_s": round(time.perf_counter() - began, 1),
        "training_reward_first_10": round(sum(r["reward_mean"] for r in steps[:10]) / min(10, len(steps)), 3),
        "training_reward_last_10": round(sum(r["reward_mean"] for r in steps[-10:]) / min(10, len(steps)), 3),
    }
    (out / "learn.json").write_text(json.dumps(summary, indent=2) + "\n")
    title = f"SmolLM2-135M, GRPO through the farm on {a.env} (LoRA r={a.lora_r}, {len(steps)} steps, CPU)"
    plot(out / "learn.png", steps, before, after, title)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
