"""How an untrained model does on the example: the farm's agent loop in this process, no server.

    python examples/trl_envs/baseline.py [--model DIR] [--rows N] [--seed S]

Each row of rows.jsonl goes through the same path a worker takes (the factory environment, the
reset text in the first prompt, the tools, the rewards) with the model sampled by transformers on
the CPU instead of vLLM (no logprobs worth training on: a look at the task, not a rollout source).
The model defaults to SmolLM2-135M-Instruct as `farm policy prepare` saves it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent


class LocalModel:
    """A completion client over a transformers model (the agent loop's CompletionClient)."""

    def __init__(self, path: str, seed: int):
        import torch
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    async def max_model_len(self, session):
        return None

    async def complete(self, prompt_ids, sampling, session):
        from workers.policy.tokens import Completion

        with self.torch.no_grad():
            out = self.model.generate(
                self.torch.tensor([prompt_ids]),
                do_sample=True,
                temperature=sampling.get("temperature") or 1.0,
                max_new_tokens=sampling.get("max_tokens") or 64,
                pad_token_id=self.model.config.eos_token_id,
            )
        ids = out[0, len(prompt_ids) :].tolist()
        return Completion(ids, [0.0] * len(ids), "", "stop", "local", 0.0)

    async def aclose(self):
        return None


async def main(model: str, n: int, seed: int) -> None:
    from envs.sdk import load_env
    from farm.rows import normalize_row
    from farm.schema import Sampling, Task
    from workers.loops.context import AgentContext
    from workers.loops.loop import AgentLoop
    from workers.policy.chat import ChatTokenizer

    options = {
        "factory": "examples.trl_envs.arithmetic:Calculator",
        "reward_funcs": ["examples.trl_envs.arithmetic:correct_answer"],
    }
    env = load_env("environment_factory", options)
    tok = ChatTokenizer(model)
    loop = AgentLoop.over_tokens(env, LocalModel(model, seed), tok)
    rows = [json.loads(line) for line in (HERE / "rows.jsonl").read_text().splitlines()][:n]
    scores: Counter = Counter()
    for row in rows:
        task = Task.new(
            run_id="baseline",
            agent="arithmetic",
            row=normalize_row(row),
            reply_to="x",
            sampling=Sampling(max_tokens=64),
        )
        rollout = await loop.run(task, AgentContext(worker_id="baseline", settings=None))
        scores[rollout.status.value] += 1
        for name, value in rollout.reward_components.items():
            scores[name] += value
        scores["tool_calls"] += rollout.metrics.get("tool_calls", 0)
    print(f"{len(rows)} rows: " + ", ".join(f"{k} {v:g}" for k, v in sorted(scores.items())))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(Path.home() / ".cache/rollout-farm/models/smollm2-135m-instruct"))
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    asyncio.run(main(args.model, args.rows, args.seed))
