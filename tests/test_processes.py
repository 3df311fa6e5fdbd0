"""Crash, drain and restart behaviour with real worker processes and real Redis servers."""

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT
from helpers.processes import stop
from helpers.redis import make_settings
from helpers.waiting import wait_for
from helpers.workers import run_through_worker, spawn_worker, worker_env

from farm.client import FarmClient
from farm.embedded import EmbeddedRedis, free_port
from farm.keys import GROUP

pytestmark = pytest.mark.slow


def rows(n, **noop):
    return [{"responses_create_params": {"input": f"q{i}"}, "noop": dict(noop)} for i in range(n)]


def test_sigkilled_worker_loses_nothing(settings, sync_redis):
    async def main():
        client = FarmClient(settings)
        tasks = [client.task(run_id="kill", agent="noop", row=r) for r in rows(40, sleep_s=0.3)]
        victim = spawn_worker(settings, "--agent", "noop", "--concurrency", "8")
        try:
            await client.submit(tasks)
            reader = client.reader("kill")
            partial = await client.collect(tasks[:4], timeout_s=20)
            assert all(r.ok for r in partial.values())
            pending = sync_redis.xpending(settings.keys.tasks("noop"), GROUP)["pending"]
            assert pending > 0, "the victim should hold tasks in flight when killed"
            victim.kill()
            victim.wait()
            rescuer = spawn_worker(settings, "--agent", "noop", "--concurrency", "8")
            got = partial | await client.collect(tasks[4:], timeout_s=60)
            stop(rescuer)
            return got, reader
        finally:
            if victim.poll() is None:
                victim.kill()
            await client.aclose()

    got, reader = asyncio.run(main())
    assert len(got) == 40
    assert all(r.ok for r in got.values()), [r.error for r in got.values() if not r.ok]
    assert any(r.attempt > 1 for r in got.values()), "some tasks must have been reclaimed from the dead worker"
    assert len({r.worker_id for r in got.values()}) == 2
    stats = sync_redis.hgetall(settings.keys.stats("noop"))
    # one settle per task: nothing done twice, nothing left pending
    assert int(stats[b"done"]) == 40
    assert sync_redis.xpending(settings.keys.tasks("noop"), GROUP)["pending"] == 0
    assert reader.duplicates == 0


def test_sigterm_drains_in_flight_and_leaves_the_rest(settings, sync_redis):
    async def main():
        client = FarmClient(settings)
        tasks = [client.task(run_id="term", agent="noop", row=r) for r in rows(12, sleep_s=1.0)]
        proc = spawn_worker(settings, "--agent", "noop", "--concurrency", "4")
        await client.submit(tasks)
        wait_for(
            lambda: sync_redis.xpending(settings.keys.tasks("noop"), GROUP)["pending"] == 4, what="4 tasks in flight"
        )
        t0 = time.monotonic()
        out = stop(proc)
        elapsed = time.monotonic() - t0
        delivered = sync_redis.xlen(settings.keys.results("term"))
        remaining = sync_redis.xlen(settings.keys.tasks("noop")) + sync_redis.llen(settings.keys.queue("noop", "term"))
        proc2 = spawn_worker(settings, "--agent", "noop", "--concurrency", "8")
        got = await client.collect(tasks, timeout_s=30)
        stop(proc2)
        await client.aclose()
        return proc.returncode, out, elapsed, delivered, remaining, got

    code, out, elapsed, delivered, remaining, got = asyncio.run(main())
    assert code == 0, out
    assert delivered == 4, "the 4 in-flight rollouts finish within the grace period"
    assert elapsed < 5
    assert remaining == 8, "unstarted tasks stay queued (or in the stream) for other workers"
    assert len(got) == 12 and all(r.ok for r in got.values())
    assert "worker stopped" in out


def test_redis_restart_with_aof_loses_no_acknowledged_work(tmp_path):
    port = free_port()
    server = EmbeddedRedis(tmp_path / "redis", port=port, appendfsync="always").start()
    settings = make_settings(server.url, "restart")
    proc = spawn_worker(settings, "--agent", "noop", "--concurrency", "8")

    async def main():
        client = FarmClient(settings)
        tasks = [client.task(run_id="rs", agent="noop", row=r) for r in rows(300, sleep_s=0.02)]
        await client.submit(tasks)
        reader = client.reader("rs")
        before = await client.collect(tasks[:60], timeout_s=30)
        server.kill()  # a crash: only what reached the AOF survives
        time.sleep(1.0)
        server.start()
        got = before | await client.collect(tasks[60:], timeout_s=90)
        await client.aclose()
        return before, got, reader

    try:
        before, got, reader = asyncio.run(main())
        assert proc.poll() is None, "the worker survives the outage and reconnects by itself"
        out = stop(proc)
        assert proc.returncode == 0, out
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop()
    assert all(r.ok for r in before.values())
    assert len(got) == 300 and all(r.ok for r in got.values()), [r.error for r in got.values() if not r.ok][:3]
    # with appendfsync always, nothing acknowledged before the crash is run again
    assert reader.duplicates == 0
    assert "retrying in" in out or "failed" in out, "the outage should be visible in the worker's log"


def test_process_pool_runs_and_stops_all_children(settings, sync_redis):
    proc = spawn_worker(settings, "--agent", "noop", "--processes", "2", "--concurrency", "4")
    try:
        wait_for(
            lambda: len(list(sync_redis.scan_iter(match=f"{settings.namespace}:worker:*"))) == 2,
            what="two worker heartbeats",
        )

        async def main():
            client = FarmClient(settings)
            tasks = [client.task(run_id="pool", agent="noop", row=r) for r in rows(200, sleep_s=0.01)]
            got = await client.run_batch(tasks, timeout_s=30)
            await client.aclose()
            return got

        got = asyncio.run(main())
        assert len(got) == 200 and all(r.ok for r in got.values())
        assert len({r.worker_id for r in got.values()}) == 2
        status = subprocess.run(
            [sys.executable, "-m", "farm", "status", "--json"],
            env=worker_env(settings),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert status.returncode == 0, status.stderr
        import json

        data = json.loads(status.stdout)
        assert data["agents"]["noop"]["counters"]["done"] == 200
        assert len(data["workers"]) == 2
        assert data["agents"]["noop"]["pending"] == 0
    finally:
        out = stop(proc, timeout=30)
    assert proc.returncode == 0, out
    wait_for(
        lambda: not list(sync_redis.scan_iter(match=f"{settings.namespace}:worker:*")),
        what="heartbeats removed on exit",
    )


def test_unknown_agent_is_refused_at_start(settings):
    proc = subprocess.run(
        [sys.executable, "-m", "farm", "worker", "--agent", "no_such_agent"],
        env=worker_env(settings),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 5  # EXIT_UNKNOWN_AGENT: a supervisor does not restart it
    assert "unknown agent 'no_such_agent'" in proc.stderr and "noop" in proc.stderr


def test_bad_setting_is_refused_with_its_source(settings):
    env = worker_env(settings, FARM_MAX_ATTEMPTS="many")
    proc = subprocess.run(
        [sys.executable, "-m", "farm", "status"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 2 and "FARM_MAX_ATTEMPTS" in proc.stderr


def test_demo_runs_end_to_end(settings):
    env = worker_env(settings)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "farm",
            "demo",
            "--noop",
            "--tasks",
            "300",
            "--processes",
            "1",
            "--concurrency",
            "16",
            "--timeout",
            "60",
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rollouts_per_s" in proc.stdout and "300" in proc.stdout


def farm_redis(port: int, data_dir) -> subprocess.Popen:
    """`farm redis` in the foreground on `port`, its output captured."""
    return subprocess.Popen(
        [sys.executable, "-m", "farm", "redis", "--port", str(port), "--data-dir", str(data_dir)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_farm_redis_runs_in_the_foreground_with_aof(tmp_path):
    import redis as redis_lib

    from farm.embedded import free_port

    port = free_port()
    proc = farm_redis(port, tmp_path)
    try:
        r = redis_lib.Redis(port=port)
        wait_for(lambda: _ping(r), what="farm redis to answer")
        assert r.config_get("appendonly")["appendonly"] == "yes"
        assert r.config_get("bind")["bind"] == "127.0.0.1"
        r.xadd("farm:tasks:x", {"v": "1"})
    finally:
        out = stop(proc)
    assert proc.returncode == 0, out
    assert f"127.0.0.1:{port}" in out
    assert any(p.name.startswith("farm.aof") for p in (tmp_path / "redis").iterdir())


def test_farm_redis_stopped_while_it_starts_stops_its_server_and_exits_0(tmp_path):
    """A SIGTERM that comes while `farm redis` starts its server (an orchestrator's stop, or a test
    that stops it as soon as it answers) stops the server and exits 0; it killed the command before."""
    import signal

    from farm.embedded import free_port

    port = free_port()
    proc = farm_redis(port, tmp_path)

    def server_child():
        try:
            kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        except OSError:
            return None
        return next((int(k) for k in kids if b"redis-server" in Path(f"/proc/{k}/cmdline").read_bytes()), None)

    try:
        child = wait_for(server_child, timeout=30, every=0.001, what="the redis-server child")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    wait_for(lambda: not Path(f"/proc/{child}").exists(), timeout=10, what="the redis-server gone")


def test_farm_redis_takes_its_password_from_a_file_and_keeps_secrets_off_argv_and_disk(tmp_path):
    """The password never reaches a command line (any process can read those), logs or the banner;
    data, AOF, config and log are the farm's alone (0600 in a 0700 directory)."""
    import redis as redis_lib

    from farm.embedded import free_port

    secret = "pw-" + os.urandom(8).hex()
    pw_file = tmp_path / "pw"
    pw_file.write_text(secret + "\n")
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "farm",
            "redis",
            "--port",
            str(port),
            "--data-dir",
            str(tmp_path / "data"),
            "--password-file",
            str(pw_file),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        r = redis_lib.Redis(port=port, password=secret)
        wait_for(lambda: _ping(r), what="farm redis to answer")
        r.set("k", "v")
        with pytest.raises(redis_lib.AuthenticationError):
            redis_lib.Redis(port=port).get("k")
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    assert secret.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    pass
        data = tmp_path / "data" / "redis"
        assert data.stat().st_mode & 0o777 == 0o700
        files = [p for p in data.rglob("*") if p.is_file()]
        assert files and all(p.stat().st_mode & 0o077 == 0 for p in files), [(p, oct(p.stat().st_mode)) for p in files]
        assert not any(secret in p.read_text(errors="ignore") for p in files if p.name == "redis.log")
    finally:
        out = stop(proc)
    assert proc.returncode == 0, out
    assert secret not in out and ":***@127.0.0.1" in out


def _ping(r):
    try:
        return r.ping()
    except Exception:
        return False


def test_json_logs_carry_structured_fields():
    import json
    import logging

    from farm.logs import JsonFormatter

    record = logging.LogRecord("farm.worker", logging.INFO, __file__, 1, "task done %s", ("x",), None)
    record.task_id = "abc"
    line = json.loads(JsonFormatter().format(record))
    assert line["msg"] == "task done x" and line["task_id"] == "abc" and line["level"] == "INFO"


@pytest.mark.vllm
def test_worker_runs_an_environment_against_real_vllm(settings, vllm, model_dir):
    """A few real rollouts through Redis, a `farm worker` process and the embedded vLLM."""
    from envs.single_tool_call import generate
    from farm.schema import Sampling

    got = run_through_worker(
        settings, vllm, model_dir, "single_tool_call", generate(4, seed=3), sampling=Sampling(max_tokens=24)
    )
    assert len(got) == 4
    for r in got:
        assert r.status.value in ("ok", "truncated"), r.error
        assert r.reward in (0.0, 1.0) and set(r.reward_components) == {"called_tool", "right_city"}
        n = len(r.trace.completion())
        assert n > 0 and len(r.trace.completion_logprobs()) == n
        assert r.timings.model_s > 0 and r.worker_id.startswith("single_tool_call@")


def test_worker_without_a_policy_url_says_how_to_get_one(settings):
    proc = subprocess.run(
        [sys.executable, "-m", "farm", "worker", "--agent", "single_tool_call"],
        env=worker_env(settings),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "FARM_POLICY_URLS" in proc.stderr
