"""No CPU-heavy verifier blocks a worker's event loop.

One in-process Worker (the real runtime, against real Redis) serves an environment whose
verifier spins the CPU for a second on some rows and does nothing on others. While the slow
verifications run, a producer thread submits a fast task every 0.1 s, and each fast
rollout's latency (the worker's finish stamp minus the task's creation stamp) is measured.

Through envs/cpu.py's CpuPool the fast rollouts stay within a small bound while the slow
ones run; the same spin run inline in `verify` holds every fast rollout up for as long as it
spins, which shows the measurement can see a blocked loop.

No model is involved, on purpose: the test is about the event loop, so the policy is a stub
that answers at once and the tokenizer a stub that turns any text into a few fixed ids. The
agent loop (workers/loops/loop.py), the worker runtime and Redis are the real ones.
"""

import asyncio
import time

import pytest

from envs.cpu import CpuPool
from envs.sdk import AgentSettings, Environment, Row, Transcript, Verdict
from farm.client import FarmClient
from workers.delivery.runtime import Worker
from workers.loops.loop import AgentLoop
from workers.policy.tokens import Completion

pytestmark = pytest.mark.slow

SPIN_S = 1.0
FAST_EVERY_S = 0.1
BOUND_S = 0.5


def spin(seconds: float) -> float:
    """Burn the CPU (no sleeping, no I/O) for `seconds`; module-level so the pool can run it."""
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1
    return seconds


class SpinRow(Row):
    spin_s: float = 0.0  # CPU seconds the verifier burns


class Spinner(Environment):
    name = "spinner"
    agent = AgentSettings(loop="single_turn", max_steps=1, verify_timeout_s=30)
    row_type = SpinRow

    def __init__(self, pool: CpuPool, inline: bool = False):
        self.pool, self.inline = pool, inline

    async def verify(self, row: SpinRow, state, transcript: Transcript) -> Verdict:
        seconds = row.spin_s
        if seconds and self.inline:
            spin(seconds)  # the mistake: CPU work on the event loop
        elif seconds:
            await self.pool.run(spin, seconds, cpu_s=30)
        return Verdict(reward=1.0, metrics={"spin_s": seconds})


class StubTokenizer:
    eos_id = 0

    def with_tools(self, messages, tools):
        return messages, None

    def prompt_ids(self, messages, tools):
        return [1, 2, 3]

    def decode(self, ids):
        return "done"


class InstantPolicy:
    async def max_model_len(self, session):
        return None

    async def complete(self, prompt_ids, sampling, session):
        return Completion([7, 0], [-0.5, -0.1], "done", "stop", "stub", 0.0)

    async def aclose(self):
        return None


def row(spin_s: float = 0.0) -> dict:
    return {"responses_create_params": {"input": [{"role": "user", "content": "go"}]}, "spin_s": spin_s}


async def produce(settings, n_fast: int):
    """In its own thread and event loop: two slow tasks, then a fast one every FAST_EVERY_S."""
    client = FarmClient(settings)
    try:
        slow = [client.task(run_id="loop", agent="spinner", row=row(SPIN_S)) for _ in range(2)]
        await client.submit(slow, check_agents=False)  # `spinner`'s worker is starting beside this
        await asyncio.sleep(0.2)
        fast = []
        for _ in range(n_fast):
            task = client.task(run_id="loop", agent="spinner", row=row())
            await client.submit([task], check_agents=False)
            fast.append(task)
            await asyncio.sleep(FAST_EVERY_S)
        got = await client.collect(slow + fast, timeout_s=30)
        return [got[t.task_id] for t in slow], [(t, got[t.task_id]) for t in fast]
    finally:
        await client.aclose()


async def measure(settings, inline: bool):
    pool = CpuPool(workers=1)
    await pool.run(spin, 0.0, cpu_s=30)  # start the pool's process before any timing
    agent = AgentLoop.over_tokens(Spinner(pool, inline), InstantPolicy(), StubTokenizer())
    worker = Worker(settings, "spinner", agent, concurrency=8)
    running = asyncio.create_task(worker.run())
    try:
        n_fast = int(2 * SPIN_S / FAST_EVERY_S)
        slow, fast = await asyncio.to_thread(asyncio.run, produce(settings, n_fast))
    finally:
        worker.request_stop()
        await asyncio.wait_for(running, 15)
        pool.close()
    assert all(r.ok for r in slow) and all(r.ok for _, r in fast), [r.error for r in slow]
    latencies = [r.finished_at - t.created_at for t, r in fast]
    return slow, fast, latencies


async def test_cpu_heavy_verifiers_do_not_delay_other_rollouts(settings):
    slow, fast, latencies = await measure(settings, inline=False)
    assert all(r.timings.verify_s >= SPIN_S * 0.9 for r in slow), "the slow verifications really spun"
    start = min(r.finished_at - r.timings.verify_s for r in slow)
    end = max(r.finished_at for r in slow)
    during = [lat for (t, r), lat in zip(fast, latencies) if start < t.created_at and r.finished_at < end]
    assert len(during) >= 10, f"only {len(during)} fast rollouts ran while the slow ones spun"
    assert max(during) < BOUND_S, f"fast rollouts waited up to {max(during):.3f}s behind CPU-heavy verifiers"


async def test_the_same_spin_inline_blocks_the_loop(settings):
    """The control: proves the measurement above sees a blocked event loop when there is one."""
    _, _, latencies = await measure(settings, inline=True)
    assert max(latencies) > BOUND_S, f"inline spinning should hold fast rollouts up; max {max(latencies):.3f}s"
