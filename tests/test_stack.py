"""LocalStack, the one start-up sequence of `farm up`, `farm collect --embedded`, `farm demo` and the
benchmarks: an embedded Redis of its own, real `farm worker` children, real tasks through them, and
nothing left running afterwards. The negative control: a pool that cannot start is named with its
exit code, and what was already started is stopped all the same."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from helpers import ROOT
from helpers.processes import processes_of
from helpers.redis import FAST
from helpers.waiting import wait_for

from farm import state
from farm.client import FarmClient
from farm.connection import connect_sync
from farm.embedded import free_port
from farm.errors import FarmError
from farm.settings import load_settings
from workers.supervise.stack import LocalStack, Pool, policy_env

CHILD_ENV = {f"FARM_{k.upper()}": str(v) for k, v in FAST.items()} | {"PYTHONPATH": str(ROOT)}


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _embedded_settings(tmp_path: Path, namespace: str):
    """No redis_url, and an embedded port nothing listens on: the stack starts a Redis of its own."""
    port = free_port()
    assert not _listening(port)
    return load_settings(
        env={}, overrides={"namespace": namespace, "embedded_port": port, "data_dir": str(tmp_path / "data"), **FAST}
    ), port


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_local_stack_starts_a_noop_farm_and_stops_all_of_it(tmp_path, namespace):
    settings, port = _embedded_settings(tmp_path, namespace)
    with LocalStack(settings, [Pool("noop", processes=2, concurrency=8)], env=CHILD_ENV, cwd=ROOT) as stack:
        assert stack.settings.redis_url == f"redis://127.0.0.1:{port}/0" and _listening(port)
        assert stack.env["FARM_REDIS_URL"] == stack.settings.redis_url and stack.env["FARM_NAMESPACE"] == namespace
        r = connect_sync(stack.settings)
        live = state.live_workers(r, stack.settings.keys)
        assert len(live) == 2 and live.agents() == {"noop"} and not live.unreadable, live

        async def batch():
            client = FarmClient(stack.settings)
            try:
                tasks = [client.task(run_id="stack", agent="noop", row={}) for _ in range(40)]
                return await client.run_batch(tasks, timeout_s=60)
            finally:
                await client.aclose()

        got = asyncio.run(batch())
        assert len(got) == 40 and all(ro.ok for ro in got.values())
        assert state.queue(r, stack.settings.keys, "noop").counters.get("done") == 40
        r.close()
        procs = list(stack.procs)
        assert len(procs) == 1 and stack.exited() is None
        assert len(processes_of(namespace)) >= 3  # the pool supervisor and its two workers
        assert (tmp_path / "data" / "logs" / "worker-noop.log").exists()
    assert all(p.returncode == 0 for p in procs), [p.returncode for p in procs]  # drained, not killed
    assert not processes_of(namespace), "a worker process outlived the stack"
    wait_for(lambda: not _listening(port), timeout=10, what="the embedded Redis to stop")


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_pool_that_cannot_start_is_named_and_the_rest_is_stopped(tmp_path, namespace):
    settings, port = _embedded_settings(tmp_path, namespace)
    pools = [Pool("noop"), Pool("no_such_agent")]
    with pytest.raises(FarmError) as failed:
        with LocalStack(settings, pools, env=CHILD_ENV, cwd=ROOT, log_prefix="t"):
            pytest.fail("the stack was entered with a pool that exited")
    said = str(failed.value)  # the child's own line, and its exit code (5: an unknown agent, not a crash)
    assert said.startswith(
        "`farm worker --agent no_such_agent --processes 1` exited with 5 before it was ready: "
        "unknown agent 'no_such_agent'; agents: "
    ), said
    assert said.endswith(f"(log in {tmp_path / 'data' / 'logs'})") and failed.value.exit_code == 5, said
    assert "no_such_agent" in (tmp_path / "data" / "logs" / "t-no_such_agent.log").read_text()
    assert not processes_of(namespace), "the pool that did start outlived the failed stack"
    wait_for(lambda: not _listening(port), timeout=10, what="the embedded Redis to stop")


def test_policy_env_is_what_a_worker_reads():
    env = policy_env("http://127.0.0.1:8000", "smol", Path("/models/smol"))
    assert env == {
        "FARM_POLICY_URLS": "http://127.0.0.1:8000",
        "FARM_POLICY_MODEL": "smol",
        "FARM_POLICY_TOKENIZER": "/models/smol",
    }
    s = load_settings(env=env)
    assert (s.policy_urls, s.policy_model, s.policy_tokenizer) == (["http://127.0.0.1:8000"], "smol", "/models/smol")
