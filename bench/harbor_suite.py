"""The project's Harbor suite through the farm: `harbor_oracle` and `harbor_nop` on each sandbox backend.

For each backend (docker, local) and each agent, one real `farm worker --agent A --concurrency C`
process and `farm collect` of the whole suite (envs/harbor/suite: rows from `farm data generate
harbor`), as a user runs them. Printed per run: rollouts, the pass rate (the oracle must make 100%,
the nop 0%), failures, the wall time, rollout latency p50/p99, the verifier's time p50/p99 (test.sh
in the sandbox, from the rollouts' `verifier_s`), and the sandboxes left behind once the worker
has stopped (must be 0).

    .venv/bin/python -m bench.harbor_suite [--backends docker,local] [--concurrency 4]

Needs Redis (FARM_REDIS_URL, default 127.0.0.1:6379), the base image (`farm sandbox base`), a
Docker daemon for `docker` and root for `local`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FARM = [sys.executable, "-m", "farm"]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def left(backend: str, namespace: str) -> int:
    if backend == "docker":
        from envs.boxes.docker import DockerBackend

        async def count() -> int:
            b = DockerBackend()
            try:
                return len(await b.list(namespace))
            finally:
                await b.aclose()

        return asyncio.run(count())
    from envs.boxes.local import LocalBackend

    return len(asyncio.run(LocalBackend().list(namespace)))


def run(backend: str, agent: str, concurrency: int, work: Path) -> dict:
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, FARM_NAMESPACE=namespace, FARM_SANDBOX_BACKEND=backend, PYTHONPATH=str(ROOT))
    env.setdefault("FARM_REDIS_URL", "redis://127.0.0.1:6379/0")
    rows, out = work / f"{agent}.jsonl", work / f"{backend}-{agent}.jsonl"
    subprocess.run([*FARM, "data", "generate", "harbor", "--agent", agent, "-o", str(rows)], env=env, check=True,
                   capture_output=True)  # fmt: skip
    worker = subprocess.Popen([*FARM, "worker", "--agent", agent, "--concurrency", str(concurrency)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        t0 = time.monotonic()
        subprocess.run([*FARM, "collect", "--input", str(rows), "--output", str(out), "--no-progress"], env=env,
                       check=True, capture_output=True)  # fmt: skip
        wall = time.monotonic() - t0
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=120)
    got = [json.loads(line)["rollout"] for line in out.open()]
    failed_file = out.with_name(out.stem + "_failures.jsonl")
    failures = [json.loads(line)["rollout"] for line in failed_file.open()] if failed_file.exists() else []
    rewards = [r["reward"] for r in got if r.get("reward") is not None]
    lat = [r["timings"]["total_s"] for r in got if r.get("timings", {}).get("total_s")]
    verify = [r["metrics"]["verifier_s"] for r in got if "verifier_s" in r.get("metrics", {})]
    return {
        "backend": backend,
        "agent": agent,
        "rollouts": len(got) + len(failures),
        "pass": sum(1 for x in rewards if x >= 1.0) / max(1, len(got) + len(failures)),
        "failed": len(failures),
        "wall_s": wall,
        "latency_p50_s": pct(lat, 0.5),
        "latency_p99_s": pct(lat, 0.99),
        "verifier_p50_s": pct(verify, 0.5),
        "verifier_p99_s": pct(verify, 0.99),
        "left": left(backend, namespace),
        "why": [
            f"{f['metrics'].get('task', '?')}: {f['error']['kind']}: {f['error']['message'][:200]}" for f in failures
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="docker,local")
    ap.add_argument("--concurrency", type=int, default=4)
    args = ap.parse_args()
    print(f"{'backend':8} {'agent':14} {'rollouts':>8} {'pass':>6} {'failed':>6} {'wall s':>7} "
          f"{'lat p50':>8} {'lat p99':>8} {'verify p50':>10} {'verify p99':>10} {'left':>5}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            for agent in ("harbor_oracle", "harbor_nop"):
                r = run(backend, agent, args.concurrency, Path(tmp))
                print(
                    f"{r['backend']:8} {r['agent']:14} {r['rollouts']:>8} {r['pass']:>6.0%} {r['failed']:>6} "
                    f"{r['wall_s']:>7.1f} {r['latency_p50_s']:>8.2f} {r['latency_p99_s']:>8.2f} "
                    f"{r['verifier_p50_s']:>10.2f} {r['verifier_p99_s']:>10.2f} {r['left']:>5}",
                    flush=True,
                )
                for why in r["why"]:
                    print(f"  failed: {why}")


if __name__ == "__main__":
    main()
