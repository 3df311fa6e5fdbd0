"""A Redis that never answered is said at once; an outage after the first answer is waited out.

`redis_down_max_s` (120 s by default) bounds an outage: the time a farm that was working gives
Redis to come back. A process (or client) that has never reached Redis is pointed at the wrong
place, or started before Redis: it exits 3 (raises RedisUnavailable) at once, in one line with the
`farm redis` hint, instead of waiting two minutes to say so (farm.transport.Outage).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis.exceptions as rx

from farm.client import FarmClient
from farm.embedded import EmbeddedRedis
from farm.errors import RedisUnavailable
from farm.settings import load_settings
from farm.transport import Outage

ROOT = Path(__file__).resolve().parent.parent
DOWN_MAX_S = 120.0  # the default bound, set explicitly: none of these may wait it out


def unused_port() -> int:
    """A port nobody listens on (bound, then released: connecting to it is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def farm_env(url: str, namespace: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update(
        FARM_REDIS_URL=url, FARM_NAMESPACE=namespace, FARM_REDIS_DOWN_MAX_S=str(DOWN_MAX_S), PYTHONPATH=str(ROOT)
    )
    return env


def run_farm(args: list[str], url: str, namespace: str, cwd: Path) -> tuple[int, str, float]:
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "farm", *args],
        env=farm_env(url, namespace),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0


def assert_one_line(code: int, out: str, took: float, url: str) -> None:
    assert code == 3, out
    # At once: not after redis_down_max_s (120 s). The bound leaves room for a loaded machine, where
    # starting the CLI alone takes seconds.
    assert took < 30, f"took {took:.1f}s to say Redis is not there\n{out}"
    lines = out.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out, out
    assert lines[0].startswith(f"farm: Redis at {url} unreachable") and "`farm redis`" in lines[0], out


@pytest.mark.slow
def test_a_worker_started_with_no_redis_exits_3_at_once(tmp_path, namespace):
    url = f"redis://127.0.0.1:{unused_port()}/0"
    code, out, took = run_farm(["worker", "--agent", "noop"], url, namespace, tmp_path)
    assert_one_line(code, out, took, url)


@pytest.mark.slow
def test_a_model_backed_worker_checks_redis_before_loading_its_tokenizer(tmp_path, namespace):
    """An agent that calls the policy loads its tokenizer (seconds) at start: Redis is asked first,
    so a Redis never there is said at once, not after the load (4-10 s on a 2-core machine). The
    tokenizer named is missing: loaded first, it would have been the error (exit 2), not Redis."""
    url = f"redis://127.0.0.1:{unused_port()}/0"
    env = farm_env(url, namespace)
    env["FARM_POLICY_URLS"] = f"http://127.0.0.1:{unused_port()}"
    env["FARM_POLICY_TOKENIZER"] = str(tmp_path / "no-tokenizer")
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "farm", "worker", "--agent", "single_tool_call"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - t0
    assert_one_line(proc.returncode, proc.stdout + proc.stderr, took, url)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["collect", "eval"])
def test_a_collect_or_eval_started_with_no_redis_exits_3_at_once(tmp_path, namespace, command):
    """farm eval shares collect's start: Redis is asked first (eval waited out redis_down_max_s before)."""
    url = f"redis://127.0.0.1:{unused_port()}/0"
    rows = tmp_path / "rows.jsonl"
    row = {
        "responses_create_params": {"input": [{"role": "user", "content": "question"}]},
        "agent_ref": {"type": "responses_api_agents", "name": "noop"},
    }
    rows.write_text(json.dumps(row) + "\n")
    code, out, took = run_farm(
        [command, "--input", str(rows), "--output", str(tmp_path / "out.jsonl")], url, namespace, tmp_path
    )
    assert_one_line(code, out, took, url)
    assert not (tmp_path / "out.jsonl").exists() or not (tmp_path / "out.jsonl").read_text()


async def test_a_client_that_never_reached_redis_raises_at_once(namespace):
    url = f"redis://127.0.0.1:{unused_port()}/0"
    settings = load_settings(env={}, overrides={"redis_url": url, "namespace": namespace, "redis_down_max_s": 120})
    async with FarmClient(settings) as client:
        t0 = time.monotonic()
        with pytest.raises(RedisUnavailable, match="farm redis") as caught:
            await client.submit([client.task(run_id="r", agent="noop", row={})])
        assert time.monotonic() - t0 < 5
        assert "has not answered since this process started" in str(caught.value)
        with pytest.raises(RedisUnavailable):  # and the next call says it again, at once
            await client.live_agents()
        assert time.monotonic() - t0 < 5


async def test_an_outage_after_the_first_answer_is_retried_within_its_bound():
    """The negative control of the fail-fast: once Redis has answered, the same error is an outage,
    retried until redis_down_max_s. A callable stands in for Redis to fail on cue (no socket needed)."""
    outage = Outage("redis://127.0.0.1:1/0", base_s=0.01, cap_s=0.05, give_up_s=0.5)
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            return "first answer"
        raise rx.ConnectionError("Connection refused")

    assert await outage.call(flaky, "reading") == "first answer"
    t0 = time.monotonic()
    with pytest.raises(RedisUnavailable, match="unreachable for"):
        await outage.call(flaky, "reading")
    assert 0.4 < time.monotonic() - t0 < 3 and calls > 3


async def test_a_pools_restarted_child_waits_out_an_outage_it_never_saw_begin(monkeypatch):
    """A pool restarts a crashed child with FARM_REDIS_REACHED=1: the pool was running, so a Redis
    that does not answer that child is an outage (retried within the bound), not a Redis that was
    never there; a first child, started without it, is told at once."""
    from workers.supervise.pool import _slot_env

    assert _slot_env({}, 1, restart=True)["FARM_REDIS_REACHED"] == "1"
    assert "FARM_REDIS_REACHED" not in _slot_env({}, 0)

    async def refused() -> str:
        raise rx.ConnectionError("Connection refused")

    monkeypatch.setenv("FARM_REDIS_REACHED", "1")
    outage = Outage("redis://127.0.0.1:1/0", base_s=0.01, cap_s=0.05, give_up_s=0.5)
    t0 = time.monotonic()
    with pytest.raises(RedisUnavailable, match="unreachable for"):
        await outage.call(refused, "reading")
    assert time.monotonic() - t0 > 0.4, "waited out the bound, as for any outage"
    monkeypatch.delenv("FARM_REDIS_REACHED")
    with pytest.raises(RedisUnavailable, match="has not answered since"):
        await Outage("redis://127.0.0.1:1/0", base_s=0.01, cap_s=0.05, give_up_s=0.5).call(refused, "reading")


async def test_a_redis_still_loading_is_waited_for_not_refused():
    """BusyLoadingError is an answer (Redis is replaying its AOF): the first call retries, then succeeds."""
    outage = Outage("redis://127.0.0.1:1/0", base_s=0.01, cap_s=0.05, give_up_s=5)
    calls = 0

    async def loading() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise rx.BusyLoadingError("LOADING Redis is loading the dataset in memory")
        return "ready"

    assert await outage.call(loading, "setting up") == "ready" and calls == 3


@pytest.mark.slow
def test_a_worker_whose_redis_goes_away_after_connecting_retries(tmp_path, namespace):
    """The bounded retry is kept for outages: the worker connected, Redis dies, the worker keeps
    retrying (and warns), and takes work again when Redis is back on the same port."""
    server = EmbeddedRedis(tmp_path / "redis").start()
    url = server.url
    env = farm_env(url, namespace)
    env.update(FARM_LOG_FORMAT="json", FARM_CONNECT_BACKOFF_MAX_S="0.5", FARM_HEARTBEAT_TTL_S="3")
    proc = subprocess.Popen(
        [sys.executable, "-m", "farm", "worker", "--agent", "noop"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    settings = load_settings(env={}, overrides={"redis_url": url, "namespace": namespace})
    try:

        async def live() -> set[str]:
            async with FarmClient(settings) as client:
                return await client.live_agents()

        deadline = time.monotonic() + 30
        while "noop" not in asyncio.run(live()):
            assert time.monotonic() < deadline and proc.poll() is None, "the worker never came up"
            time.sleep(0.2)
        server.proc.kill()
        server.proc.wait()
        time.sleep(3)
        assert proc.poll() is None, "the worker gave up on an outage of 3s (redis_down_max_s is 120s)"
        server.start()  # the same port and data directory

        async def one_task() -> bool:
            async with FarmClient(settings) as client:
                task = client.task(run_id="back", agent="noop", row={})
                await client.submit([task])
                got = await client.collect([task], timeout_s=30)
                return got[task.task_id].ok

        assert asyncio.run(one_task()), "the worker did not take work again once Redis was back"
    finally:
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        server.stop()
    assert "retrying for up to" in out, out[-3000:]
