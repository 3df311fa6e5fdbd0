"""A cancel stops the generation on the real vLLM server, not only the farm's wait for it.

A real `farm worker` runs single_tool_call rows against the session's vLLM with `ignore_eos`
(an agent sampling override), so each generation runs to max_tokens, the ~980 tokens the
1,024-token context leaves. Alone on this machine vLLM generates that in about 3 s for three
requests at once (the control window of 4 s then saw them end by themselves), so eight run at
once, which keeps each going well past the 2 s control window. vLLM's own Prometheus metrics
are the evidence. The shared server is started without `--enable-log-requests`, so it logs no
"Aborted request(s) ..." line; the metrics show the abort instead: `vllm:num_requests_running` falls to 0 and
`vllm:generation_tokens_total` stops growing, seconds after the cancel, where the uncancelled
control window before it shows the same requests running and producing tokens.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request

import pytest
import yaml
from helpers.processes import stop
from helpers.waiting import async_wait_for
from helpers.workers import spawn_worker

from envs.single_tool_call import generate
from farm.client import FarmClient
from farm.keys import GROUP
from farm.schema import ErrorKind, Sampling, Status
from workers.supervise.stack import policy_env

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

N = 8
CONTROL_S = 2.0  # how long the uncancelled generations are watched running
STOPPED_WITHIN_S = 3.0  # from the cancel to vLLM running nothing


def metric(url: str, name: str) -> float:
    """The sum of a metric's samples over its labels, read from vLLM's /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        body = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


def test_a_cancelled_generation_is_aborted_on_the_vllm_server(settings, vllm, model_dir, tmp_path, sync_redis):
    config = tmp_path / "farm.yaml"
    config.write_text(
        yaml.safe_dump({"agents": {"single_tool_call": {"env": "single_tool_call", "sampling": {"ignore_eos": True}}}})
    )
    env = policy_env(vllm.url, vllm.served_model_name, model_dir)
    proc = spawn_worker(
        settings, "--agent", "single_tool_call", "--concurrency", str(N), FARM_CONFIG=str(config), **env
    )

    def running() -> float:
        return metric(vllm.url, "vllm:num_requests_running")

    def tokens() -> float:
        return metric(vllm.url, "vllm:generation_tokens_total")

    async def main():
        client = FarmClient(settings)
        sampling = Sampling(max_tokens=3000, temperature=1.0)  # capped to the 1024-token context
        rows = generate(N, seed=1)
        tasks = [client.task(run_id="long", agent="single_tool_call", row=r, sampling=sampling) for r in rows]
        await async_wait_for(lambda: running() == 0, timeout=60, every=0.5, what="the shared vLLM to be idle")
        await client.submit(tasks)
        await async_wait_for(lambda: running() >= N, timeout=60, every=0.2, what=f"{N} generations running")

        # The negative control: left alone, the generations go on running and producing tokens.
        before = tokens()
        watched = time.monotonic() + CONTROL_S
        while time.monotonic() < watched:
            assert running() >= N, "a generation ended by itself: the control cannot tell a cancel from an end"
            await asyncio.sleep(0.25)
        assert tokens() > before

        t0 = time.monotonic()
        report = await client.cancel(tasks)
        got = await client.collect(tasks, timeout_s=10)
        settled = time.monotonic() - t0
        await async_wait_for(lambda: running() == 0, timeout=STOPPED_WITHIN_S, every=0.1, what="vLLM running nothing")
        stopped = time.monotonic() - t0
        frozen = tokens()
        await asyncio.sleep(1.0)
        await client.aclose()
        return report, got, settled, stopped, frozen, tokens()

    try:
        report, got, settled, stopped, frozen, later = asyncio.run(main())
    finally:
        out = stop(proc, timeout=30)
    print(f"\ncancelled rollouts after {settled:.2f}s; vLLM running nothing after {stopped:.2f}s")
    assert proc.returncode == 0, out
    assert len(report.open) == N
    for r in got.values():
        assert r.status is Status.cancelled and r.error.kind is ErrorKind.cancelled, r.error
        assert r.error.message.startswith("cancelled after "), r.error.message
    assert settled < STOPPED_WITHIN_S, f"cancelled rollouts took {settled:.2f}s"
    assert later == frozen, f"vLLM generated {later - frozen:.0f} tokens after the cancel"
    keys = settings.keys
    assert sync_redis.xpending(keys.tasks("single_tool_call"), GROUP)["pending"] == 0
    stats = {k.decode(): int(v) for k, v in sync_redis.hgetall(keys.stats("single_tool_call")).items()}
    assert stats.get("cancelled") == N and not stats.get("done"), stats
