"""A `verifiers` environment run unchanged as a farm command harness: its rollout, its rubric.

It shows that an environment written for PrimeIntellect's verifiers library trains on the farm
without a port: this script builds a `vf.SingleTurnEnv` over a one-row local dataset made from
the task, lets verifiers' own `run_rollout` call the model through the farm's gateway and score
the answer with a `vf.Rubric`, then reports that reward and each rubric function's score to the
farm. The farm only sees an OpenAI client and a POST to /report.

It runs in .venv-verifiers (scripts/verifiers-venv builds it), never in the farm's venv, so it
imports nothing of the farm. The contract: the task as JSON on stdin; OPENAI_BASE_URL,
OPENAI_API_KEY and FARM_TASK_URL in the environment; the final answer on stdout; a rollout that
verifiers records as failed exits 1 with verifiers' error on stderr, so the farm keeps it as a
failure and not as reward 0. The task's tools are ignored: a single-turn environment has none.

    .venv-verifiers/bin/python examples/harnesses/verifiers_rubric.py < task.json
"""

import asyncio
import json
import os
import sys

import httpx
import verifiers as vf
from datasets import Dataset
from openai import AsyncOpenAI


def contains_answer(parser: vf.Parser, completion: vf.Messages, answer: str) -> float:
    """The reward: the reference answer appears in the final reply (case-insensitive)."""
    return float(answer.strip().lower() in (parser.parse_answer(completion) or "").lower())


def exact_answer(parser: vf.Parser, completion: vf.Messages, answer: str) -> float:
    """A metric (weight 0): the final reply is the reference answer and nothing else."""
    return float((parser.parse_answer(completion) or "").strip() == answer.strip())


RUBRIC_FUNCS = [contains_answer, exact_answer]


def load_environment(task: dict) -> vf.Environment:
    """The task's chat messages (system first, as the farm built them) and the row's answer."""
    dataset = Dataset.from_list([{"prompt": task["messages"], "answer": str(task["row"]["answer"])}])
    return vf.SingleTurnEnv(dataset=dataset, rubric=vf.Rubric(funcs=RUBRIC_FUNCS, weights=[1.0, 0.0]))


async def run(task: dict) -> dict:
    env = load_environment(task)
    openai = AsyncOpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"], max_retries=0)
    client = vf.OpenAIChatCompletionsClient(openai)
    try:
        return await env.run_rollout(env.get_dataset()[0], client, task["model"], dict(task["sampling"]))
    finally:
        await client.close()


def main() -> None:
    task = json.load(sys.stdin)
    output = asyncio.run(run(task))
    if output.get("error"):
        sys.exit(f"verifiers rollout failed: {output['error']['error_chain_repr']}")
    components = {f.__name__: float(output["metrics"][f.__name__]) for f in RUBRIC_FUNCS}
    report = {"reward": float(output["reward"]), "components": components}
    httpx.post(os.environ["FARM_TASK_URL"] + "/report", json=report, timeout=30).raise_for_status()
    print(vf.Parser().parse_answer(output["completion"]) or "")


if __name__ == "__main__":
    main()
