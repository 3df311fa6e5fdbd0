"""Chaos, bounded to a few minutes: everything that goes wrong in a farm, at once.

Worker processes are SIGKILLed and restarted, one is SIGSTOPped past the visibility timeout
and continued, Redis (AOF, fsync always) is SIGKILLed and restarted on the same data, poison
entries are mixed into the task streams, and the policy server flaps between answering and
HTTP 503. Two agents run: `single_tool_call` against the policy stub (two model turns and a
tool call per rollout) and `noop`, some of whose tasks fail on every attempt. Each agent's tasks
are split between two runs sharing its workers (farm.fairness): `chaos-a` with share 3 and
`chaos-b` with share 1 and a cap on its tasks in flight per agent.

At the end every task has exactly one rollout at its run's consumer (none lost, none
duplicated, none even dropped as a duplicate by the reader), every failed rollout carries a
kind and a reason, and the dead letters account for the rest: each always-failing task and
each poison entry is in a dead stream exactly once. The fair-share bookkeeping is back to
empty: every run's in-flight count returned to 0 through the kills and restarts (no `flight:R`
field left; with it the runs' shares and caps, so the runs hash is empty), nothing is queued
(no queue, backlog or fair zset entry). The tally is printed, per run.
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
from helpers.processes import stop
from helpers.redis import make_settings
from helpers.workers import spawn_worker

from farm.client import FarmClient
from farm.embedded import EmbeddedRedis
from farm.keys import GROUP, text
from farm.schema import ErrorKind
from workers.policy.stub import StubProcess
from workers.policy.stub import weather_rows as stub_rows
from workers.policy.stub import weather_script as script_for
from workers.supervise import stack

pytestmark = pytest.mark.slow

POISON = [
    {"v": b"1", "d": b"\x91" * 50_000 + b"\xc0"},
    {"v": b"1", "d": b"\xc1garbage"},
    {"v": b"7", "d": b"\x80"},
    {"x": b"no fields"},
]
AGENTS = ("noop", "single_tool_call")
# Two runs on both agents: chaos-a gets three times chaos-b's slots while both have a backlog,
# and chaos-b never has more than CAP tasks in flight per agent (but for promoted retries).
CAP = 8
RUNS = {"chaos-a": {"share": 3.0, "max_in_flight": 0}, "chaos-b": {"share": 1.0, "max_in_flight": CAP}}
# A run's in-flight count is exactly the number of its entries in the agent's task stream (FEED
# and PROMOTE add an entry with `r` and count it, SETTLE and RETRY delete it and uncount it, each
# in one script), so the two are compared at once, in one script, while the chaos runs: a count
# that leaks or goes below the truth shows at once, not only in what is left at the end.
# KEYS: tasks stream, runs hash. ARGV: runs. Returns per run: its entries in the stream, flight:R.
IN_FLIGHT = """
local n = {}
for _, e in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do
  local f = e[2]
  for j = 1, #f - 1, 2 do
    if f[j] == 'r' then n[f[j + 1]] = (n[f[j + 1]] or 0) + 1 end
  end
end
local out = {}
for _, run in ipairs(ARGV) do
  out[#out + 1] = n[run] or 0
  out[#out + 1] = tonumber(redis.call('HGET', KEYS[2], 'flight:' .. run)) or 0
end
return out
"""


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
        runs = sorted(RUNS)  # every other task of each agent in each run; always-failing ones in both
        noop = [
            client.task(
                run_id=runs[i % 2],
                agent="noop",
                row={"noop": {"fail": "always"} if i % 25 == 0 else {"sleep_s": rnd.random() * 0.3}},
            )
            for i in range(500)
        ]
        tool = [client.task(run_id=runs[i % 2], agent="single_tool_call", row=r) for i, r in enumerate(stub_rows(300))]
        tasks = noop + tool
        rnd.shuffle(tasks)
        raw = redis.Redis.from_url(settings.redis_url)
        poisoned = 0
        for i in range(0, len(tasks), 40):  # spread over ~20 s, so the chaos lands mid-run
            for run, fair in RUNS.items():
                await client.submit([t for t in tasks[i : i + 40] if t.run_id == run], **fair)
            for agent in AGENTS:
                await client.outage.call(
                    lambda: asyncio.to_thread(raw.xadd, settings.keys.tasks(agent), POISON[poisoned % len(POISON)]),
                    "poisoning",
                )
                poisoned += 1
            await asyncio.sleep(1.0)
        raw.close()
        got = [r async for r in client.results(tasks, timeout_s=300)]
        duplicates = {run: client.reader(run).duplicates for run in RUNS}
        await client.aclose()
        return tasks, got, poisoned, duplicates

    most_in_flight: Counter = Counter()  # (agent, run): the highest in-flight count seen
    checks: Counter = Counter()  # the in-flight invariant: how often it was checked
    broken: list = []  # and when it did not hold: (agent, run, entries in the stream, flight:R)

    def watch_flight() -> None:  # Redis may be down for a while: skip those checks
        r = redis.Redis.from_url(settings.redis_url, socket_timeout=1.0, socket_connect_timeout=1.0)
        while not done.wait(0.25):
            try:
                for agent in AGENTS:
                    counts = r.eval(IN_FLIGHT, 2, settings.keys.tasks(agent), settings.keys.runs(agent), *RUNS)
                    for run, (entries, flight) in zip(RUNS, zip(counts[::2], counts[1::2])):
                        most_in_flight[(agent, run)] = max(most_in_flight[(agent, run)], flight)
                        if entries != flight:
                            broken.append((agent, run, entries, flight))
                    checks[agent] += 1
            except redis.RedisError:
                pass
        r.close()

    threads = [threading.Thread(target=chaos, daemon=True), threading.Thread(target=watch_flight, daemon=True)]
    for thread in threads:
        thread.start()
    try:
        tasks, got, poisoned, duplicates = asyncio.run(produce_and_consume())
    finally:
        done.set()
        for thread in threads:
            thread.join(30)
        for agent, proc in workers.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
            stop(proc, timeout=60)
        stub.stop()

    r = redis.Redis.from_url(settings.redis_url)
    try:
        dead = {agent: r.xrange(settings.keys.dead(agent)) for agent in AGENTS}
        pending = {agent: r.xpending(settings.keys.tasks(agent), GROUP)["pending"] for agent in AGENTS}
        # The fair-share bookkeeping, once everything settled and every worker stopped.
        runs_left = {
            agent: {text(k): text(v) for k, v in r.hgetall(settings.keys.runs(agent)).items()} for agent in AGENTS
        }
        queues_left = {text(k): r.llen(k) for k in r.scan_iter(match=f"{settings.keys.ns}:queue:*", count=1000)}
        backlog_left = {agent: r.llen(settings.keys.backlog(agent)) for agent in AGENTS}
        fair_left = {agent: r.zrange(settings.keys.fair(agent), 0, -1, withscores=True) for agent in AGENTS}
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
        f"{sum(duplicates.values())} duplicate deliveries dropped, {poisoned} poison entries, "
        f"{len(letters)} dead letters {dict(letter_kinds)}, pending left {pending}; chaos: {dict(events)}"
    )
    per_run = {}
    for run, fair in RUNS.items():
        mine = [t for t in tasks if t.run_id == run]
        theirs = [x for x in got if x.run_id == run]
        counts = Counter(x.task_id for x in theirs)
        wanted = {t.task_id for t in mine}
        per_run[run] = {
            "lost": len(wanted - set(counts)),
            "duplicated": sum(n - 1 for n in counts.values()) + duplicates[run],
            "stray": len(set(counts) - wanted),
        }
        print(
            f"  {run} (share {fair['share']:g}, max_in_flight {fair['max_in_flight']}): "
            + ", ".join(f"{agent} {sum(t.agent_ref.name == agent for t in mine)}" for agent in AGENTS)
            + f" tasks; {len(theirs)} rollouts ({sum(x.ok for x in theirs)} ok, {sum(not x.ok for x in theirs)} "
            f"failed), {per_run[run]['lost']} lost, {per_run[run]['duplicated']} duplicated "
            f"({duplicates[run]} dropped by the reader); most in flight seen: "
            + ", ".join(f"{agent} {most_in_flight[(agent, run)]}" for agent in AGENTS)
        )
    print(f"  in flight == entries in the stream: checked {dict(checks)} times, broken {len(broken)} times")
    print(f"  fair share left: runs {runs_left}, queues {queues_left}, backlog {backlog_left}, fair {fair_left}")

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
    # Per run: exactly one rollout per task at its run's consumer, none dropped as a duplicate.
    assert per_run == {run: {"lost": 0, "duplicated": 0, "stray": 0} for run in RUNS}
    assert all(most_in_flight[(agent, run)] > 0 for agent in AGENTS for run in RUNS), most_in_flight
    assert min(checks[agent] for agent in AGENTS) >= 20, checks
    assert broken == [], broken[:20]  # in flight == the run's entries in the stream, all along
    # Fair share: every in-flight count back to 0 (no flight:R field left), nothing queued.
    flights = {
        agent: {k: v for k, v in fields.items() if k.startswith("flight:")} for agent, fields in runs_left.items()
    }
    assert flights == {agent: {} for agent in AGENTS}, runs_left
    assert runs_left == {agent: {} for agent in AGENTS}, "no share, cap or count left for a run that ended"
    assert not any(queues_left.values()), queues_left
    assert backlog_left == {agent: 0 for agent in AGENTS}
    assert fair_left == {agent: [] for agent in AGENTS}
