"""Chaos, bounded to a few minutes: everything that goes wrong in a farm, at once.

Worker processes are SIGKILLed and restarted, one is SIGSTOPped past the visibility timeout
and continued, Redis (AOF, fsync always) is SIGKILLed and restarted on the same data, poison
entries are mixed into the task streams, and the policy server flaps between answering and
HTTP 503. Two agents run: `single_tool_call` against the policy stub (two model turns and a
tool call per rollout) and `noop`, some of whose tasks fail on every attempt.

At the end every task has exactly one rollout at the consumer, every failed rollout carries a
kind and a reason, and the dead letters account for the rest: each always-failing task and
each poison entry is in a dead stream exactly once. The tally is printed.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
from collections import Counter

import pytest
import redis

from farm.client import FarmClient
from farm.embedded import EmbeddedRedis
from farm.keys import GROUP
from farm.schema import ErrorKind
from workers.policy.stub import StubProcess
from workers.policy.stub import weather_rows as stub_rows
from workers.policy.stub import weather_script as script_for
from workers.supervise import stack

from conftest import make_settings, spawn_worker, stop

pytestmark = pytest.mark.slow

POISON = [
    {"v": b"1", "d": b"\x91" * 50_000 + b"\xc0"},
    {"v": b"1", "d": b"\xc1garbage"},
    {"v": b"7", "d": b"\x80"},
    {"x": b"no fields"},
]


def test_chaos_every_task_ends_once_with_a_reason(tmp_path, tokenizer, model_dir):
    rnd = random.Random(7)
    server = EmbeddedRedis(tmp_path / "redis", appendfsync="always").start()
    port = server.port
    settings = make_settings(
        server.url, "chaos", redis_down_max_s=60.0, max_attempts=3, visibility_timeout_s=3.0, lease_renew_s=0.5
    )
    stub = StubProcess(script_for(tokenizer), latency_s=0.05, jitter_s=0.05, workdir=tmp_path).start()
    policy_env = dict(
        **stack.policy_env(stub.url, "stub", model_dir),
        FARM_REDIS_DOWN_MAX_S="60",
        FARM_MAX_ATTEMPTS="3",
        FARM_VISIBILITY_TIMEOUT_S="3.0",
    )

    def start(agent: str):
        if agent == "noop":
            return spawn_worker(
                settings,
                "--agent",
                "noop",
                "--concurrency",
                "16",
                FARM_REDIS_DOWN_MAX_S="60",
                FARM_MAX_ATTEMPTS="3",
                FARM_VISIBILITY_TIMEOUT_S="3.0",
            )
        return spawn_worker(settings, "--agent", "single_tool_call", "--concurrency", "32", **policy_env)

    workers = {f"{agent}{i}": [agent, start(agent)] for agent in ("noop", "single_tool_call") for i in range(2)}
    events: Counter = Counter()
    done = threading.Event()

    def chaos() -> None:
        nonlocal server
        step = 0
        while not done.wait(1.5):
            step += 1
            name = rnd.choice(sorted(workers))
            agent, proc = workers[name]
            if step % 4 == 1:  # kill -9 a worker, start another
                proc.kill()
                proc.communicate()
                workers[name][1] = start(agent)
                events["worker SIGKILL"] += 1
            elif step % 4 == 2:  # freeze one past the visibility timeout
                proc.send_signal(signal.SIGSTOP)
                done.wait(4.0)
                proc.send_signal(signal.SIGCONT)
                events["worker SIGSTOP"] += 1
            elif step % 4 == 3:  # the policy flaps
                stub.control(fault="503", retry_after=0.5)
                done.wait(1.0)
                stub.control(fault=None)
                events["policy 503 burst"] += 1
            else:  # Redis killed and restarted on its AOF
                server.proc.kill()
                server.proc.wait()
                done.wait(1.0)
                server = EmbeddedRedis(tmp_path / "redis", port=port, appendfsync="always").start()
                events["redis SIGKILL + restart"] += 1

    async def produce_and_consume():
        client = FarmClient(settings)
        noop = [
            client.task(
                run_id="chaos",
                agent="noop",
                row={"noop": {"fail": "always"} if i % 25 == 0 else {"sleep_s": rnd.random() * 0.3}},
            )
            for i in range(500)
        ]
        tool = [client.task(run_id="chaos", agent="single_tool_call", row=r) for r in stub_rows(300)]
        tasks = noop + tool
        rnd.shuffle(tasks)
        raw = redis.Redis.from_url(settings.redis_url)
        poisoned = 0
        for i in range(0, len(tasks), 40):  # spread over ~20 s, so the chaos lands mid-run
            await client.submit(tasks[i : i + 40])
            for agent in ("noop", "single_tool_call"):
                await client.outage.call(
                    lambda: asyncio.to_thread(raw.xadd, settings.keys.tasks(agent), POISON[poisoned % len(POISON)]),
                    "poisoning",
                )
                poisoned += 1
            await asyncio.sleep(1.0)
        raw.close()
        got = [r async for r in client.results(tasks, timeout_s=300)]
        duplicates = sum(reader.duplicates for reader in client._readers.values())
        await client.aclose()
        return tasks, got, poisoned, duplicates

    chaos_thread = threading.Thread(target=chaos, daemon=True)
    chaos_thread.start()
    try:
        tasks, got, poisoned, duplicates = asyncio.run(produce_and_consume())
    finally:
        done.set()
        chaos_thread.join(30)
        for agent, proc in workers.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
            stop(proc, timeout=60)
        stub.stop()

    r = redis.Redis.from_url(settings.redis_url)
    try:
        dead = {agent: r.xrange(settings.keys.dead(agent)) for agent in ("noop", "single_tool_call")}
        pending = {
            agent: r.xpending(settings.keys.tasks(agent), GROUP)["pending"] for agent in ("noop", "single_tool_call")
        }
    finally:
        r.close()
        server.stop()

    ids = [x.task_id for x in got]
    kinds = Counter(x.error.kind for x in got if not x.ok)
    always = {t.task_id for t in tasks if t.row.get("noop", {}).get("fail") == "always"}
    letters = [f for agent in dead.values() for _, f in agent]
    letter_kinds = Counter(f[b"kind"].decode() for f in letters)
    print(
        f"\nchaos tally: {len(tasks)} tasks, {len(got)} rollouts at the consumer "
        f"({sum(x.ok for x in got)} ok, {sum(not x.ok for x in got)} failed: {dict(kinds)}), "
        f"{duplicates} duplicate deliveries dropped, {poisoned} poison entries, "
        f"{len(letters)} dead letters {dict(letter_kinds)}, pending left {pending}; chaos: {dict(events)}"
    )

    assert events["worker SIGKILL"] and events["worker SIGSTOP"] and events["policy 503 burst"]
    assert events["redis SIGKILL + restart"]
    assert sorted(ids) == sorted(t.task_id for t in tasks)  # exactly one each
    assert all(x.error.kind in set(ErrorKind) and x.error.message for x in got if not x.ok)
    assert kinds.get("deadline", 0) == 0, kinds  # nothing lost on the way
    failed = {x.task_id for x in got if not x.ok}
    assert failed == always, (failed - always, always - failed)
    # Dead letters: each always-failing task once, each poison entry once; nothing else.
    assert letter_kinds["agent_error"] == len(always)
    unreadable = [f for f in letters if f[b"kind"] in (b"malformed", b"schema_version")]
    assert len(unreadable) == poisoned, letter_kinds
    assert len(letters) == len(always) + poisoned
    assert pending == {"noop": 0, "single_tool_call": 0}
