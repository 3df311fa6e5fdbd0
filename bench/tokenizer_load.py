"""What loading the policy's tokenizer costs a process that starts (a worker, a policy stub): CPU
seconds of a fresh python that imports the worker's modules and builds its ChatTokenizer, with
AutoTokenizer deciding the class (the first load of a model directory, and every load before
workers/policy/tokenizer_load.py) and with the class remembered, side by side in the same run.

    .venv/bin/python -m bench.tokenizer_load [--model DIR] [--runs 5]

The model is the prepared SmolLM2 (`farm policy prepare`) unless --model names another directory.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import sys
import farm.cli, workers.loops.agent
from workers.policy.chat import ChatTokenizer
ChatTokenizer(sys.argv[1])
print("torch" in sys.modules)
"""


def run_once(model: str, cache: str) -> tuple[float, bool]:
    """CPU seconds (user + system) of one fresh process, and whether it imported torch."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "XDG_CACHE_HOME": cache, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", PROBE, model], env=env, capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, out.stdout.strip() == "True"


def main() -> None:
    from workers.policy.serving import default_cache, prepare_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a model directory (default: the prepared SmolLM2)")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    model = args.model or str(prepare_model(default_cache()))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            cold = os.path.join(tmp, f"cold{i}")  # an empty memo: AutoTokenizer decides
            rows.append(("AutoTokenizer decides", *run_once(model, cold)))
            rows.append(("class remembered", *run_once(model, cold)))  # the memo the run above wrote
    print(f"tokenizer load in a fresh process ({model}, {args.runs} runs each, alternating)")
    for label in ("AutoTokenizer decides", "class remembered"):
        cpus = [cpu for name, cpu, _ in rows if name == label]
        torch = {t for name, _, t in rows if name == label}
        print(
            f"  {label:22s} median {statistics.median(cpus):5.2f} CPU-s  (min {min(cpus):.2f}, max {max(cpus):.2f})"
            f"  imports torch: {'yes' if torch == {True} else 'no' if torch == {False} else 'sometimes'}"
        )


if __name__ == "__main__":
    main()
