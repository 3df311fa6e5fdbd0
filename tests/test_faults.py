"""Transport faults: poison entries, hostile reply_to keys, Redis gone, wrong credentials, crashing children.

Each test stands for one way the farm used to loop or lose work; every one runs against a
real Redis (the shared one, or an embedded redis-server of its own where the test kills it).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import ROOT
from helpers.processes import stop
from helpers.redis import consumer_with_tasks, make_settings, run_script
from helpers.waiting import async_wait_for, wait_for
from helpers.workers import in_process_worker as running
from helpers.workers import spawn_worker, worker_env

from farm import schema
from farm.client import FarmClient
from farm.embedded import EmbeddedRedis
from farm.errors import ConfigError, RedisAuthError
from farm.keys import GROUP
from farm.schema import Status
from farm.streams import AgentStream

# A msgpack body nested 100,000 arrays deep: deeper than any decoder's recursion limit.
NESTED = b"\x91" * 100_000 + b"\xc0"


def nested_task_body(task: schema.Task) -> bytes:
    """A task whose identifying fields are intact but whose row nests past the recursion limit."""
    import msgspec

    plain = msgspec.to_builtins(task)
    plain["row"] = {"x": "@@"}
    body = msgspec.msgpack.encode(plain)
    inner = msgspec.msgpack.encode("@@")
    return body.replace(inner, NESTED)


def rows(n, **noop):
    return [{"noop": dict(noop), "i": i} for i in range(n)]


# -- poison ---------------------------------------------------------------------------------


async def test_nested_msgpack_task_is_dead_lettered_once_and_the_worker_goes_on(settings, sync_redis):
    client = FarmClient(settings)
    tasks = [client.task(run_id="p", agent="noop", row=r) for r in rows(20)]
    poison = client.task(run_id="p", agent="noop", row={})
    stream = settings.keys.tasks("noop")
    await client.submit(tasks[:10])
    sync_redis.xadd(stream, {"v": b"1", "d": NESTED})  # garbage that names nothing
    sync_redis.xadd(stream, {"v": b"1", "d": nested_task_body(poison)})  # names its task and reply_to
    await client.submit(tasks[10:])
    async with running(settings) as w:
        got = await client.collect(tasks, timeout_s=20)
        got |= await client.collect([poison], timeout_s=2)
        await async_wait_for(lambda: sync_redis.xlen(settings.keys.dead("noop")) >= 2, what="two dead letters")
        await asyncio.sleep(settings.visibility_timeout_s + 0.5)  # long enough for any redelivery
    letters = sync_redis.xrange(settings.keys.dead("noop"))
    assert len(letters) == 2, letters
    assert all(f[b"kind"] == b"malformed" for _, f in letters)
    assert b"nested too deeply" in letters[1][1][b"reason"]
    assert all(got[t.task_id].ok for t in tasks)
    # too deep even to read its task id from: its waiter gets a failure at the deadline, never a hang
    assert got[poison.task_id].error.kind == "deadline"
    assert sync_redis.xpending(stream, GROUP)["pending"] == 0
    assert w.counters["dead"] == 2
    await client.aclose()


@pytest.mark.parametrize(
    "field, value",
    [("sample_index", "zero"), ("agent_ref", "noop"), ("group_id", 7), ("run_id", ["p"]), ("sample_index", True)],
)
async def test_a_task_with_one_mistyped_field_fails_to_its_waiter_at_once(settings, sync_redis, field, value):
    import msgspec

    client = FarmClient(settings)
    task = client.task(run_id="p", agent="noop", row={})
    plain = msgspec.to_builtins(task)
    plain[field] = value  # task_id and reply_to intact: the waiter can be told
    sync_redis.xadd(
        settings.keys.tasks("noop"), {"v": str(schema.SCHEMA_VERSION).encode(), "d": msgspec.msgpack.encode(plain)}
    )
    async with running(settings):
        t0 = time.monotonic()
        got = await client.collect([task], timeout_s=15)
        waited = time.monotonic() - t0
    rollout = got[task.task_id]
    assert rollout.error.kind == "malformed", rollout.error
    assert waited < 5, f"the waiter got its failure after {waited:.1f}s, not at once"
    assert rollout.agent_ref.name == "noop" and rollout.worker_id
    assert sync_redis.xlen(settings.keys.dead("noop")) == 1
    await client.aclose()


async def test_unreadable_results_are_dead_lettered_and_the_client_goes_on(settings, sync_redis):
    client = FarmClient(settings)
    tasks = [client.task(run_id="r", agent="noop", row={}) for _ in range(3)]
    stream = settings.keys.results("r")
    import msgspec

    deep = msgspec.to_builtins(schema.Rollout.for_task(tasks[0], status=Status.ok, metrics={"x": "@@"}))
    deep = msgspec.msgpack.encode(deep).replace(msgspec.msgpack.encode("@@"), b"\x91" * 3000 + b"\xc0")
    sync_redis.xadd(stream, {"v": b"1", "d": deep})  # 3,000 deep: past the decoder's recursion limit
    broken = schema.Rollout.for_task(tasks[1], status=Status.ok, reward=1.0)
    plain = msgspec.to_builtins(broken)
    plain["status"] = "bogus"  # names its task, but does not validate
    sync_redis.xadd(stream, {"v": b"1", "d": msgspec.msgpack.encode(plain)})
    sync_redis.xadd(stream, {"v": b"99", "d": b"\x80"})  # another schema version
    sync_redis.xadd(stream, {"v": b"1", "d": b"x" * 8192})  # over max_entry_bytes below
    for t in (tasks[0], tasks[2]):
        sync_redis.xadd(stream, schema.entry(schema.Rollout.for_task(t, status=Status.ok, reward=1.0)))
    small = FarmClient(settings.replace(max_entry_bytes=4096))
    t0 = time.monotonic()
    got = await small.collect(tasks, timeout_s=10)
    assert time.monotonic() - t0 < 5  # the broken one did not wait out the deadline
    assert got[tasks[0].task_id].ok and got[tasks[2].task_id].ok
    assert got[tasks[1].task_id].error.kind == "malformed"
    letters = sync_redis.xrange(settings.keys.dead_results())
    reasons = [f[b"reason"].decode() for _, f in letters]
    assert len(letters) == 4, reasons
    assert any("nested too deeply" in r for r in reasons) and any("schema version" in r for r in reasons)
    assert any("over max_entry_bytes=4,096" in r for r in reasons)
    assert sync_redis.xlen(stream) == 0
    await small.aclose()
    await client.aclose()


@pytest.mark.slow
def test_collect_goes_on_past_a_poison_result(tmp_path, settings, sync_redis):
    import json

    from producer.collect import CollectOptions, run_collect

    inp = tmp_path / "rows.jsonl"
    inp.write_text(
        "".join(
            json.dumps({"agent_ref": {"name": "noop"}, "noop": {}, "responses_create_params": {"input": f"q{i}"}})
            + "\n"
            for i in range(30)
        )
    )
    task = schema.Task.new(run_id="poisoned", agent="noop", row={}, reply_to=settings.keys.results("poisoned"))
    import msgspec

    deep = msgspec.to_builtins(schema.Rollout.for_task(task, status=Status.ok, metrics={"x": "@@"}))
    deep = msgspec.msgpack.encode(deep).replace(msgspec.msgpack.encode("@@"), NESTED)
    sync_redis.xadd(settings.keys.results("poisoned"), {"v": b"1", "d": deep})
    proc = spawn_worker(settings, "--agent", "noop", "--concurrency", "8")
    try:
        summary = run_collect(
            settings,
            CollectOptions(input=inp, output=tmp_path / "out.jsonl", run_id="poisoned", progress=False, concurrency=8),
        )
    finally:
        stop(proc)
    assert summary["exit_code"] == 0 and summary["written_now"] == 30
    assert sync_redis.xlen(settings.keys.dead_results()) == 1


# -- reply_to ---------------------------------------------------------------------------------


async def test_reply_to_of_the_wrong_type_never_loses_the_task(settings, sync_redis):
    client = FarmClient(settings)
    [task] = [client.task(run_id="wt", agent="noop", row={})]
    sync_redis.set(task.reply_to, "not a stream")
    await client.submit([task])
    async with running(settings):
        await async_wait_for(lambda: sync_redis.xlen(settings.keys.dead("noop")) == 1, what="dead letter")
    [(_, letter)] = sync_redis.xrange(settings.keys.dead("noop"))
    assert letter[b"kind"] == b"bad_reply_to" and b"not a stream" in letter[b"reason"]
    assert schema.decode_task(letter).task_id == task.task_id  # the task itself is kept
    assert sync_redis.get(task.reply_to) == b"not a stream"
    assert sync_redis.xpending(settings.keys.tasks("noop"), GROUP)["pending"] == 0
    await client.aclose()


async def test_reply_to_outside_the_namespace_is_refused_and_never_written(settings, sync_redis):
    client = FarmClient(settings)
    foreign = f"victim-{settings.namespace}"
    task = client.task(run_id="x", agent="noop", row={})
    task.reply_to = foreign
    with pytest.raises(ConfigError, match="not a result stream"):
        await client.submit([task])
    assert sync_redis.xlen(settings.keys.tasks("noop")) == 0
    # written by hand (an old or hostile client): dead-lettered, the foreign key untouched
    sync_redis.xadd(settings.keys.tasks("noop"), schema.entry(task))
    try:
        async with running(settings):
            await async_wait_for(lambda: sync_redis.xlen(settings.keys.dead("noop")) == 1, what="dead letter")
        assert not sync_redis.exists(foreign)
        [(_, letter)] = sync_redis.xrange(settings.keys.dead("noop"))
        assert letter[b"kind"] == b"bad_reply_to"
    finally:
        sync_redis.delete(foreign)
    await client.aclose()


async def test_the_settle_script_checks_reply_to_itself_and_acks_nothing(settings, sync_redis):
    """The script is the last line: a settle naming a foreign or mistyped stream writes and acks nothing."""
    r, stream, [task], [entry_id] = await consumer_with_tasks(settings)
    rollout = schema.Rollout.for_task(task, status=Status.ok, reward=1.0)
    foreign = f"elsewhere-{settings.namespace}"
    typed = settings.keys.results("typed")
    sync_redis.hset(typed, "a", "b")
    try:
        for key, code in ((foreign, -1), (typed, -2)):
            assert await run_script(r, stream.reply_op(entry_id, rollout, key)) == code
        assert not sync_redis.exists(foreign)
        assert sync_redis.xpending(settings.keys.tasks("noop"), GROUP)["pending"] == 1
        assert await run_script(r, stream.reply_op(entry_id, rollout, task.reply_to)) == 1
        assert sync_redis.xlen(task.reply_to) == 1
    finally:
        sync_redis.delete(foreign, typed)
    await r.aclose()


@pytest.mark.slow
def test_a_failed_write_leaves_the_task_pending(tmp_path):
    """Redis out of memory: the rollout cannot be written, so the task must not be acknowledged."""
    from farm.connection import connect_sync
    from farm.scripts import SHAS, SOURCES
    from farm.transport import Outage

    server = EmbeddedRedis(tmp_path / "redis").start()  # its own: maxmemory would stop every other test
    settings = make_settings(server.url, "oom")
    r = connect_sync(settings)
    stream = settings.keys.tasks("noop")
    r.xgroup_create(stream, GROUP, id="0", mkstream=True)
    task = schema.Task.new(run_id="oom", agent="noop", row={}, reply_to=settings.keys.results("oom"))
    r.xadd(stream, schema.entry(task))
    [[_, [(entry_id, _)]]] = r.xreadgroup(GROUP, "c1", {stream: ">"}, count=1)
    for src in SOURCES.values():
        r.script_load(src)
    fake = AgentStream(None, settings.keys, "noop", "c1", Outage.for_settings(settings))
    op = fake.reply_op(entry_id.decode(), schema.Rollout.for_task(task, status=Status.ok), task.reply_to)
    before = r.config_get("maxmemory")["maxmemory"]
    r.config_set("maxmemory", 1)
    try:
        with pytest.raises(Exception, match="OOM"):
            r.evalsha(SHAS[op.script], len(op.keys), *op.keys, *op.args)
    finally:
        r.config_set("maxmemory", before)
    assert r.xpending(stream, GROUP)["pending"] == 1 and r.xlen(stream) == 1
    assert r.evalsha(SHAS[op.script], len(op.keys), *op.keys, *op.args) == 1
    r.close()
    server.stop()


# -- Redis gone, Redis refusing ---------------------------------------------------------------


def _outage(tmp_path, processes: int, down_max: float) -> tuple[float, int, str]:
    """A busy `farm worker --processes P` whose Redis is killed: (seconds until it exited, code, output)."""
    server = EmbeddedRedis(tmp_path / "redis").start()
    settings = make_settings(server.url, "gone")
    proc = spawn_worker(
        settings,
        *("--agent", "noop", "--concurrency", "16", "--processes", str(processes)),
        FARM_REDIS_DOWN_MAX_S=str(down_max),
        FARM_LOG_FORMAT="json",
    )
    try:

        async def submit():
            client = FarmClient(settings)
            await client.submit(
                [client.task(run_id="g", agent="noop", row={"noop": {"sleep_s": 30}}) for _ in range(40)]
            )
            await client.aclose()

        asyncio.run(submit())
        import redis

        probe = redis.Redis.from_url(server.url)
        busy = 16 * processes
        wait_for(lambda: probe.xinfo_groups(settings.keys.tasks("noop"))[0]["pending"] == busy, what="workers busy")
        probe.close()
        server.proc.kill()
        server.proc.wait()
        killed = time.monotonic()
        try:
            out, _ = proc.communicate(timeout=down_max + 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            pytest.fail(f"worker still running {down_max + 30:.0f}s after Redis went away:\n{out[-3000:]}")
        return time.monotonic() - killed, proc.returncode, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        server.stop()


def _warnings_per_process(out: str) -> dict[int, list[dict]]:
    """Each process's WARNING records, whatever logger wrote them."""
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    by_pid: dict[int, list[dict]] = {}
    for r in records:
        if r["level"] == "WARNING":
            by_pid.setdefault(r["pid"], []).append(r)
    return by_pid


@pytest.mark.slow
def test_busy_worker_exits_within_the_outage_bound_and_warns_at_most_once_a_second(tmp_path):
    down_max = 4.0
    took, code, out = _outage(tmp_path, 1, down_max)
    assert took <= down_max + 2, f"exited {took:.1f}s after Redis went away (bound {down_max}s + 2s)\n{out[-3000:]}"
    assert code == 3, out[-3000:]
    assert "unreachable for" in out and "redis_down_max_s=4" in out
    (warnings,) = _warnings_per_process(out).values()
    assert any(r["logger"] == "farm.transport" for r in warnings), out[-3000:]
    # One retry layer for the whole process: the policy-version watch, the fetch loop, the
    # heartbeat and the settler share one Outage, so one warning a second in all.
    gaps = [b["ts"] - a["ts"] for a, b in zip(warnings, warnings[1:])]
    assert all(g >= 0.99 for g in gaps), [(round(g, 3), b["logger"], b["msg"][:90]) for g, b in zip(gaps, warnings[1:])]


@pytest.mark.slow
def test_a_worker_pool_exits_within_the_outage_bound_not_once_per_restart(tmp_path):
    """Children that exit 3 have waited out the bound already: the pool does not restart them
    into a fresh clock while Redis is still away (it used to take about 4x the bound)."""
    down_max = 4.0
    took, code, out = _outage(tmp_path, 2, down_max)
    assert took <= down_max + 2, (
        f"pool exited {took:.1f}s after Redis went away (bound {down_max}s + 2s)\n{out[-3000:]}"
    )
    assert code == 3, out[-3000:]
    assert "Redis unreachable (never, or past redis_down_max_s)" in out
    children = _warnings_per_process(out)
    assert len(children) >= 2, out[-3000:]
    for warnings in children.values():
        gaps = [b["ts"] - a["ts"] for a, b in zip(warnings, warnings[1:])]
        assert all(g >= 0.99 for g in gaps), [(round(g, 3), b["msg"]) for g, b in zip(gaps, warnings[1:])]


@pytest.mark.slow
def test_wrong_password_fails_fast_with_one_clear_line(tmp_path):
    with EmbeddedRedis(tmp_path / "redis", password="s3cret") as server:
        wrong = server.url.replace("s3cret", "wrong-pw")
        env = worker_env(make_settings(wrong, "auth"))
        for args in (["status"], ["worker", "--agent", "noop"]):
            t0 = time.monotonic()
            proc = subprocess.run(
                [sys.executable, "-m", "farm", *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
            )
            took = time.monotonic() - t0
            out = proc.stdout + proc.stderr
            assert took < 5, f"farm {args[0]} took {took:.1f}s"
            assert proc.returncode == 4, out
            assert "Traceback" not in out
            assert "refused the credentials" in out and "redis://:***@127.0.0.1" in out
            assert "wrong-pw" not in out


@pytest.mark.slow
async def test_auth_errors_are_never_retried(tmp_path):
    with EmbeddedRedis(tmp_path / "redis", password="s3cret") as server:
        settings = make_settings(server.url.replace("s3cret", "nope"), "auth")
        client = FarmClient(settings)
        t0 = time.monotonic()
        with pytest.raises(RedisAuthError, match="refused the credentials"):
            await client.submit([client.task(run_id="a", agent="noop", row={})])
        assert time.monotonic() - t0 < 1
        assert client.outage.failures == 0
        await client.aclose()


def test_redact_hides_passwords_only():
    from farm.transport import redact

    assert redact("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert redact("rediss://user:pw@h/0?ssl_cert_reqs=none") == "rediss://user:***@h/0?ssl_cert_reqs=none"
    assert redact("redis://h:6379/0") == "redis://h:6379/0"


# -- the pool supervisor ----------------------------------------------------------------------


def _pool(tmp_path: Path, child: str, *, processes=1, max_restarts=3, window_s=1.0) -> subprocess.Popen:
    starts = tmp_path / "starts"
    script = tmp_path / "child.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys, time
        with open({str(starts)!r}, "a") as f:
            f.write("x")
        {child}
    """)
    )
    code = (
        f"import sys, logging; logging.basicConfig(level=logging.INFO); from workers.supervise.pool import run_pool; "
        f"sys.exit(run_pool([sys.executable, {str(script)!r}], {processes}, max_restarts={max_restarts}, "
        f"window_s={window_s}, base_s=0.05))"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _starts(tmp_path: Path) -> int:
    p = tmp_path / "starts"
    return len(p.read_text()) if p.exists() else 0


@pytest.mark.slow
def test_supervisor_keeps_restarting_a_child_that_crashes_now_and_then(tmp_path):
    proc = _pool(tmp_path, "time.sleep(0.6); sys.exit(1)", max_restarts=3, window_s=1.0)
    try:
        wait_for(lambda: _starts(tmp_path) >= 9, timeout=30, what="more than 5 restarts")
        assert proc.poll() is None
    finally:
        out = stop(proc)
    assert _starts(tmp_path) >= 9, out


@pytest.mark.slow
def test_supervisor_stops_a_crash_loop_within_its_window(tmp_path):
    proc = _pool(tmp_path, "sys.exit(1)", max_restarts=3, window_s=30.0)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert _starts(tmp_path) == 4, out
    assert "3 restarts within 30s" in out


@pytest.mark.slow
def test_supervisor_does_not_restart_a_configuration_error(tmp_path):
    proc = _pool(tmp_path, "time.sleep(0.3); sys.exit(2)", processes=2)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert _starts(tmp_path) == 2, out
    assert "configuration problem" in out


@pytest.mark.parametrize("code", [2, 3, 5])
@pytest.mark.slow
def test_a_pool_stops_with_its_cause_not_with_the_signal_that_stopped_the_rest(tmp_path, code):
    """One child exits with a code that stops the pool (3: Redis gone, with no Redis to ask); the
    other is still running and dies of the pool's SIGTERM. The pool's status is the cause, never 15."""
    first = f"(time.sleep(0.3), sys.exit({code}))"
    child = f"import os; time.sleep(60) if os.environ['FARM_WORKER_SLOT'] != '0' else {first}"
    proc = _pool(tmp_path, child, processes=2)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == code, out
    assert _starts(tmp_path) == 2, out


@pytest.mark.slow
def test_worker_pool_children_get_arguments_they_accept(settings, tmp_path, sync_redis):
    """`farm --config c.yaml worker --processes 2`: both children run, and stop on SIGTERM."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("concurrency: 4\n")
    env = {k: v for k, v in worker_env(settings).items() if k not in ("FARM_REDIS_URL", "FARM_NAMESPACE")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "farm",
            "--config",
            str(cfg),
            "--redis-url",
            settings.redis_url,
            "--namespace",
            settings.namespace,
            "worker",
            "--agent",
            "noop",
            "--processes",
            "2",
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(
            lambda: len(list(sync_redis.scan_iter(match=settings.keys.worker_pattern()))) == 2,
            timeout=30,
            what="two live workers in the namespace given on the command line",
        )
        children = [p for p in os.listdir("/proc") if p.isdigit() and _parent(p) == proc.pid]
        assert len(children) == 2
        for pid in children:  # the global options reach them, but not on their command lines
            assert b"redis://" not in open(f"/proc/{pid}/cmdline", "rb").read()
    finally:
        out = stop(proc, timeout=30)
    assert proc.returncode == 0, out


def _parent(pid: str) -> int:
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1
