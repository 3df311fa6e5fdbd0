"""Does GRPO through the farm learn? A short run on an easy environment, reward curve as PNG + CSV.

    python -m bench.learn --env single_tool_call --steps 12 --out bench/out/learn

Starts what it needs on this machine: `farm worker` processes for the environment against
Redis (FARM_REDIS_URL or 127.0.0.1:6379, a fresh namespace), a vLLM server of its own with
the dev endpoints weight sync uses (or --policy-url, which must have VLLM_SERVER_DEV_MODE=1
and must be one you may overwrite), then trains SmolLM2 with GRPOTrainer + FarmRollout,
syncing weights after every step. Time per step is split into generation (the rollout
function's wait for the farm), weight sync, and training (the rest of the step).
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="single_tool_call")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--prompts", type=int, default=4, help="distinct prompts per step")
    p.add_argument("--num-generations", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32, help="per policy call")
    p.add_argument("--max-turns", type=int, default=2, help="policy calls per rollout")
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a busy 2-core box)")
    p.add_argument("--policy-url", default=None)
    p.add_argument("--out", default=str(ROOT / "bench" / "out" / "learn"))
    a = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup below on `kill`
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

    import torch

    from envs.sdk import load_env
    from farm.settings import load_settings
    from trainer.config import TrainConfig
    from trainer.train import build_trainer
    from trainer.weights import VllmReload
    from workers.serving import PolicyServer, default_cache, prepare_model

    torch.set_num_threads(a.threads)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = prepare_model(default_cache())
    redis_url = os.environ.get("FARM_REDIS_URL", "redis://127.0.0.1:6379/0")
    settings = load_settings(env={}, overrides={"redis_url": redis_url, "namespace": f"learn{uuid.uuid4().hex[:6]}"})

    server = None
    if a.policy_url:
        from urllib.parse import urlsplit

        u = urlsplit(a.policy_url)
        server = PolicyServer(model_dir, host=u.hostname, port=u.port, max_model_len=1024)
        own = False
    else:
        os.environ["VLLM_SERVER_DEV_MODE"] = "1"
        server = PolicyServer(model_dir, max_model_len=1024, log_path=out / "vllm.log").start(timeout_s=600)
        own = True

    rows = load_env(a.env).generate(a.rows, seed=a.seed)
    (out / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "workers.yaml").write_text(
        json.dumps(
            {"agents": {a.env: {"env": a.env, "max_steps": a.max_turns, "sampling": {"max_tokens": a.max_tokens}}}}
        )
    )
    env = dict(
        os.environ,
        FARM_REDIS_URL=redis_url,
        FARM_NAMESPACE=settings.namespace,
        PYTHONPATH=str(ROOT),
        FARM_POLICY_URLS=server.url,
        FARM_POLICY_MODEL=server.served_model_name,
        FARM_POLICY_TOKENIZER=str(model_dir),
        FARM_CONFIG=str(out / "workers.yaml"),
    )
    worker = subprocess.Popen(
        [sys.executable, "-m", "farm", "worker", "--agent", a.env, "--concurrency", "16"],
        env=env,
        cwd=ROOT,
        stdout=open(out / "worker.log", "w"),
        stderr=subprocess.STDOUT,
    )
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
    )
    clock = _callback()
    started = time.perf_counter()
    try:
        trainer, rollout, sync_cb = build_trainer(
            settings, cfg, weight_sync=VllmReload([server.url], out / "weights"), callbacks=[clock]
        )
        trainer.train()
        rollout.close()
    finally:
        worker.terminate()
        worker.wait(timeout=60)
        if own:
            server.stop()
    total = time.perf_counter() - started

    lines = []
    for i, (batch, step_s) in enumerate(zip(rollout.batches, clock.steps), 1):
        scored = [s.reward for s in batch.samples if s.reward is not None]
        gen = batch.metrics["farm/batch_wall_s"]
        sync = sync_cb.syncs[i - 1].save_s + sync_cb.syncs[i - 1].reload_s if i - 1 < len(sync_cb.syncs) else 0.0
        lines.append(
            {
                "step": i,
                "reward_mean": sum(scored) / len(scored) if scored else float("nan"),
                "scored": len(scored),
                "failed": int(batch.metrics["farm/failed"]),
                "generation_s": round(gen, 2),
                "sync_s": round(sync, 2),
                "training_s": round(step_s - gen - sync, 2),
                "step_s": round(step_s, 2),
            }
        )
    with open(out / "reward_curve.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(lines[0]))
        w.writeheader()
        w.writerows(lines)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["step"] for r in lines], [r["reward_mean"] for r in lines], marker="o", label="mean env reward")
    k = 3
    if len(lines) >= k:
        ma = [sum(r["reward_mean"] for r in lines[i - k + 1 : i + 1]) / k for i in range(k - 1, len(lines))]
        ax.plot([r["step"] for r in lines[k - 1 :]], ma, label=f"moving mean ({k})")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("reward")
    ax.set_title(f"SmolLM2-135M on {a.env} through the farm")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "reward_curve.png", dpi=120)

    half = max(1, len(lines) // 2)
    first = sum(r["reward_mean"] for r in lines[:half]) / half
    last = sum(r["reward_mean"] for r in lines[-half:]) / half
    mean = lambda key: sum(r[key] for r in lines) / len(lines)  # noqa: E731
    summary = {
        "env": a.env,
        "steps": len(lines),
        "samples_per_step": a.prompts * a.num_generations,
        "reward_first_half": round(first, 3),
        "reward_second_half": round(last, 3),
        "rose": last > first,
        "generation_s_per_step": round(mean("generation_s"), 2),
        "training_s_per_step": round(mean("training_s"), 2),
        "sync_s_per_step": round(mean("sync_s"), 2),
        "total_s": round(total, 1),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
