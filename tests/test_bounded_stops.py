"""A stop is bounded whatever Redis is doing: `farm worker` obeys SIGTERM within grace_period_s + 2 s.

Real `farm worker --processes 2` pools against a real redis-server started for the test (AOF,
fsync always), which the tests SIGKILL or SIGSTOP. The rollouts are the noop agent's `sleep_s`:
a stand-in for a model call that is slow, so tasks are in flight when the signal comes.
redis_down_max_s is its default, 120 s: a stop that waited out the outage would show.

The contract (docs/deployment.md): the pool exits within grace_period_s + STOP_MARGIN_S (plus its
poll), with status 0 when every worker settled or handed back what it held, 3 when tasks stay
pending in the group for another worker to reclaim (Redis gone); one line says which, with the
count; no traceback.

The bounds are the farm's own, in wall-clock seconds: the module is `quiet`, so `scripts/test` runs
it after the parallel run, one test at a time. Beside three test processes, two vLLMs and Docker
builds on two cores, a worker that had handed back all it held waited over 2 s for a core to exit
on, and was killed as overdue.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis
from helpers import ROOT
from helpers.redis import make_settings
from helpers.waiting import wait_for
from helpers.workers import spawn_worker

from farm.client import FarmClient
from farm.embedded import EmbeddedRedis
from farm.errors import RedisUnavailable
from farm.keys import GROUP
from farm.settings import Settings
from farm.transport import Outage
from workers.delivery.chores import STOP_MARGIN_S

pytestmark = pytest.mark.quiet

GRACE_S = 2.0
BOUND_S = GRACE_S + STOP_MARGIN_S + 0.5  # the pool's poll and its own exit: the "small margin"
DOWN_MAX_S = "120"  # the default, named: no stop may wait it out
CONCURRENCY = 8
TASKS = 16


# -- the Outage's stop, in one process ----------------------------------------------------------


async def test_a_stopped_outage_ends_its_backoff_at_once_and_retries_nothing():
    """The retry loop a stopping worker sits in (a fetch during an outage) ends when stop() is
    called, not when redis_down_max_s is over; and from then on a failure is not retried."""
    outage = Outage("redis://127.0.0.1:1/0", base_s=30.0, cap_s=30.0, give_up_s=120.0)
    outage.reached = True  # an outage, not a Redis that never answered
    calls = 0

    async def refused() -> None:
        nonlocal calls
        calls += 1
        raise redis.ConnectionError("Connection refused")

    retrying = asyncio.ensure_future(outage.call(refused, "fetching tasks"))
    await asyncio.sleep(0.2)
    assert not retrying.done() and calls == 1, "in its first backoff sleep (15-30 s)"
    t0 = time.monotonic()
    outage.stop(time.monotonic() + 5.0)
    with pytest.raises(RedisUnavailable, match="not retried: the process is stopping"):
        await retrying
    assert time.monotonic() - t0 < 0.5 and calls == 1
    with pytest.raises(RedisUnavailable, match="not retried"):
        await outage.call(refused, "settling rollouts")
    assert calls == 2, "one attempt, no retry"


async def test_a_stopped_outage_bounds_an_attempt_redis_never_answers():
    """A Redis that is SIGSTOPped accepts the connection and never replies: after stop() no attempt
    outlives the deadline, whatever the socket timeout."""
    outage = Outage("redis://127.0.0.1:1/0", base_s=0.01, cap_s=0.05, give_up_s=120.0)
    outage.reached = True
    outage.stop(time.monotonic() + 0.3)
    t0 = time.monotonic()
    with pytest.raises(RedisUnavailable, match="not retried"):
        await outage.call(lambda: asyncio.sleep(60), "renewing leases")
    assert time.monotonic() - t0 < 1.0


# -- real pools, a real Redis -------------------------------------------------------------------


@pytest.fixture
def server(tmp_path):
    s = EmbeddedRedis(tmp_path / "redis", appendfsync="always").start()
    yield s
    if s.proc is not None and s.proc.poll() is None:
        s.proc.send_signal(signal.SIGCONT)
    s.stop()


def start_pool(settings: Settings, **env: str) -> subprocess.Popen:
    return spawn_worker(
        settings,
        "--agent",
        "noop",
        "--processes",
        "2",
        "--concurrency",
        str(CONCURRENCY),
        FARM_GRACE_PERIOD_S=str(GRACE_S),
        FARM_REDIS_DOWN_MAX_S=DOWN_MAX_S,
        **env,
    )


def pending(settings: Settings) -> int:
    r = redis.Redis.from_url(settings.redis_url, socket_timeout=2)
    try:
        return r.xpending(settings.keys.tasks("noop"), GROUP)["pending"]
    except redis.ResponseError:  # no group yet
        return 0
    finally:
        r.close()


def submit(settings: Settings, sleep_s: float) -> list:
    async def main():
        async with FarmClient(settings) as client:
            tasks = [
                client.task(run_id="stops", agent="noop", row={"noop": {"sleep_s": sleep_s}, "i": i})
                for i in range(TASKS)
            ]
            await client.submit(tasks)
            return tasks

    return asyncio.run(main())


def busy_pool(settings: Settings, sleep_s: float) -> tuple[subprocess.Popen, list]:
    """A pool of two workers with all TASKS tasks in flight (CONCURRENCY each)."""
    proc = start_pool(settings)
    tasks = submit(settings, sleep_s)
    wait_for(lambda: pending(settings) == TASKS or proc.poll() is not None, timeout=60, what="tasks in flight")
    assert proc.poll() is None, proc.communicate()[0]
    return proc, tasks


def idle_pool(settings: Settings) -> subprocess.Popen:
    proc = start_pool(settings)
    r = redis.Redis.from_url(settings.redis_url)
    try:
        wait_for(
            lambda: len(r.keys(settings.keys.worker_pattern())) == 2 or proc.poll() is not None,
            timeout=60,
            what="two workers' heartbeats",
        )
    finally:
        r.close()
    assert proc.poll() is None, proc.communicate()[0]
    return proc


def stop_timed(proc: subprocess.Popen, before=None) -> tuple[int, str, float]:
    """SIGTERM the pool (after `before`, if given, and the second it sleeps); its status, output and
    the seconds from the signal to its exit. One that outlives the bound by far is killed."""
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    if before is not None:
        time.sleep(0.5)
        before()
    try:
        out, _ = proc.communicate(timeout=BOUND_S + 20)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"the pool did not exit within {BOUND_S + 20:.0f}s of SIGTERM; killed:\n{out[-3000:]}")
    took = time.monotonic() - t0
    print(f"exit {proc.returncode} {took:.2f}s after SIGTERM")
    return proc.returncode, out, took


def assert_stopped(code: int, out: str, took: float, status: int, left: int) -> None:
    assert took <= BOUND_S, f"exited {took:.1f}s after SIGTERM (bound {BOUND_S:g}s)\n{out[-3000:]}"
    assert code == status, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert f"pool stopped: {left} of 2 workers left tasks pending for reclaim; exit status {status}" in out, out[-3000:]


@pytest.mark.slow
def test_an_idle_pool_stops_at_once_when_redis_is_gone(server, namespace):
    settings = make_settings(server.url, namespace)
    proc = idle_pool(settings)
    server.kill()
    time.sleep(1.0)  # the workers' fetches are retrying: an outage of 1 s, 120 s allowed
    code, out, took = stop_timed(proc)
    assert_stopped(code, out, took, status=0, left=0)  # an idle worker held nothing
    assert out.count("stopped with nothing left pending (0 tasks handed back)") == 2, out[-3000:]


@pytest.mark.slow
def test_a_busy_pool_stops_within_the_bound_when_redis_is_gone_and_leaves_its_tasks_pending(server, namespace):
    settings = make_settings(server.url, namespace)
    proc, _ = busy_pool(settings, sleep_s=60)
    server.kill()
    time.sleep(1.0)
    code, out, took = stop_timed(proc)
    assert_stopped(code, out, took, status=3, left=2)
    assert out.count(f"stopped with {CONCURRENCY} tasks left pending") == 2, out[-3000:]
    server.start()  # the same data: nothing was lost, the tasks wait for reclaim
    assert pending(settings) == TASKS


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_a_busy_pool_whose_redis_dies_during_the_stop_exits_within_the_bound(server, namespace, how):
    """SIGTERM first, then Redis goes: killed (connections refused) or stopped (nothing answers)."""
    settings = make_settings(server.url, namespace)
    proc, _ = busy_pool(settings, sleep_s=60)
    assert server.proc is not None
    gone = server.kill if how == "SIGKILL" else lambda: server.proc.send_signal(signal.SIGSTOP)
    code, out, took = stop_timed(proc, before=gone)
    assert_stopped(code, out, took, status=3, left=2)


@pytest.mark.slow
def test_a_busy_pool_with_redis_up_hands_its_tasks_back_and_another_worker_serves_them(server, namespace):
    settings = make_settings(server.url, namespace)
    proc, tasks = busy_pool(settings, sleep_s=4)  # longer than the grace period
    code, out, took = stop_timed(proc)
    assert_stopped(code, out, took, status=0, left=0)
    assert out.count(f"stopped with nothing left pending ({CONCURRENCY} tasks handed back)") == 2, out[-3000:]
    other = spawn_worker(settings, "--agent", "noop", "--concurrency", str(TASKS))

    async def collect():
        async with FarmClient(settings) as client:
            return await client.collect(tasks, timeout_s=60)

    try:
        got = asyncio.run(collect())
    finally:
        other.terminate()
        rest, _ = other.communicate(timeout=30)
    assert len(got) == TASKS and all(r.ok for r in got.values()), rest[-3000:]
    assert pending(settings) == 0


# -- the pool's own bound -----------------------------------------------------------------------


@pytest.mark.slow
def test_the_pool_kills_a_child_that_outlives_the_bound_and_exits_3(tmp_path):
    """A child that ignores SIGTERM (a worker stuck past its own bound) is SIGKILLed at grace + 2 s:
    the pool waits no longer, and says that what the child held was left for reclaim."""
    child, ready = tmp_path / "child.py", tmp_path / "ready"
    child.write_text(
        textwrap.dedent(f"""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with open({str(ready)!r}, "a") as f:
            f.write("x")
        time.sleep(120)
    """)
    )
    code = (
        "import sys, logging; logging.basicConfig(level=logging.INFO); from workers.supervise.pool import run_pool; "
        f"sys.exit(run_pool([sys.executable, {str(child)!r}], 2, grace_s={GRACE_S}))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    wait_for(lambda: ready.exists() and len(ready.read_text()) == 2, timeout=30, what="two children ignoring SIGTERM")
    code_, out, took = stop_timed(proc)
    assert code_ == 3 and took <= BOUND_S and took >= GRACE_S + STOP_MARGIN_S - 0.1, (took, out)
    assert out.count("still running 2s after the stop; killing it") == 2, out
    assert "pool stopped: 2 of 2 workers left tasks pending for reclaim; exit status 3" in out, out


def test_the_bound_is_the_one_the_docs_state():
    docs = (Path(ROOT) / "docs" / "deployment.md").read_text()
    assert f"grace_period_s + {STOP_MARGIN_S:g} s" in docs
