"""What a sandbox run costs: runs per second on this machine, the current sandbox beside the previous one.

The reference is the single-module sandbox the farm had before the checks moved out of the
candidate's process (its source read from git, `--reference REV`, default: the commit before
envs/sandbox.py became a package), run in the same process on the same programs, alternating
rounds so both see the same machine. Each round runs `--runs` programs with `--parallel`
concurrent runs (threads: a run is a child process, so the GIL is not the limit): the shipped
code_gen reference solutions, six call-based tests each.

    python bench/sandbox.py [--runs 200] [--parallel 2] [--rounds 3] [--reference REV]

Needs root (the uid drop). Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from envs.code_families import FAMILIES, make_row, reference_solution  # noqa: E402
from envs.sandbox import Limits, run_program  # noqa: E402


def reference_module(rev: str):
    """The previous sandbox, loaded from git as a module of its own."""
    if not rev:
        deleted = subprocess.run(
            ["git", "rev-list", "-1", "HEAD", "--", "envs/sandbox.py"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        rev = f"{deleted}^"
    source = subprocess.run(
        ["git", "show", f"{rev}:envs/sandbox.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    path = Path(tempfile.mkdtemp(prefix="farm-bench-")) / "reference_sandbox.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("reference_sandbox", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["reference_sandbox"] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module, rev


def round_rate(run, limits, jobs: list[tuple[str, dict]], parallel: int) -> tuple[float, int]:
    started = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        results = list(pool.map(lambda job: run(job[0], job[1], limits), jobs))
    wall = time.perf_counter() - started
    return len(jobs) / wall, sum(r.passed == r.total for r in results)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reference", default="", help="git revision of the previous sandbox (default: found)")
    args = p.parse_args()
    if os.geteuid() != 0:
        print("bench/sandbox.py: needs root (the sandbox drops to its own uids)", file=sys.stderr)
        return 2
    rng = random.Random(0)
    rows = [make_row(rng.choice(FAMILIES), rng) for _ in range(args.runs)]
    jobs = [(reference_solution(r), r["verifier_metadata"]["unit_tests"]) for r in rows]
    ref, rev = reference_module(args.reference)
    contenders = {
        "current": (run_program, Limits(wall_s=10)),
        f"reference {rev[:12]}": (ref.run_program, ref.Limits(wall_s=10)),
    }
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, (run, limits) in contenders.items():
            rate, ok = round_rate(run, limits, jobs, args.parallel)
            if ok != len(jobs):
                print(f"{name}: only {ok} of {len(jobs)} reference solutions passed", file=sys.stderr)
                return 1
            rates[name].append(rate)
    print(
        f"sandbox runs per second, {args.runs} code_gen reference solutions x {args.rounds} rounds, "
        f"{args.parallel} at a time, {os.cpu_count()} CPUs"
    )
    print(f"{'sandbox':<28}{'best':>10}{'median':>10}")
    for name, values in rates.items():
        print(f"{name:<28}{max(values):>10.1f}{sorted(values)[len(values) // 2]:>10.1f}")
    print(json.dumps({"runs": args.runs, "parallel": args.parallel, "rates": rates}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
