"""The code sandbox holds its limits: each test runs a hostile program and checks the host.

These need Linux and root (the CI and dev machines run as root): the uid drop and the
namespaces are the point, so a machine without them skips rather than pretends (never in CI).
The adversarial suite (programs that try to forge a pass) is tests/test_sandbox_hostile.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import pickle
import socket
import subprocess
import sys
import time
import uuid
import zlib
from pathlib import Path

import pytest
from helpers.uids import runs_sandboxed, sandbox_processes, sandboxed

from envs.sandbox import Limits, SandboxClient, SandboxError, run_program

NEEDS = "the sandbox's uid and namespace isolation need root on Linux"
if os.environ.get("CI") == "true":
    assert os.geteuid() == 0 and os.path.exists("/proc/self/ns/net"), NEEDS
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/proc/self/ns/net"), reason=NEEDS)
ISOLATED = {
    "uid": True,
    "namespaces": True,
    "network": True,
    "filesystem": True,
    "pid": True,
    "cgroup": True,
    "no_new_privs": True,
    "no_unix_sockets": True,
}

ADD = {"inputs": ["1\n2", "3\n4", "-5\n5"], "outputs": ["3", "7", "0"], "fn_name": "add"}
GOOD = "def add(a, b):\n    return a + b\n"
FAST = Limits(wall_s=3.0, cpu_s=1, memory_mb=256, max_processes=6)


@pytest.fixture
def leased(monkeypatch) -> list[int]:
    """The sandbox uids this test's own runs (in this process) leased, in order."""
    from envs.sandbox import isolation

    uids: list[int] = []
    enter = isolation.UidLease.__enter__

    def recording(lease) -> int:
        uids.append(enter(lease))
        return uids[-1]

    monkeypatch.setattr(isolation.UidLease, "__enter__", recording)
    return uids


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.slow
def test_a_correct_program_passes_and_a_partial_one_gets_its_fraction():
    r = run_program(GOOD, ADD, FAST)
    assert (r.reason, r.passed, r.total, r.tests) == ("ok", 3, 3, [True, True, True])
    assert {k: v for k, v in r.isolation.items() if k != "cgroup"} == {
        k: v for k, v in ISOLATED.items() if k != "cgroup"
    }
    r = run_program("def add(a, b):\n    return abs(a) + b\n", ADD, FAST)
    assert (r.reason, r.tests) == ("ok", [True, True, False])


@pytest.mark.slow
def test_stdin_stdout_tests_as_nemo_gym_exports_them():
    tests = {"inputs": ["1 2\n", "10 -3\n"], "outputs": ["3\n", "7\n"]}
    r = run_program("a, b = map(int, input().split())\nprint(a + b)\n", tests, FAST)
    assert (r.reason, r.passed) == ("ok", 2)
    assert run_program("print(3)\n", tests, FAST).tests == [True, False]


@pytest.mark.slow
def test_answers_that_only_claim_equality_fail():
    hack = "class Any:\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Any()\n"
    assert run_program(hack, ADD, FAST).passed == 0


@pytest.mark.slow
def test_an_infinite_loop_is_killed_at_the_cpu_or_wall_limit(leased):
    # A wall limit the loop's 1 CPU-second fits in even on a loaded machine (a parallel run's other
    # tests share two cores): with 3 s, the wall clock killed it first under load.
    spinning = Limits(wall_s=10.0, cpu_s=FAST.cpu_s, memory_mb=FAST.memory_mb, max_processes=FAST.max_processes)
    t0 = time.monotonic()
    r = run_program("while True:\n    pass\n", ADD, spinning)
    assert r.reason == "timeout" and r.passed == 0 and r.signal in ("SIGXCPU", "SIGKILL") and "CPU" in r.detail
    assert time.monotonic() - t0 < spinning.wall_s + 2
    r = run_program("import time\ntime.sleep(60)\n", ADD, FAST)  # no CPU used: the wall clock kills it
    assert r.reason == "timeout" and "wall" in r.detail and r.duration_s < FAST.wall_s + 1
    assert len(leased) == 2 and sandbox_processes(leased) == []


@pytest.mark.slow
def test_a_memory_bomb_fails_safely():
    r = run_program("x = bytearray(8 * 1024**3)\n", ADD, FAST)
    assert r.reason == "memory" and r.passed == 0
    r = run_program("def add(a, b):\n    return [0] * (10**10)\n", ADD, FAST)  # in the function, per test
    assert r.reason == "memory"
    r = run_program("xs = []\nwhile True:\n    xs.append(' ' * 10**6)\n", ADD, FAST)  # growing
    assert r.reason == "memory"


@pytest.mark.slow
def test_forks_stop_at_the_process_limit_and_nothing_outlives_the_run(leased):
    counting = (
        "import os, sys, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(60)\n"
        "            os._exit(0)\n        n += 1\nexcept OSError as e:\n    print('forks', n, type(e).__name__, file=sys.stderr)\n"
        + GOOD
    )
    r = run_program(counting, ADD, FAST)
    forks, err = r.stderr.split()[1:3]
    assert r.reason == "ok" and r.passed == 3
    assert 0 < int(forks) <= FAST.max_processes and err == "BlockingIOError", r.stderr
    assert leased and sandbox_processes(leased) == []  # the sleeping children were killed with the run


@pytest.mark.slow
def test_a_fork_bomb_fails_safely(leased):
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    t0 = time.monotonic()
    r = run_program(bomb, ADD, FAST)
    assert r.reason in ("timeout", "killed", "error") and r.passed == 0
    assert time.monotonic() - t0 < FAST.wall_s + 3
    assert leased and sandbox_processes(leased) == []
    assert run_program(GOOD, ADD, FAST).passed == 3  # the machine still runs programs


@pytest.mark.slow
def test_no_network_not_even_loopback(redis_url):
    host, port = "127.0.0.1", int(redis_url.rsplit(":", 1)[1].split("/")[0])
    socket.create_connection((host, port), timeout=2).close()  # reachable from here, so the test means something
    probe = (
        "import socket, sys\n"
        f"for addr in [('{host}', {port}), ('1.1.1.1', 53), ('8.8.8.8', 443)]:\n"
        "    s = socket.socket()\n    s.settimeout(2)\n    try:\n        s.connect(addr)\n"
        "        print('CONNECTED', addr, file=sys.stderr)\n"
        "    except OSError as e:\n        print('refused', e.errno, file=sys.stderr)\n" + GOOD
    )
    r = run_program(probe, ADD, FAST)
    assert r.reason == "ok" and "CONNECTED" not in r.stderr and r.stderr.count("refused") == 3, r.stderr
    r = run_program("import socket\nsocket.getaddrinfo('example.com', 80)\n", ADD, FAST)
    assert r.reason == "error"  # no DNS either: the program fails to load


@pytest.mark.slow
def test_writes_reach_nothing_on_the_host():
    """/tmp, /var/tmp and /dev/shm are private tmpfs: writable, and gone with the run; the rest is read-only."""
    name = f"sandbox-escape-{uuid.uuid4().hex[:8]}"
    private = [f"/tmp/{name}", f"/var/tmp/{name}", f"/dev/shm/{name}", "inside.txt"]
    host = [f"{Path.cwd()}/{name}", f"/root/{name}", f"/etc/{name}", f"/usr/{name}"]
    probe = (
        f"import os, sys\nfor p in {private + host!r}:\n    try:\n        with open(p, 'w') as f:\n"
        "            f.write('x')\n        print('WROTE', p, file=sys.stderr)\n"
        "    except OSError as e:\n        print('denied', e.errno, file=sys.stderr)\n" + GOOD
    )
    r = run_program(probe, ADD, FAST)
    assert r.reason == "ok"
    assert r.stderr.count("WROTE") == len(private) and r.stderr.count("denied") == len(host), r.stderr
    assert not any(os.path.exists(t) for t in private[:3] + host)


@pytest.mark.slow
def test_a_huge_file_hits_the_file_size_limit():
    r = run_program(
        "with open('big', 'wb') as f:\n    f.write(b'x' * (64 * 1024**2))\n", ADD, Limits(wall_s=5, file_mb=1)
    )
    assert r.reason in ("killed", "error") and r.passed == 0


@pytest.mark.slow
def test_syntax_errors_are_the_programs_failure():
    r = run_program("def add(a, b) return a\n", ADD, FAST)
    assert r.reason == "error" and "SyntaxError" in r.detail


def test_malformed_tests_are_the_machinerys_failure():
    with pytest.raises(SandboxError):
        run_program(GOOD, {"inputs": ["1\n2"], "outputs": []}, FAST)


# ── through rq ─────────────────────────────────────────────────────────────────────────────
@pytest.mark.slow
async def test_the_rq_job_travels_as_json_never_pickle(redis_url, queue, sync_redis):
    client = SandboxClient(redis_url, queue, start_workers=1)
    try:
        job = await client.submit(GOOD, ADD, FAST)
        data = zlib.decompress(sync_redis.hget(job.key, "data"))
        func, _instance, args, kwargs = json.loads(data)
        assert func == "envs.sandbox.run_job" and kwargs["program"] == GOOD and kwargs["unit_tests"] == ADD
        with pytest.raises(pickle.UnpicklingError):
            pickle.loads(data)
        result = await client.wait(job, 60)
        assert (result.reason, result.passed) == ("ok", 3)
        entries = sync_redis.xrevrange(f"rq:results:{job.id}", count=1)
        stored = base64.b64decode(entries[0][1][b"return_value"])
        assert json.loads(stored)["passed"] == 3
        assert sync_redis.hget(job.key, "worker_name").decode() in client.workers
    finally:
        client.close()


@pytest.mark.slow
async def test_runs_in_parallel_through_two_workers(redis_url, queue):
    client = SandboxClient(redis_url, queue, start_workers=2)
    try:
        got = await asyncio.gather(
            *[client.run(GOOD if i % 2 else "def add(a, b):\n    return 0\n", ADD, FAST) for i in range(6)]
        )
        assert [r.passed for r in got] == [1, 3, 1, 3, 1, 3]
        assert len(client.workers) == 2
    finally:
        client.close()


@pytest.mark.slow
async def test_a_worker_dying_mid_job_is_a_sandbox_error_and_it_is_restarted(redis_url, queue, sync_redis):
    client = SandboxClient(redis_url, queue, start_workers=1)
    try:
        job = await client.submit("import time\ntime.sleep(30)\n", ADD, Limits(wall_s=6))
        for _ in range(200):
            if sync_redis.hget(job.key, "status") == b"started":
                break
            await asyncio.sleep(0.05)
        (proc,) = client.workers.values()
        proc.kill()
        t0 = time.monotonic()
        with pytest.raises(SandboxError, match="died while running"):
            await client.wait(job, 60)
        assert time.monotonic() - t0 < 5 and client.restarts == 1
        assert (await client.run(GOOD, ADD, FAST)).passed == 3
    finally:
        client.close()


def _descendants(pid: int) -> list[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], {pid}
    while frontier:
        children = {p for p, parent in parents.items() if parent in frontier}
        found += sorted(children)
        frontier = children
    return found


def _children(pid: int) -> set[int]:
    try:
        return {int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except OSError:
        return set()


@pytest.mark.slow
async def test_a_work_horse_dies_with_its_killed_worker_and_takes_the_program_along(redis_url, queue, sync_redis):
    """SIGKILL the rq worker while its work horse runs a job: the horse (rq forks one per job, in
    a process group of its own) and the program it runs are gone within seconds, not left to run
    out the job's 20 s wall limit as orphans."""
    client = SandboxClient(redis_url, queue, start_workers=1)
    try:
        job = await client.submit("import time\ntime.sleep(60)\n", ADD, Limits(wall_s=20))
        (proc,) = client.workers.values()
        for _ in range(300):
            horses = _children(proc.pid)
            if sync_redis.hget(job.key, "status") == b"started" and horses:
                break
            await asyncio.sleep(0.05)
        (horse,) = horses

        def running(pids) -> list[int]:
            return [p for p in pids if b"runner.py" in _cmdline(p) and not _zombie(p)]

        programs: list[int] = []
        for _ in range(200):  # the program under the horse (through the namespace's outer process)
            programs = running(_descendants(horse))  # this test's: others may run programs meanwhile
            if programs:
                break
            await asyncio.sleep(0.05)
        assert programs, "the program never started"
        proc.kill()
        proc.wait()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5 and (not _zombie(horse) or running(programs)):
            await asyncio.sleep(0.05)
        assert _zombie(horse), f"the work horse {horse} outlived its worker"
        assert not running(programs), "the program outlived its killed worker's horse"
    finally:
        client.close()


@pytest.mark.slow
async def test_a_cancelled_wait_stops_the_running_program(redis_url, queue, sync_redis):
    """A rollout cancelled while its program runs (farm.cancel cancels the wait): the job is
    stopped and the program killed at once, not left to run out its 20 s wall limit."""
    client = SandboxClient(redis_url, queue, start_workers=1)
    try:
        assert (await client.run(GOOD, ADD, FAST)).passed == 3  # the worker is up (it runs as a sandbox uid too)
        (worker,) = client.workers.values()
        idle = set(sandbox_processes())
        job = await client.submit("import time\ntime.sleep(60)\n", ADD, Limits(wall_s=20))
        waiting = asyncio.create_task(client.wait(job, 60))
        # The job's horse and program, under this test's worker (other tests may run programs meanwhile);
        # a zombie is dead (it waits for this process, when an earlier test's run_program made it the
        # subreaper, to reap it). Once seen, the same processes are watched: killed, they leave the tree.
        alive = lambda pids: {p for p in pids if not _zombie(p) and runs_sandboxed(p)}  # noqa: E731
        program: set[int] = set()
        for _ in range(200):
            program = alive(set(_descendants(worker.pid)) - idle)
            if any(b"runner.py" in _cmdline(p) for p in program):
                break
            await asyncio.sleep(0.05)
        assert any(b"runner.py" in _cmdline(p) for p in program), "the program never started"
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        t0 = time.monotonic()
        while alive(program) and time.monotonic() - t0 < 5:
            await asyncio.sleep(0.05)
        assert not alive(program), "the program outlived the cancelled wait"
        assert (await client.run(GOOD, ADD, FAST)).passed == 3, "the worker serves the next job"
    finally:
        client.close()


async def test_no_worker_means_a_sandbox_error_not_a_zero(redis_url, queue):
    client = SandboxClient(redis_url, queue, start_workers=0, wait_margin_s=0.5)
    with pytest.raises(SandboxError, match="no sandbox result"):
        await client.run(GOOD, ADD, Limits(wall_s=0.5))


@pytest.mark.slow
def test_the_worker_runs_from_the_command_line(redis_url, queue):
    proc = subprocess.Popen(
        [sys.executable, "-m", "envs.sandbox", "worker", "--queue", queue],
        cwd=Path(__file__).resolve().parents[1],
        env=dict(os.environ, FARM_SANDBOX_REDIS_URL=redis_url),
    )
    try:
        client = SandboxClient(redis_url, queue, start_workers=0, wait_margin_s=30)
        assert asyncio.run(client.run(GOOD, ADD, FAST)).passed == 3
    finally:
        proc.terminate()
        assert proc.wait(timeout=15) == 0


@pytest.mark.slow
def test_without_namespaces_it_refuses_unless_network_is_allowed(monkeypatch):
    """A host without user namespaces (hardened kernels, default Docker seccomp) cannot be made
    here cheaply, so the namespace probe is faked to say no; the refusal and the record are real."""
    from envs.sandbox import SandboxUnavailable, isolation

    monkeypatch.setattr(isolation, "can_unshare", lambda flags=0: False)
    with pytest.raises(SandboxUnavailable, match="allow_network"):
        run_program(GOOD, ADD, FAST)
    r = run_program(GOOD, ADD, Limits(wall_s=3.0, allow_network=True))
    assert r.passed == 3 and r.isolation["uid"] and not r.isolation["network"] and not r.isolation["filesystem"]


@pytest.mark.slow
def test_output_past_the_limit_is_an_output_limit_failure():
    tests = {"inputs": ["1\n"], "outputs": ["1"]}
    r = run_program("print('x' * 10**7)\n", tests, Limits(wall_s=5, output_kb=64))
    assert r.reason == "output_limit" and r.passed == 0
    r = run_program("def add(a, b):\n    return 'x' * 10**6\n", ADD, Limits(wall_s=5, output_kb=64))
    assert r.reason == "output_limit"


@pytest.mark.slow
def test_the_expected_outputs_never_enter_the_sandbox():
    secret = "731946285"
    tests = {"inputs": ["1\n2"], "outputs": [secret], "fn_name": "add"}
    # The program looks for the secret built at run time, so its own source does not hold it.
    snoop = (
        "import os, sys, gc\ndef check():\n    target = ''.join(['7319', '46285'])\n    found = []\n"
        "    for root, _, files in [w for top in ('/tmp', '/var/tmp', '/dev/shm', '/run') for w in os.walk(top)]:\n"
        "        for f in files:\n            try:\n"
        "                if os.path.getsize(os.path.join(root, f)) < 10**6:\n"
        "                    found.append(open(os.path.join(root, f), errors='ignore').read())\n"
        "            except OSError:\n                pass\n"
        "    found += [repr(o) for o in gc.get_objects() if isinstance(o, (dict, list, tuple))]\n"
        "    return any(target in x for x in found)\n"
        "print('LEAK' if check() else 'clean', file=sys.stderr)\n"
        "def add(a, b):\n    return a + b\n"
    )
    r = run_program(snoop, tests, FAST)
    assert "clean" in r.stderr and "LEAK" not in r.stderr, r.stderr


# ── the queue runs the sandbox's job and nothing else ────────────────────────────────────────
@pytest.mark.slow
async def test_a_job_naming_any_other_function_is_refused_and_nothing_runs(redis_url, queue, tmp_path):
    import redis
    from rq import Queue
    from rq.serializers import JSONSerializer

    client = SandboxClient(redis_url, queue, start_workers=1)
    target = tmp_path / "made-by-a-job"
    try:
        assert (await client.run(GOOD, ADD, FAST)).passed == 3  # the worker is up and serving
        q = Queue(queue, connection=redis.Redis.from_url(redis_url), serializer=JSONSerializer)
        jobs = [
            q.enqueue("os.makedirs", str(target)),
            q.enqueue("subprocess.run", ["touch", str(target)]),
            q.enqueue("envs.sandbox.run_program", GOOD, ADD),
        ]  # ours, but not the job
        for job in jobs:
            for _ in range(200):
                if job.get_status(refresh=True) in ("failed", "finished"):
                    break
                await asyncio.sleep(0.05)
            assert job.get_status() == "failed", job.id
            assert "is not the sandbox's job" in job.latest_result().exc_string
        assert not target.exists()
    finally:
        client.close()


@pytest.mark.slow
def test_the_worker_drops_root_and_holds_no_secret_on_its_command_line(redis_url, queue):
    client = SandboxClient(redis_url, queue, start_workers=1)
    try:
        assert asyncio.run(client.run(GOOD, ADD, FAST)).passed == 3
        (proc,) = client.workers.values()
        status = Path(f"/proc/{proc.pid}/status").read_text()
        uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
        assert sandboxed(uid)
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode()
        assert "redis://" not in cmdline
    finally:
        client.close()
