"""The worker's health probe against real processes: `farm worker --health-port` serves /healthz and
/readyz, `farm health` asks them (Docker's HEALTHCHECK, exec probes), and `farm up` gives each pool
its own port.

- a live worker is ok; with its Redis stopped it is not (HTTP 503, `farm health` exit 1, one line),
  and it is ok again once Redis is back;
- a blocked event loop (as a verifier that never yields would block it) makes the heartbeat stale:
  503 from the probe's own thread, then ok once the loop runs again;
- a stopping worker is not ready while it drains, but still alive (no restart mid-rollout);
- the command's errors are one line, with the exit codes Docker reads (0 healthy, 1 unhealthy).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from helpers import ROOT
from helpers.processes import error_line, farm_process, stop
from helpers.redis import make_settings
from helpers.waiting import async_wait_for, wait_for

from farm.embedded import EmbeddedRedis, free_port

pytestmark = pytest.mark.slow


def probe(port: int, path: str = "/healthz") -> tuple[int, dict]:
    """GET a worker's health endpoint: (HTTP status, JSON body)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def answers(port: int, path: str = "/healthz", status: int = 200):
    """For wait_for: the body when the endpoint answers `status`, else None (not up yet, or another status)."""
    try:
        code, body = probe(port, path)
    except (urllib.error.URLError, OSError):
        return None
    return body if code == status else None


def farm(*args: str, env: dict | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    return subprocess.run(
        [sys.executable, "-m", "farm", *args],
        cwd=ROOT,
        env={**base, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_line(err: str) -> str:
    return error_line(err)


def consecutive_free_ports(n: int) -> int:
    """A port P with P .. P+n-1 all free now."""
    for _ in range(50):
        base = free_port()
        socks = []
        try:
            for port in range(base, base + n):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise AssertionError(f"no {n} consecutive free ports")


@pytest.mark.timeout(90)
def test_health_is_ok_for_a_live_worker_and_not_ok_while_its_redis_is_down(tmp_path):
    server = EmbeddedRedis(tmp_path / "redis").start()
    hp = free_port()
    fast = dict(FARM_HEARTBEAT_TTL_S="3", FARM_REDIS_DOWN_MAX_S="60", FARM_CONNECT_BACKOFF_MAX_S="0.5")
    worker = farm_process(
        ["worker", "--agent", "noop", "--health-port", str(hp)], server.url, "hz", tmp_path / "w.log", **fast
    )
    try:
        body = wait_for(lambda: answers(hp), timeout=30, what="the worker's /healthz to answer 200")
        assert body["ok"] is True and body["agent"] == "noop" and body["checks"] == {"redis": True, "heartbeat": True}
        assert 0 <= body["heartbeat_age_s"] <= 3
        ready = wait_for(lambda: answers(hp, "/readyz"), timeout=10, what="/readyz")
        assert ready["checks"] == {"redis": True, "heartbeat": True, "running": True, "agent_ready": True}
        ok = farm("health", "--port", str(hp))
        assert ok.returncode == 0 and ok.stderr == "", ok
        assert re.fullmatch(
            rf"ok: http://127\.0\.0\.1:{hp}/healthz answered 200: noop@\S+ heartbeat \d+\.\ds ago\n", ok.stdout
        ), ok.stdout

        server.stop()  # the worker lives on (it retries for redis_down_max_s), but it cannot work
        down = wait_for(lambda: answers(hp, status=503), timeout=10, what="/healthz to answer 503")
        assert down["ok"] is False and down["checks"] == {"redis": False}
        assert down["reason"].startswith("redis unreachable: cannot reach Redis at redis://127.0.0.1:"), down
        assert answers(hp, "/readyz", 503)["reason"].startswith("redis unreachable:")
        bad = farm("health", "--port", str(hp))
        assert bad.returncode == 1 and bad.stdout == "", bad
        assert one_line(bad.stderr).startswith(
            f"farm: not healthy: http://127.0.0.1:{hp}/healthz answered 503: noop@"
        ), bad.stderr
        assert "redis unreachable: cannot reach Redis" in bad.stderr
        assert worker.poll() is None

        server = EmbeddedRedis(tmp_path / "redis", port=server.port).start()  # back: the worker beats again
        wait_for(lambda: answers(hp), timeout=20, what="/healthz to answer 200 again")
        assert farm("health", "--port", str(hp), "--ready").returncode == 0
    finally:
        worker.terminate()
        worker.wait(30)
        server.stop()
    assert worker.returncode == 0, (tmp_path / "w.log").read_text()
    gone = farm("health", "--port", str(hp))
    assert gone.returncode == 1 and "no answer from" in one_line(gone.stderr), gone.stderr


@pytest.mark.timeout(60)
async def test_health_is_not_ok_while_the_worker_event_loop_is_blocked(redis_url, namespace):
    """In process, because the loop must be blocked from inside: as a verifier that never yields blocks it.
    The probe's own thread keeps answering, with 503, and the worker recovers once the loop runs again."""
    from workers.delivery.health import HealthServer
    from workers.delivery.runtime import Worker
    from workers.loops.noop import NoopAgent

    s = make_settings(redis_url, namespace, heartbeat_ttl_s=1.0)
    hp = free_port()
    w = Worker(s, "noop", NoopAgent(), concurrency=2)
    server = HealthServer(w, hp).start()
    run = asyncio.create_task(w.run())
    try:
        await async_wait_for(lambda: answers(hp), timeout=15, what="/healthz to answer 200")
        seen: dict = {}
        prober = threading.Thread(target=lambda: (time.sleep(1.8), seen.update(answer=probe(hp))))
        prober.start()
        time.sleep(3.5)  # blocks the event loop: no heartbeat for 3.5 x heartbeat_ttl_s
        prober.join()
        code, body = seen["answer"]
        assert code == 503 and body["checks"] == {"redis": True, "heartbeat": False}, body
        assert body["reason"].startswith("heartbeat stale: none in Redis"), body
        await async_wait_for(lambda: answers(hp), timeout=10, what="/healthz to recover")
    finally:
        w.request_stop()
        await asyncio.wait_for(run, 30)
        server.close()


@pytest.mark.timeout(60)
def test_readyz_is_not_ok_while_a_stopping_worker_drains_and_healthz_still_is(tmp_path, redis_url, namespace):
    from farm.client import FarmClient

    settings = make_settings(redis_url, namespace)
    hp = free_port()
    worker = farm_process(
        ["worker", "--agent", "noop", "--health-port", str(hp)],
        redis_url,
        namespace,
        tmp_path / "w.log",
        FARM_GRACE_PERIOD_S="20",
    )
    try:
        wait_for(lambda: answers(hp, "/readyz"), timeout=30, what="/readyz to answer 200")

        async def slow_task():
            client = FarmClient(settings)
            task = client.task(run_id="drain", agent="noop", row={"noop": {"sleep_s": 4}})
            waiter = asyncio.ensure_future(client.run_batch([task], timeout_s=30))
            await asyncio.to_thread(wait_for, lambda: (answers(hp) or {}).get("inflight") == 1, 10)
            worker.send_signal(signal.SIGTERM)
            draining = await asyncio.to_thread(wait_for, lambda: answers(hp, "/readyz", 503), 5)
            alive = answers(hp)
            got = await waiter
            await client.aclose()
            return draining, alive, got[task.task_id]

        draining, alive, rollout = asyncio.run(slow_task())
        assert draining["reason"] == "stopping: draining in-flight rollouts, fetching no new tasks", draining
        assert draining["checks"]["running"] is False and draining["inflight"] == 1
        assert alive is not None and alive["ok"] is True  # alive while it drains: no restart mid-rollout
        assert rollout.status.value == "ok"
        worker.wait(30)
    finally:
        out = stop(worker)
    assert worker.returncode == 0, out + (tmp_path / "w.log").read_text()


def test_health_command_errors_are_one_line_with_the_exit_code_docker_reads():
    none = farm("health")
    assert none.returncode == 2
    assert one_line(none.stderr) == (
        "farm: no health port: pass --port, or set FARM_HEALTH_PORT (the worker's --health-port)"
    )
    port = free_port()
    nothing = farm("health", "--port", str(port), "--ready")
    assert nothing.returncode == 1
    assert one_line(nothing.stderr).startswith(f"farm: not healthy: no answer from http://127.0.0.1:{port}/readyz ("), (
        nothing.stderr
    )
    assert farm("health", env={"FARM_HEALTH_PORT": str(port)}).returncode == 1
    debug = farm("--debug", "health", "--port", str(port))
    assert debug.returncode == 1 and "Traceback" in debug.stderr


def test_worker_with_a_health_port_in_use_fails_at_start_in_one_line(tmp_path, redis_url, namespace):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = farm(
            "worker",
            "--agent",
            "noop",
            "--health-port",
            str(port),
            env={"FARM_REDIS_URL": redis_url, "FARM_NAMESPACE": namespace},
        )
    assert out.returncode == 2, out
    assert one_line(out.stderr) == (
        f"farm: cannot serve the health port 127.0.0.1:{port} (Address already in use): pick another "
        "--health-port (FARM_HEALTH_PORT)"
    )


@pytest.mark.timeout(90)
def test_farm_up_gives_each_pool_its_own_health_port(tmp_path, redis_url, namespace):
    config = tmp_path / "up.yaml"
    config.write_text(
        "agents:\n  other: {env: single_tool_call}\n"
        "up:\n  redis: external\n  workers:\n    noop: 1\n    other: {processes: 2, impl: noop}\n"
    )
    hp = consecutive_free_ports(3)
    up = farm_process(
        ["up", "-f", str(config)],
        redis_url,
        namespace,
        tmp_path / "up.log",
        FARM_HEALTH_PORT=str(hp),
        FARM_DATA_DIR=str(tmp_path / "data"),
    )
    try:
        agents = [wait_for(lambda p=p: answers(p), timeout=60, what=f"port {p}")["agent"] for p in (hp, hp + 1, hp + 2)]
        assert agents == ["noop", "other", "other"]
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(60)
    assert up.returncode == 0, (tmp_path / "up.log").read_text()
