"""Failover chaos: the Redis master SIGKILLed twice while 20,000 tasks stream through two worker pools.

A primary, a replica and three Sentinels (tests/helpers/sentinel.py) serve the farm through a
`redis+sentinel://` URL; two `farm worker --agent noop --processes 2` pools and a client that
submits the tasks in chunks while it reads their rollouts. Mid-run the master is SIGKILLed and
Sentinel promotes the replica; the killed server comes back as a replica of the new master, and
the new master is SIGKILLed in turn. Run without and with `redis_wait_replicas: 1`.

Asserted, both ways: every submitted task answered exactly once at the consumer (what came twice
was dropped by the reader as a duplicate, and counted), and rollouts flowing again within the
failover's own time + 5 s. The figures (tasks, lost, duplicates suppressed, time to serve again)
are printed; docs/failover.md holds a run's.

A second test measures the window those runs rarely hit: a write acknowledged an instant before
the kill, with and without WAIT.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis
from helpers.processes import farm_process, stop
from helpers.redis import FAST, make_settings
from helpers.sentinel import SentinelCluster

from farm.client import FarmClient

pytestmark = pytest.mark.slow

N = 20_000
CHUNK = 250
RUN = "failover"


def _wait_until(pred, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.02)


@pytest.mark.parametrize("wait_replicas", [0, 1], ids=["no-wait", "wait-1"])
def test_two_failovers_mid_run_lose_no_task(tmp_path, namespace, wait_replicas):
    # Sentinel's down-after at 3 s, not 1 s: a master slowed past it by a busy machine (a CI host
    # running other jobs) would be failed over a third time, unasked, and what its replica had not
    # yet received, with no second replica to WAIT for, would be lost with it.
    cluster = SentinelCluster(tmp_path / "redis", down_after_ms=3000).start()
    knobs = dict(redis_down_max_s=60.0, redis_wait_replicas=wait_replicas)
    settings = make_settings(cluster.url, namespace, **knobs)
    env = {f"FARM_{k.upper()}": str(v) for k, v in {**FAST, **knobs}.items()}
    pools = [
        farm_process(
            ["worker", "--agent", "noop", "--processes", "2", "--concurrency", "64"],
            cluster.url,
            namespace,
            tmp_path / f"pool{i}.log",
            **env,
        )
        for i in range(2)
    ]
    answered: dict[str, int] = {}
    arrivals: list[float] = []
    kills: list[tuple[float, float]] = []  # (when the master was killed, how long Sentinel took)
    done = threading.Event()
    waits = [0]  # WAIT commands run, summed over the masters (each read before it is killed)

    def wait_calls(port: int) -> int:
        return int(cluster.client(port).info("commandstats").get("cmdstat_wait", {}).get("calls", 0))

    def chaos() -> None:
        for share in (0.2, 0.55):
            _wait_until(lambda: len(answered) >= share * N or done.is_set(), 120)
            if done.is_set():
                return
            waits[0] += wait_calls(cluster.master())
            t0 = time.monotonic()
            old = cluster.kill_master()
            kills.append((t0, cluster.wait_failover(old)))
            cluster.start_server(old, replica_of=cluster.master())  # the next failover has a replica
            cluster.wait_replicas(1, timeout=30)

    async def stream() -> tuple[set[str], int]:
        client = FarmClient(settings)
        reader = client.reader(RUN)
        submitted: set[str] = set()
        produced = asyncio.Event()

        async def produce() -> None:
            for _ in range(0, N, CHUNK):
                tasks = [client.task(run_id=RUN, agent="noop", row={"noop": {}}) for _ in range(CHUNK)]
                await client.submit(tasks, check_agents=False)
                submitted.update(t.task_id for t in tasks)
                await asyncio.sleep(0.05)
            produced.set()

        producing = asyncio.create_task(produce())
        last = time.monotonic()
        while time.monotonic() - last < 30:  # stop once all are in, or nothing came for 30 s
            if produced.is_set() and submitted <= answered.keys():
                break
            if await reader.pull(200):
                now = time.monotonic()
                for task_id in list(reader.buffer):
                    reader.take(task_id)
                    answered[task_id] = answered.get(task_id, 0) + 1
                    arrivals.append(now)
                last = now
        await producing
        duplicates = reader.duplicates
        await client.aclose()
        return submitted, duplicates

    thread = threading.Thread(target=chaos, daemon=True)
    thread.start()
    try:
        submitted, duplicates = asyncio.run(stream())
        waits[0] += wait_calls(cluster.master())
    finally:
        done.set()
        thread.join(60)
        for p in pools:
            stop(p, timeout=60)
        cluster.stop()
    outs = [(tmp_path / f"pool{i}.log").read_text() for i in range(len(pools))]
    lost = submitted - answered.keys()
    serve_again = [min((t for t in arrivals if t >= t0 + took), default=float("inf")) - t0 for t0, took in kills]
    print(
        f"\nredis_wait_replicas={wait_replicas}: {len(submitted)} tasks, {len(lost)} lost, "
        f"{duplicates} duplicates suppressed, {waits[0]} WAIT commands, failovers took "
        + ", ".join(f"{took:.1f} s (served again after {again:.1f} s)" for (_, took), again in zip(kills, serve_again))
    )
    assert len(kills) == 2, "the master was killed twice mid-run"
    assert (waits[0] > 0) == (wait_replicas > 0), f"{waits[0]} WAIT commands run"
    assert len(submitted) == N
    assert not lost, f"{len(lost)} submitted tasks never answered"
    assert set(answered.values()) == {1}, "the reader hands each task out once"
    assert set(answered) == submitted, "nothing answered that was not submitted"
    for (_, took), again in zip(kills, serve_again):
        assert again <= took + 5.0, (
            f"rollouts flowed again {again:.1f} s after the kill; the failover took {took:.1f} s"
        )
    for out in outs:
        assert "Traceback" not in out, out[-3000:]


TRIALS = 10


def test_a_write_acknowledged_just_before_the_kill_survives_only_if_its_wait_said_so(tmp_path):
    """Asynchronous replication, measured: an INCR acknowledged an instant before the master is
    SIGKILLed, alternately without and with a WAIT for one replica on its own connection, then the
    promoted replica asked for it. With WAIT, every INCR whose WAIT counted the replica is there
    (asserted); without, the losses are counted and printed (docs/failover.md), not asserted."""
    cluster = SentinelCluster(tmp_path / "redis").start()
    lost = {0: 0, 1: 0}
    counted = 0  # WAITs that counted the replica (one that timed out under load promises nothing)
    refused = 0  # writes refused (the server was no master by then): nothing acknowledged, the trial redone
    try:
        trial = 0
        while trial < 2 * TRIALS:
            wait = trial % 2
            pipe = cluster.client(cluster.settled_master()).pipeline(transaction=False)
            pipe.incr("n")
            if wait:
                pipe.execute_command("WAIT", 1, 5000)
            try:
                replies = pipe.execute()
            except (redis.ReadOnlyError, redis.ConnectionError):  # a failover of Sentinel's own under load
                refused += 1
                assert refused <= 5, "five writes refused: the cluster kept failing over by itself"
                continue
            old = cluster.kill_master()
            cluster.wait_failover(old)
            kept = int(cluster.client(cluster.settled_master()).get("n") or 0) >= replies[0]
            lost[wait] += not kept
            if wait and replies[1] == 1:
                counted += 1
                assert kept, f"trial {trial}: WAIT counted the replica, and the INCR is lost"
            cluster.start_server(old, replica_of=cluster.settled_master())
            cluster.wait_replicas(1, timeout=30)
            trial += 1
    finally:
        cluster.stop()
    print(
        f"\nacknowledged INCRs lost in a failover: {lost[0]} of {TRIALS} without WAIT, "
        f"{lost[1]} of {TRIALS} with WAIT 1 ({counted} of whose WAITs counted the replica); {refused} writes refused "
        "and redone"
    )
    assert counted >= TRIALS // 2, f"only {counted} of {TRIALS} WAITs counted the replica: the check says little"
