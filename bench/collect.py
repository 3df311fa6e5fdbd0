"""What `farm collect` costs: rows/s and peak memory on 100,000 noop rows, 1 vs 2 workers.

The noop agent does no work, so the figures are the producer's own: streaming the input
twice (check, then feed), the submission window, reading and writing every rollout as a
whole JSONL line, and the final metrics pass over the output. Each collection runs as
its own process (`python -m farm collect`), so its
peak RSS is read from the kernel (`os.wait4` rusage of that one child), and its wall time
includes start-up and the metrics pass.

    python bench/collect.py [--redis-url URL] [--rows 100000] [--concurrency 1024]

Each run uses its own namespace and deletes its keys and files afterwards. Workers are
started (and seen alive) before the collection is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import delete_namespace  # noqa: E402
from farm.errors import FarmError  # noqa: E402
from farm.settings import load_settings  # noqa: E402
from workers.supervise.stack import LocalStack, Pool  # noqa: E402


def write_rows(path: Path, n: int) -> None:
    with open(path, "w") as f:
        for i in range(n):
            f.write(
                json.dumps(
                    {
                        "responses_create_params": {"input": [{"role": "user", "content": f"row {i}"}]},
                        "agent_ref": {"type": "responses_api_agents", "name": "noop"},
                        "noop": {"reward": float(i % 2)},
                    }
                )
                + "\n"
            )


def run_once(url: str, rows: Path, out_dir: Path, processes: int, args: argparse.Namespace) -> dict:
    namespace = f"bench-collect-{uuid.uuid4().hex[:10]}"
    settings = load_settings(env={}, overrides={"redis_url": url, "namespace": namespace})
    workers = LocalStack(
        settings,
        [Pool("noop", processes, args.worker_concurrency, label=str(processes))],
        env={"FARM_LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT)},
        log_prefix="workers",
        log_dir=out_dir,
        cwd=ROOT,
        ready_timeout_s=60.0,
    )
    try:
        workers.start()  # on the given Redis: the pool alone
        try:
            workers.wait_live()
        except FarmError as exc:
            raise SystemExit(f"workers did not start: {exc}") from exc
        out = out_dir / f"rollouts-{processes}.jsonl"
        t0 = time.perf_counter()
        collect = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "farm",
                "collect",
                "--input",
                str(rows),
                "--output",
                str(out),
                "--concurrency",
                str(args.concurrency),
                "--no-progress",
            ],
            env=workers.env,
            cwd=ROOT,
        )
        _, status, usage = os.wait4(collect.pid, 0)
        wall = time.perf_counter() - t0
        collect.returncode = os.waitstatus_to_exitcode(status)
        if collect.returncode != 0:
            raise SystemExit(f"farm collect exited with {collect.returncode}")
        metrics = json.loads((out_dir / f"rollouts-{processes}_metrics.json").read_text())
        lines = sum(1 for _ in open(out, "rb"))
        return {
            "workers": processes,
            "rows": lines,
            "wall_s": wall,
            "rows_per_s": lines / wall,
            "collect_loop_rows_per_s": metrics["rollouts_per_s"],
            "peak_rss_mib": usage.ru_maxrss / 1024,
            "peak_outstanding": metrics["peak_outstanding"],
            "output_mib": out.stat().st_size / 2**20,
        }
    finally:
        workers.close()
        delete_namespace(url, namespace)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--redis-url", default=os.environ.get("FARM_REDIS_URL", "redis://127.0.0.1:6379/0"))
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--concurrency", type=int, default=1024, help="farm collect --concurrency (tasks outstanding)")
    p.add_argument("--worker-concurrency", type=int, default=256, help="rollouts per worker process")
    p.add_argument("--processes", default="1,2", help="worker process counts, comma-separated")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-collect-") as tmp:
        tmp_path = Path(tmp)
        rows = tmp_path / "rows.jsonl"
        write_rows(rows, args.rows)
        print(
            f"input: {args.rows:,} noop rows, {rows.stat().st_size / 2**20:.1f} MiB; "
            f"--concurrency {args.concurrency}; worker concurrency {args.worker_concurrency}",
            flush=True,
        )
        results = [run_once(args.redis_url, rows, tmp_path, int(n), args) for n in args.processes.split(",")]
    print(
        f"{'workers':>8} {'rows':>8} {'wall s':>8} {'rows/s':>9} {'loop rows/s':>12} {'peak RSS MiB':>13} "
        f"{'peak outstanding':>17}"
    )
    for res in results:
        print(
            f"{res['workers']:>8} {res['rows']:>8,} {res['wall_s']:>8.2f} {res['rows_per_s']:>9,.0f} "
            f"{res['collect_loop_rows_per_s']:>12,.0f} {res['peak_rss_mib']:>13.1f} {res['peak_outstanding']:>17,}"
        )
    print(json.dumps({"bench": "collect", "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
