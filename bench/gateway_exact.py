"""Token exactness through the gateway, measured against a running vLLM (the embedded one).

Two figures, side by side with their reference in one run:

  greedy   N single_tool_call rows with two follow-up user turns, batch size 1, temperature 0,
           through the farm's own `multi_turn` loop (the reference) and through an openai-SDK
           loop at the gateway: rollouts whose ids match exactly, the largest logprob gap;
  sampled  M harness rollouts (the plain-SDK harness, examples/harnesses/plain_sdk.py) sampled at
           temperature 1 with 16 in flight: sampled ids in their traces that differ from what
           vLLM returned (the gateway's own count, `retokenized_tokens`), segments, tokens.

    farm policy serve --port 8011 --max-model-len 1024 &
    python bench/gateway_exact.py --policy-url http://127.0.0.1:8011 [--rows 8] [--rollouts 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from envs.single_tool_call import generate  # noqa: E402
from farm.agent_config import AgentConfig  # noqa: E402
from farm.schema import Sampling, Task  # noqa: E402
from farm.settings import load_settings  # noqa: E402
from workers.loops.agent import load_agent  # noqa: E402
from workers.loops.context import AgentContext  # noqa: E402
from workers.policy.serving import default_cache, prepare_model  # noqa: E402

FOLLOW_UPS = ["Thanks. And tomorrow?", "Say it in one word."]


async def run_all(agent, rows, sampling, concurrency):
    gate = asyncio.Semaphore(concurrency)
    ctx = AgentContext("bench", getattr(agent, "farm", None))

    async def one(i, row):
        async with gate:
            task = Task.new(run_id="b", agent="a", row=row, reply_to="farm:results:b", sampling=sampling(i))
            return await agent.run(task, ctx)

    if hasattr(agent, "setup"):
        await agent.setup()
    try:
        return await asyncio.gather(*(one(i, r) for i, r in enumerate(rows)))
    finally:
        await agent.aclose()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy-url", default="http://127.0.0.1:8011")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--rollouts", type=int, default=200)
    a = p.parse_args()
    model = prepare_model(default_cache())
    settings = load_settings(
        overrides={
            "redis_url": "redis://127.0.0.1:6379",
            "policy_urls": [a.policy_url],
            "policy_tokenizer": str(model),
            "agents": {
                "native_turns": AgentConfig(env="single_tool_call", loop="multi_turn"),
                "sdk_turns": AgentConfig(env="single_tool_call", harness="examples.harnesses.follow_ups:run"),
                "via_sdk": AgentConfig(env="single_tool_call", harness="examples.harnesses.plain_sdk:run"),
            },
        }
    )
    rows = [{**r, "follow_up_messages": FOLLOW_UPS} for r in generate(a.rows, seed=3)]
    greedy = lambda i: Sampling(temperature=0.0, max_tokens=24)  # noqa: E731
    t0 = time.perf_counter()
    native = asyncio.run(run_all(load_agent("native_turns", settings), rows, greedy, 1))
    harness = asyncio.run(run_all(load_agent("sdk_turns", settings), rows, greedy, 1))
    same, gap, turns = 0, 0.0, 0
    for n, h in zip(native, harness):
        ids_equal = (
            list(n.trace.prompt()) == list(h.trace.prompt())
            and list(n.trace.completion()) == list(h.trace.completion())
            and n.trace.mask() == h.trace.mask()
            and not h.segments
        )
        same += ids_equal
        if ids_equal:
            gap = max(
                [gap, *(abs(x - y) for x, y in zip(n.trace.completion_logprobs(), h.trace.completion_logprobs()))]
            )
        turns += len(h.trace.turns)
    greedy_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    sampled = asyncio.run(
        run_all(
            load_agent("via_sdk", settings),
            generate(a.rollouts, seed=11),
            lambda i: Sampling(max_tokens=48, seed=i),
            16,
        )
    )
    sampled_s = time.perf_counter() - t0
    ok = [r for r in sampled if r.ok]
    print(f"bench/gateway_exact.py  {time.strftime('%Y-%m-%d')}  {platform.machine()}, {os.cpu_count()} cores")
    print(
        f"greedy   {same}/{len(rows)} rollouts id-identical to the native loop ({turns} model turns), "
        f"largest logprob gap {gap:.2e}  ({greedy_s:.0f}s)"
    )
    print(
        f"sampled  {len(ok)}/{len(sampled)} ok; re-tokenized sampled ids: "
        f"{sum(r.metrics['retokenized_tokens'] for r in ok)} "
        f"of {sum(r.metrics['completion_tokens'] for r in ok)}; segments per rollout: "
        f"{sum(r.metrics['segments'] for r in ok) / max(1, len(ok)):.2f}  ({sampled_s:.0f}s)"
    )


if __name__ == "__main__":
    main()
