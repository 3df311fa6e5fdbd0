"""Redis under Sentinel: the redis+sentinel:// URL, clients that follow the master, passwords, and
the WAIT that holds a settle's acknowledgement until a replica has it (docs/failover.md).

The URL tests need no server; the others start a primary, a replica and three Sentinels
(tests/helpers/sentinel.py), so they are slow.
"""

from __future__ import annotations

import asyncio
import signal
from collections import Counter

import pytest
import redis
from helpers.redis import consumer_with_tasks, make_settings
from helpers.sentinel import SERVICE, SentinelCluster
from helpers.waiting import wait_for

from farm import schema
from farm.connection import Durability, answers, connect, connect_sync, durability_of, parse_sentinel
from farm.errors import ConfigError, RedisAuthError, RedisUnavailable
from farm.keys import GROUP
from farm.schema import Status
from farm.scripts import SETTLED
from farm.settler import Settler
from farm.transport import Outage, errors, is_transient, mapped, redact


def test_sentinel_urls_parse_into_sentinels_service_and_db():
    u = parse_sentinel("redis+sentinel://10.0.0.1:26379,[::1]:26380, sentinel-c:26381/mymaster/3")
    assert u.sentinels == (("10.0.0.1", 26379), ("::1", 26380), ("sentinel-c", 26381))
    assert (u.service, u.db, u.username, u.password) == ("mymaster", 3, None, None)
    u = parse_sentinel("redis+sentinel://farm:p%40ss:w@h:1/svc")
    assert (u.service, u.db, u.username, u.password) == ("svc", 0, "farm", "p@ss:w")
    assert parse_sentinel("redis+sentinel://:pw@h:1/svc/").password == "pw"


@pytest.mark.parametrize(
    "url, says",
    [
        ("redis+sentinel://h:1", "names no service"),
        ("redis+sentinel://h:1/", "names no service"),
        ("redis+sentinel://h:1/svc/0/extra", "'extra' after /SERVICE/DB"),
        ("redis+sentinel://h:1/svc/zero", "'zero' is not a number"),
        ("redis+sentinel://h/svc", "'h' is not host:port"),
        ("redis+sentinel://h:1,,h:2/svc", "an empty entry"),
        ("redis+sentinel://:secret@h:99999/svc", "'h:99999' is not host:port"),
        ("redis+sentinel://:secret@/svc", "is not host:port"),
    ],
)
def test_a_bad_sentinel_url_is_one_line_without_its_password(url, says):
    with pytest.raises(ConfigError) as info:
        parse_sentinel(url)
    text = str(info.value)
    assert says in text and "\n" not in text and "secret" not in text, text


def test_settings_take_sentinel_urls_and_connect_refuses_a_bad_one_in_one_line():
    good = make_settings("redis+sentinel://127.0.0.1:26379/mymaster", "s")
    assert good.redis_url.startswith("redis+sentinel://")
    with pytest.raises(ConfigError, match="names no service"):
        connect(make_settings("redis+sentinel://127.0.0.1:26379", "s"))


def test_redact_hides_a_sentinel_urls_password():
    url = "redis+sentinel://farm:hunter2@a:26379,b:26380/mymaster/0"
    assert redact(url) == "redis+sentinel://farm:***@a:26379,b:26380/mymaster/0"
    assert redact("redis+sentinel://:hunter2@a:1/m") == "redis+sentinel://:***@a:1/m"
    assert redact("redis+sentinel://a:1,b:2/m") == "redis+sentinel://a:1,b:2/m"
    assert redact("redis://:pw@[::1]:6379/0") == "redis://:***@[::1]:6379/0"


def test_readonly_inside_a_script_is_transient_not_a_script_failure():
    """A settle script that a demoted master runs fails with READONLY inside the script: an outage
    to wait out (the master moved), not a broken script."""
    exc = redis.ResponseError(
        "Error running script (call to f_d2): @user_script:1: @user_script: 1: "
        "-READONLY You can't write against a read only replica."
    )
    assert is_transient(exc)
    assert type(mapped(exc, "u")).__name__ == "RedisUnavailable"
    other = redis.ResponseError("Error running script (call to f_d2): @user_script:3: bad argument")
    assert not is_transient(other) and type(mapped(other, "u")).__name__ == "RedisScriptError"


@pytest.fixture
def cluster(tmp_path):
    c = SentinelCluster(tmp_path).start()
    yield c
    c.stop()


@pytest.mark.slow
async def test_clients_from_a_sentinel_url_reach_the_master_and_follow_a_failover(cluster, namespace):
    settings = make_settings(cluster.url, namespace)
    assert answers(settings)
    sync = connect_sync(settings)
    sync.set(f"{namespace}:k", "v")
    assert cluster.client(cluster.master()).get(f"{namespace}:k") == b"v", "written on the master"
    sync.close()
    r = connect(settings)
    outage = Outage.for_settings(settings)

    async def durable_incr() -> list:  # WAIT on the INCR's own connection: the replica has it before the kill
        pipe = r.pipeline(transaction=False)
        pipe.incr(f"{namespace}:n")
        pipe.execute_command("WAIT", 1, 2000)
        return await pipe.execute()

    assert await outage.call(durable_incr, "counting") == [1, 1]
    old = cluster.kill_master()
    cluster.wait_failover(old)
    assert await outage.call(lambda: r.incr(f"{namespace}:n"), "counting") == 2, "the replica had it"
    assert r.connection_pool.master_address[1] == cluster.master() != old
    await r.aclose()


@pytest.mark.slow
async def test_answers_is_false_when_no_sentinel_names_the_master(cluster, namespace):
    nobody = make_settings(cluster.url.replace(SERVICE, "unknown"), namespace)
    assert not answers(nobody)
    with pytest.raises(RedisUnavailable) as info, errors(nobody.redis_url):
        connect_sync(nobody).ping()
    hosts = ",".join(f"127.0.0.1:{p}" for p in cluster.sentinels)
    assert f"no Sentinel at {hosts} names a master for 'unknown'" in str(info.value)
    assert "<redis" not in str(info.value), "the Sentinels by address, not their clients' reprs"
    r = connect(nobody)
    with pytest.raises(redis.ConnectionError, match="names a master for 'unknown'"):
        await r.ping()
    await r.aclose()


def _failover_started(sentinel: redis.Redis) -> bool:
    try:
        return bool(sentinel.execute_command("SENTINEL", "FAILOVER", SERVICE))
    except redis.ResponseError as exc:  # NOGOODSLAVE: it has not yet heard from the replica
        if "NOGOODSLAVE" not in str(exc):
            raise
        return False


@pytest.mark.slow
async def test_a_demoted_master_still_answering_sends_the_settler_to_the_new_one(cluster, namespace):
    """SENTINEL FAILOVER demotes a live master: the pool's connection to it answers the settle
    script with READONLY; the Settler drops it and the Outage's next try settles on the new master."""
    settings = make_settings(cluster.url, namespace)
    r, stream, tasks, ids = await consumer_with_tasks(settings, 2)
    settler = Settler(r, Outage.for_settings(settings))
    settler.start()
    ok = [
        stream.reply_op(i, schema.Rollout.for_task(t, status=Status.ok, reward=1.0), t.reply_to)
        for i, t in zip(ids, tasks)
    ]
    assert await settler.run(ok[0]) == SETTLED
    # Every replica has the stream and its group before the failover: Redis replicates asynchronously, so
    # a replica promoted before it caught up has no group (NOGROUP), which is not what this test is about.
    assert await r.wait(len(cluster.replica_ports), 5000) == len(cluster.replica_ports)
    old = cluster.master()
    sentinel = redis.Redis(host="127.0.0.1", port=next(iter(cluster.sentinels)))
    wait_for(lambda: _failover_started(sentinel), what="a Sentinel that knows a replica to promote")
    cluster.wait_failover(old)
    wait_for(lambda: cluster.client(old).info("replication")["role"] == "slave", what="the old master demoted")
    assert await asyncio.wait_for(settler.run(ok[1]), 20) == SETTLED
    assert settler.counters == Counter(done=2)
    assert cluster.client(cluster.master()).xlen(tasks[1].reply_to) == 2, "both rollouts on the new master"
    await settler.close()
    await r.aclose()


@pytest.mark.slow
async def test_a_settle_script_meeting_readonly_is_retried_until_the_server_is_a_master(cluster, namespace):
    """A settle sent to a replica (a master demoted without its clients being cut off) fails inside
    the script with READONLY: that is an outage, retried by the Outage, and the settle goes through
    once the server is a master again; never a script failure that leaves the task unsettled."""
    primary = make_settings(f"redis://127.0.0.1:{cluster.master()}/0", namespace)
    r, stream, [task], [entry_id] = await consumer_with_tasks(primary, 1)
    op = stream.reply_op(entry_id, schema.Rollout.for_task(task, status=Status.ok, reward=1.0), task.reply_to)
    assert await r.wait(1, 2000) == 1, "the replica has the pending task"
    replica_port = cluster.replica_ports[0]
    on_replica = make_settings(f"redis://127.0.0.1:{replica_port}/0", namespace)
    r2 = connect(on_replica)
    outage = Outage.for_settings(on_replica)
    await outage.call(r2.ping, "pinging")
    settler = Settler(r2, outage)
    settler.start()
    settling = asyncio.create_task(settler.run(op))
    await asyncio.sleep(1.0)
    assert not settling.done(), "READONLY is waited out, not a failed settle"
    cluster.client(replica_port).execute_command("REPLICAOF", "NO", "ONE")
    assert await asyncio.wait_for(settling, 20) == SETTLED
    assert settler.counters == Counter(done=1)
    await settler.close()
    await r2.aclose()
    await r.aclose()


@pytest.mark.slow
async def test_the_settler_waits_for_a_replica_once_per_batch(cluster, namespace):
    """With Durability(1): each batch ends in one WAIT (not one per settle), and a settle is
    acknowledged once the replica has it; with more replicas asked than there are, the WAIT
    times out, the settle is acknowledged all the same and the short WAIT is counted."""
    settings = make_settings(cluster.url, namespace)
    r, stream, tasks, ids = await consumer_with_tasks(settings, 40)
    ops = [
        stream.reply_op(i, schema.Rollout.for_task(t, status=Status.ok, reward=1.0), t.reply_to)
        for i, t in zip(ids, tasks)
    ]
    master = cluster.client(cluster.master())
    replica = cluster.client(next(p for p in cluster.replica_ports if p != cluster.master()))

    def waits() -> int:
        return int(master.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))

    before = waits()
    settler = Settler(r, Outage.for_settings(settings), wait=Durability(1, 2000))
    settler.start()
    assert await asyncio.gather(*(settler.run(op) for op in ops[:30])) == [SETTLED] * 30
    assert 1 <= waits() - before <= 3, "one WAIT per batch, and the 30 settles went in a few batches"
    assert replica.xlen(tasks[0].reply_to) == 30, "the replica had every settle once it was acknowledged"
    assert not settler.wait.short
    await settler.close()

    asked = make_settings(cluster.url, namespace, redis_wait_replicas=2, redis_wait_timeout_ms=300)
    r2 = connect(asked)
    assert (durability_of(r2).replicas, durability_of(r2).timeout_ms) == (2, 300), "the client carries it"
    greedy = Settler(r2, Outage.for_settings(asked))
    greedy.start()
    assert await greedy.run(ops[30]) == SETTLED
    assert greedy.wait.short == Counter({"settling rollouts": 1})
    await greedy.close()
    await r2.aclose()
    await r.aclose()


@pytest.mark.slow
async def test_what_a_failover_keeps_is_what_a_full_wait_acknowledged(cluster, namespace):
    """The promise of docs/failover.md, both ways. A settle acknowledged after a full WAIT is on
    the replica, so it survives the master's death. A settle acknowledged while the replica was
    cut off (its WAIT came back short: counted, logged) is lost with the master: on the promoted
    replica the task is pending again, to be reclaimed and run again, and its rollout is not there."""
    settings = make_settings(cluster.url, namespace)
    r, stream, tasks, ids = await consumer_with_tasks(settings, 2)
    ops = [
        stream.reply_op(i, schema.Rollout.for_task(t, status=Status.ok, reward=1.0), t.reply_to)
        for i, t in zip(ids, tasks)
    ]
    assert await r.wait(1, 2000) == 1, "the replica has both pending tasks"
    settler = Settler(r, Outage.for_settings(settings), wait=Durability(1, 300))
    settler.start()
    assert await settler.run(ops[0]) == SETTLED
    assert not settler.wait.short, "the first settle is on the replica"

    replica = cluster.replica_ports[0]
    master = cluster.master()
    cluster.servers[replica].send_signal(signal.SIGSTOP)  # cut off: it can neither read nor reconnect
    cluster.client(master).client_kill_filter(_type="replica")
    assert await settler.run(ops[1]) == SETTLED, "acknowledged all the same"
    assert settler.wait.short == Counter({"settling rollouts": 1}), "and the short WAIT counted"
    cluster.kill_master()
    cluster.servers[replica].send_signal(signal.SIGCONT)
    cluster.wait_failover(master)

    promoted = cluster.client(cluster.master())
    assert promoted.xlen(tasks[0].reply_to) == 1, "only the fully acknowledged rollout survived"
    pending = promoted.xpending(settings.keys.tasks("noop"), GROUP)["pending"]
    assert pending == 1, "the other task is pending again, to be reclaimed and run again"
    await settler.close()
    await r.aclose()


@pytest.mark.slow
async def test_sentinel_urls_take_the_password_from_the_url_or_the_environment(tmp_path, namespace, monkeypatch):
    c = SentinelCluster(tmp_path, password="s3cret").start()
    try:
        hosts = c.url.split("://", 1)[1]
        in_url = make_settings(f"redis+sentinel://:s3cret@{hosts}", namespace)
        assert answers(in_url)
        r = connect(in_url)
        assert await r.ping()
        await r.aclose()

        monkeypatch.setenv("FARM_REDIS_PASSWORD", "s3cret")
        from_env = make_settings(c.url, namespace)
        assert connect_sync(from_env).ping()
        monkeypatch.delenv("FARM_REDIS_PASSWORD")

        wrong = make_settings(f"redis+sentinel://:wrong@{hosts}", namespace)
        with pytest.raises(RedisAuthError) as info, errors(wrong.redis_url):
            connect_sync(wrong).ping()
        assert "wrong" not in str(info.value) and ":***@" in str(info.value)
        assert answers(wrong), "a refusal is an answer: the server is there"
    finally:
        c.stop()


@pytest.mark.slow
async def test_a_submit_waits_for_a_replica_once_per_chunk(cluster, namespace):
    """With redis_wait_replicas 1, each submitted chunk ends in one WAIT: when submit returns, the
    replica has every task of it (what a failover right then keeps)."""
    from farm.client import FarmClient

    settings = make_settings(cluster.url, namespace, redis_wait_replicas=1, redis_wait_timeout_ms=2000)
    master = cluster.client(cluster.master())
    replica = cluster.client(next(p for p in cluster.replica_ports if p != cluster.master()))

    def waits() -> int:
        return int(master.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))

    client = FarmClient(settings, chunk=100)
    tasks = [client.task(run_id="w", agent="noop", row={"i": i}) for i in range(250)]
    before = waits()
    await client.submit(tasks, check_agents=False)
    assert waits() - before == 3, "one WAIT per chunk of 100"
    assert replica.zcard(settings.keys.open_tasks()) == 250, "the replica had every task once submit returned"
    await client.aclose()
    plain = FarmClient(make_settings(cluster.url, namespace))
    before = waits()
    await plain.submit(tasks[:10], check_agents=False)
    assert waits() == before, "no WAIT without redis_wait_replicas"
    await plain.aclose()
