"""A farm spread over four hosts, without a cluster: network namespaces on this machine.

Redis (`farm redis --bind`, password required) runs on one host, a `farm worker` on each of
two others, and the producer (`farm collect`) on a fourth; each reaches Redis only by that
host's address on a private subnet (a namespace's loopback holds nothing of the others). The
test itself reads Redis from this machine's own link to the switch, as monitoring would.

A first batch completes with exactly one rollout per task, done by both worker hosts. Then,
while worker B holds tasks in flight, B's cable is pulled (its switch port taken down: no
error, only silence), and the rest of the run still ends with exactly one rollout per task:
the tasks B held are reclaimed by worker A after the visibility timeout and redone there.
Everything the test created (processes, namespaces, links) is removed, and that is checked.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from helpers import ROOT
from helpers.redis import FAST
from helpers.waiting import wait_for
from netns import Host, Network, require_netns

from farm.keys import GROUP, Keys
from farm.schema import decode_task

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

PORT = 7379  # Redis's port on its own host; nothing else listens in that namespace
NAMESPACE = "multihost"
KEYS = Keys(NAMESPACE)
SETTINGS = dict(FAST, visibility_timeout_s=4.0)  # some slack for a loaded 2-core machine


@pytest.fixture
def network():
    """The four hosts' network; afterwards, nothing of it may remain."""
    require_netns()
    net = Network()
    try:
        net.start()
        yield net
    finally:
        net.close()
    assert not net.leftovers(), f"left behind: {net.leftovers()}"


def farm(net: Network, host: Host, args: list[str], env: dict, log: Path) -> subprocess.Popen:
    return net.popen(host, [sys.executable, "-m", "farm", *args], env=env, log=log, cwd=ROOT)


def reaches(net: Network, host: Host, address: str, port: int) -> bool:
    """Whether a TCP connection from `host` to address:port opens within a second."""
    probe = f"import socket; socket.create_connection(({address!r}, {port}), timeout=1).close()"
    return net.run(host, [sys.executable, "-c", probe]).returncode == 0


def write_rows(path: Path, n: int, sleep_s: float) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"responses_create_params": {"input": f"q{i}"}, "noop": {"sleep_s": sleep_s}}) + "\n")
    return path


def collected(out: Path, proc: subprocess.Popen, log: Path, n: int) -> list[dict]:
    """The rollouts `farm collect` wrote, checked to be exactly one ok rollout for each of n rows."""
    assert proc.returncode == 0, log.read_text()[-3000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    failures = Path(str(out).replace(".jsonl", "_failures.jsonl"))
    assert not failures.exists() or not failures.read_text().strip(), failures.read_text()[:2000]
    assert sorted(r["row_index"] for r in records) == list(range(n))  # none missing, none twice
    assert len({r["task_id"] for r in records}) == n
    assert all(r["rollout"]["status"] == "ok" for r in records)
    metrics = json.loads(Path(str(out).replace(".jsonl", "_metrics.json")).read_text())
    assert metrics["dropped_duplicates"] == 0 and metrics["complete"]
    return records


def stable_pending(r: redis.Redis, consumer: str) -> list[str]:
    """The entries pending on `consumer`, once two reads half a second apart agree (a settle
    already on its way into Redis when the link went down has landed by then)."""
    stream, last = KEYS.tasks("noop"), None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        now = sorted(
            p["message_id"].decode()
            for p in r.xpending_range(stream, GROUP, min="-", max="+", count=1000, consumername=consumer)
        )
        if now == last:
            return now
        last = now
        time.sleep(0.5)
    raise AssertionError(f"the tasks pending on {consumer} did not settle down")


def test_a_cut_off_worker_host_loses_nothing_and_duplicates_nothing(network: Network, tmp_path):
    t0 = time.monotonic()
    net = network
    redis_host, a, b, producer = (net.add_host(name) for name in ("redis", "a", "b", "producer"))
    password = "pw-" + os.urandom(8).hex()
    (tmp_path / "pw").write_text(password + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update({f"FARM_{k.upper()}": str(v) for k, v in SETTINGS.items()})
    env.update(
        PYTHONPATH=str(ROOT),
        FARM_REDIS_URL=f"redis://{redis_host.address}:{PORT}/0",
        FARM_REDIS_PASSWORD=password,
        FARM_NAMESPACE=NAMESPACE,
        FARM_DATA_DIR=str(tmp_path / "data"),
    )
    logs = {name: tmp_path / f"{name}.log" for name in ("redis", "a", "b", "collect1", "collect2")}
    server = farm(
        net,
        redis_host,
        ["redis", "--bind", redis_host.address, "--port", str(PORT), "--password-file", str(tmp_path / "pw")],
        {k: v for k, v in env.items() if k != "FARM_REDIS_PASSWORD"},
        logs["redis"],
    )
    r = redis.Redis(host=redis_host.address, port=PORT, password=password, socket_timeout=5)
    wait_for(lambda: _ping(r), timeout=30, what=f"redis on {redis_host.address}:{PORT}")
    # Each host reaches Redis by its address only: a namespace's own loopback has nothing on it.
    assert reaches(net, producer, redis_host.address, PORT)
    assert not reaches(net, a, "127.0.0.1", PORT)

    worker = ["worker", "--agent", "noop", "--concurrency", "4"]
    workers = {host.name: farm(net, host, worker, env, logs[host.name]) for host in (a, b)}
    ids = wait_for(lambda: _worker_ids(r, workers), timeout=60, what="both workers' heartbeats")
    t_ready = time.monotonic()

    # Phase 1: 200 tasks from the producer host, exactly one rollout each, both worker hosts busy.
    out1 = tmp_path / "phase1.jsonl"
    rows1 = write_rows(tmp_path / "rows1.jsonl", 200, 0.02)
    args = ["collect", "--agent", "noop", "--no-progress", "--timeout", "90"]
    collect1 = farm(net, producer, [*args, "--input", str(rows1), "--output", str(out1)], env, logs["collect1"])
    collect1.wait(90)
    first = collected(out1, collect1, logs["collect1"], 200)
    by_worker = {name: sum(rec["rollout"]["worker_id"] == wid for rec in first) for name, wid in ids.items()}
    assert by_worker["a"] > 0 and by_worker["b"] > 0 and sum(by_worker.values()) == 200, by_worker
    t_phase1 = time.monotonic()

    # Phase 2: 40 one-second tasks; once B holds some in flight, B's cable is pulled.
    out2 = tmp_path / "phase2.jsonl"
    rows2 = write_rows(tmp_path / "rows2.jsonl", 40, 1.0)
    collect2 = farm(net, producer, [*args, "--input", str(rows2), "--output", str(out2)], env, logs["collect2"])
    wait_for(lambda: _pending(r).get(ids["b"], 0) >= 2, timeout=60, what="worker B to hold tasks in flight")
    net.cut(b)
    t_cut = time.monotonic()
    held_entries = stable_pending(r, ids["b"])
    held = {decode_task(fields).task_id for i in held_entries for _, fields in r.xrange(KEYS.tasks("noop"), i, i)}
    assert held and len(held) == len(held_entries), (held_entries, held)
    assert not reaches(net, b, redis_host.address, PORT), "B must be cut off"
    assert reaches(net, a, redis_host.address, PORT)

    collect2.wait(120)
    t_done = time.monotonic()
    second = collected(out2, collect2, logs["collect2"], 40)
    rollouts = {rec["task_id"]: rec["rollout"] for rec in second}
    assert held <= set(rollouts)
    redone = {t: (rollouts[t]["worker_id"], rollouts[t]["attempt"]) for t in held}
    assert all(w == ids["a"] and attempt >= 2 for w, attempt in redone.values()), (ids, redone)
    wait_for(lambda: _counters(r, ids["a"]).get("reclaimed", 0) >= len(held), what="A to count its reclaims")

    # Redis agrees: one settle per task, nothing pending, queued, dead or settled twice.
    stats = {k.decode(): int(v) for k, v in r.hgetall(KEYS.stats("noop")).items()}
    assert stats.get("done") == 240 and not stats.get("failed") and not stats.get("dead"), stats
    assert r.xpending(KEYS.tasks("noop"), GROUP)["pending"] == 0
    assert r.xlen(KEYS.tasks("noop")) == 0 and r.xlen(KEYS.dead("noop")) == 0

    workers[b.name].kill()  # a host that is gone: nothing of it is waited for
    workers[a.name].send_signal(signal.SIGTERM)
    assert workers[a.name].wait(30) == 0, logs["a"].read_text()[-3000:]
    r.close()
    server.send_signal(signal.SIGTERM)
    server.wait(30)
    print(
        f"\nmultihost on {net.subnet}: ready {t_ready - t0:.1f}s, phase 1 (200 tasks; a {by_worker['a']}, "
        f"b {by_worker['b']}) {t_phase1 - t_ready:.1f}s, B cut {t_cut - t_phase1:.1f}s into phase 2 holding "
        f"{len(held)} tasks, all reclaimed and redone by A; phase 2 (40 tasks) done {t_done - t_cut:.1f}s "
        f"after the cut; total {time.monotonic() - t0:.1f}s"
    )


def _ping(r: redis.Redis) -> bool:
    try:
        return bool(r.ping())
    except redis.RedisError:
        return False


def _worker_ids(r: redis.Redis, procs: dict[str, subprocess.Popen]) -> dict[str, str] | None:
    """Host name -> worker id, read from the heartbeats (`ip netns exec` runs the worker as its own pid)."""
    for name, proc in procs.items():
        assert proc.poll() is None, f"worker {name} exited with {proc.returncode}"
    beats = [json.loads(r.get(key) or "{}") for key in r.scan_iter(match=KEYS.worker_pattern())]
    by_pid = {beat.get("pid"): beat.get("worker_id") for beat in beats}
    ids = {name: by_pid.get(proc.pid) for name, proc in procs.items()}
    return ids if all(ids.values()) else None


def _counters(r: redis.Redis, worker_id: str) -> dict:
    """A live worker's counters, from its heartbeat."""
    return json.loads(r.get(KEYS.worker(worker_id)) or "{}")


def _pending(r: redis.Redis) -> dict[str, int]:
    summary = r.xpending(KEYS.tasks("noop"), GROUP)
    return {c["name"].decode(): int(c["pending"]) for c in summary.get("consumers") or []}
