"""A worker as `farm worker` runs it (a process), or the asyncio Worker in the test's own event loop,
and rows through a worker process to a policy server: an environment's smoke test."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from typing import TYPE_CHECKING, Callable

from farm.settings import Settings
from helpers import ROOT
from helpers.processes import stop
from helpers.redis import FAST
from workers.supervise.stack import policy_env

if TYPE_CHECKING:
    from farm.schema import Rollout, Sampling


def worker_env(settings: Settings, **extra: str) -> dict:
    env = dict(os.environ, FARM_REDIS_URL=settings.redis_url, FARM_NAMESPACE=settings.namespace, PYTHONPATH=str(ROOT))
    for k, v in FAST.items():
        env[f"FARM_{k.upper()}"] = str(v)
    env.update(extra)
    return env


def spawn_worker(settings: Settings, *args: str, **env: str) -> subprocess.Popen:
    """A real worker process, as `farm worker` would run it."""
    return subprocess.Popen(
        [sys.executable, "-m", "farm", "worker", *args],
        env=worker_env(settings, **env),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_through_worker(
    settings: Settings,
    policy,
    model_dir,
    agent: str,
    rows: list[dict],
    *,
    sampling: Sampling | Callable[[int], Sampling] | None = None,
    timeout_s: float = 240.0,
    **env: str,
) -> list[Rollout]:
    """Rows through Redis to a real `farm worker --agent <agent>` process and a policy server.

    The environment's smoke test: one worker (4 concurrent rollouts) pointed at `policy` (the
    shared vLLM, or a workers/policy/stub StubProcess: anything with a `url` and a
    `served_model_name`), every row submitted as a task of one group, the rollouts
    returned in row order once all are in; the worker must then drain and exit 0. `sampling` is
    the tasks' sampling, or a function of the row's index (to seed each row), or None for the
    default; `env` adds to the worker's environment (FARM_CONFIG, for one).
    """
    from farm.client import FarmClient

    proc = spawn_worker(
        settings,
        "--agent",
        agent,
        "--concurrency",
        "4",
        **policy_env(policy.url, policy.served_model_name, model_dir),
        **env,
    )
    try:

        async def main():
            client = FarmClient(settings)
            tasks = [
                client.task(
                    run_id=agent,
                    agent=agent,
                    row=r,
                    group_id="g",
                    sample_index=i,
                    sampling=sampling(i) if callable(sampling) else sampling,
                )
                for i, r in enumerate(rows)
            ]
            got = await client.run_batch(tasks, timeout_s=timeout_s)
            await client.aclose()
            return [got[t.task_id] for t in tasks]

        got = asyncio.run(main())
    finally:
        out = stop(proc, timeout=60)
    assert proc.returncode == 0, out
    assert len(got) == len(rows)
    return got


@contextlib.asynccontextmanager
async def in_process_worker(settings: Settings, concurrency: int = 8, agent: str = "noop"):
    """The asyncio Worker with the noop agent, in this test's event loop; stopped (drained) on exit."""
    from workers.delivery.runtime import Worker
    from workers.loops.noop import NoopAgent

    w = Worker(settings, agent, NoopAgent(), concurrency=concurrency)
    task = asyncio.create_task(w.run())
    try:
        yield w
    finally:
        w.request_stop()
        await asyncio.wait_for(task, 30)
