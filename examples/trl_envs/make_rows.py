"""Write rows.jsonl: TRL dataset rows for arithmetic.Calculator, the same for the same seed.

    python examples/trl_envs/make_rows.py [--size 32] [--seed 0] [-o examples/trl_envs/rows.jsonl]

Each row is in TRL's shape: a `prompt` (chat messages) and the columns `reset` and the reward
function read (`a`, `b`). `farm data prepare --agent arithmetic` adds the farm's fields.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

QUESTION = "What is the sum of the two numbers below? Answer with the number."


def rows(size: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(size):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        out.append({"prompt": [{"role": "user", "content": QUESTION}], "a": a, "b": b})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--output", default=str(Path(__file__).with_name("rows.jsonl")))
    args = parser.parse_args()
    with open(args.output, "w", encoding="utf-8") as f:
        for row in rows(args.size, args.seed):
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
