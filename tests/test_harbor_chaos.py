"""The Harbor oracle run under chaos, and the sandbox sweeper: SIGKILLed workers leak nothing for long.

The chaos run (issue 45's measurement): the project's 28-task suite, several samples of each (84
tasks on docker, 168 on local: the oracle's rollouts take a second or two, and with one sample
each a fast run ended before the fourth kill), with `harbor_oracle` on two worker processes, while one worker with a
rollout in its sandbox is SIGKILLed four times (another
started each time) and Redis (AOF, fsync always, a server of the test's own) is SIGKILLed once and
restarted on the same data. Then every task has exactly one rollout, each ok with reward 1, and no
sandbox of the namespace is left (Docker containers by label; the `local` backend's metadata and
cgroups) within the sweeper's bound after the run: heartbeat_ttl_s (the killed worker's heartbeat
expires) + 2 x sandbox_sweep_s (two sweeps find it gone) + slack (the listing, the removals, a
loaded machine). Each sandbox a SIGKILL left goes within that bound of the kill, or, when Redis's
outage fell in that window, within two sweeps + slack of Redis's return. The tally is printed.

The sweeper alone: a worker SIGKILLed mid-rollout leaves its container running; a live worker's
sweep removes it within the bound, while its own rollout's sandbox and a sandbox labelled with
another live worker (the negative control) survive. And `farm sandbox list` / `farm sandbox sweep`.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter

import pytest
import redis
from helpers.docker import containers_of, docker, need_base_image, remove_namespace
from helpers.harbor import AGENT, harbor_worker, sandbox_owners, sandboxes_left, sleepy_row, worker_pid
from helpers.processes import stop
from helpers.redis import cleanup, make_settings

from envs.harbor.rows import suite_rows
from envs.sdk.sandbox import LABEL_EXPIRES, LABEL_NAMESPACE, LABEL_WORKER
from farm.cli import main
from farm.client import FarmClient
from farm.embedded import EmbeddedRedis
from farm.keys import GROUP

pytestmark = pytest.mark.slow

SWEEP_S, TTL_S, SLACK_S = 2.0, 3.0, 12.0
# From a worker's death to its sandboxes' removal: its heartbeat expires, then a live worker finds it
# absent at two sweeps in a row (workers/delivery/sweeper.py), then removes them. The slack: the
# listing, the removals, and a loaded machine (a parallel test run shares two cores among the test
# processes, both workers, Redis and the backend). A sandbox's own lifetime is minutes (its task's
# timeouts + sandbox_slack_s), so the bound still tells a sweep from a sandbox that ended by itself.
BOUND_S = TTL_S + 2 * SWEEP_S + SLACK_S


def orphan_bound(killed_at: float, outage: tuple[float, float] | None) -> float:
    """Seconds an orphan of a worker SIGKILLed at `killed_at` may live. A Redis outage in that window
    restarts the count: a sweep that cannot ask Redis removes nothing and forgets the absences it saw
    (two absences in a row, Redis answering both), so the two sweeps come after Redis is back."""
    if outage is None or outage[0] > killed_at + BOUND_S or outage[1] < killed_at:
        return BOUND_S
    return max(TTL_S, outage[1] - killed_at) + 2 * SWEEP_S + SLACK_S


KILLS = 4


def need_backend(backend: str) -> None:
    if backend == "docker":
        need_base_image()
    else:
        from helpers.sandboxes import base_tree

        base_tree()


def labelled(namespace: str) -> dict[str, str]:
    return sandbox_owners("docker", namespace)


def wait_until(check, timeout_s: float, every_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found or time.monotonic() >= deadline:
            return found
        time.sleep(every_s)


class Chaos:
    """Four worker SIGKILLs (each of a worker with a sandbox up, replaced at once) and one Redis
    SIGKILL + restart on its AOF, a couple of seconds apart, in a thread."""

    def __init__(self, server: EmbeddedRedis, settings, backend: str, tmp_path):
        self.server, self.settings, self.backend, self.tmp_path = server, settings, backend, tmp_path
        self.workers = [harbor_worker(settings, backend) for _ in range(2)]
        self.events: Counter = Counter()  # the chaos done, by kind
        self.t0, self.timeline = time.monotonic(), list[str]()
        self.arrived = 0  # rollouts at the consumer so far
        self.kills: list[list[str]] = []  # per worker SIGKILL, the sandboxes it left
        self.last_kill = 0.0
        self.orphans: dict[str, float] = {}  # container -> when its worker was SIGKILLed (monotonic)
        self.removed_after: dict[str, float] = {}  # container -> seconds from that kill to its removal
        self.outage: tuple[float, float] | None = None  # Redis's SIGKILL and its restart (monotonic)
        self.done, self.finished = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.watcher = threading.Thread(target=self.watch, daemon=True)

    def labelled(self) -> dict[str, str]:
        """The namespace's containers (running or not): id -> its worker label."""
        return sandbox_owners(self.backend, self.settings.namespace)

    def victim(self) -> int | None:
        """The index of a worker of ours with a sandbox labelled with its id, if any."""
        pids = {p.pid: i for i, p in enumerate(self.workers) if p.poll() is None}
        for worker in self.labelled().values():
            if worker and worker_pid(worker) in pids:
                return pids[worker_pid(worker)]
        return None

    def kill_worker(self) -> None:
        def pick() -> tuple | None:  # (index,) of a victim, ("done",) once the run ended; None: none yet
            if self.done.is_set():
                return ("done",)
            found = self.victim()
            return None if found is None else (found,)  # a tuple: worker 0 is a victim too (0 is falsy)

        picked = wait_until(pick, 60.0)
        if picked == ("done",):  # the run ended first
            return
        found = None if picked is None else picked[0]
        i = 0 if found is None else found
        pid = self.workers[i].pid
        self.workers[i].kill()
        self.workers[i].communicate()
        killed_at = time.monotonic()
        mine = [b for b, w in self.labelled().items() if w and worker_pid(w) == pid]  # the sweeper's to remove
        self.orphans.update({b: killed_at for b in mine})
        self.kills.append(mine)
        self.workers[i] = harbor_worker(self.settings, self.backend)
        self.last_kill = killed_at
        self.note("worker SIGKILL" + ("" if found is not None else " (no sandbox seen)"))

    def watch(self) -> None:
        """When each orphan disappeared (seconds after its worker's SIGKILL), until every one did."""
        while not (self.finished.is_set() and set(self.orphans) <= set(self.removed_after)):
            there = set(self.labelled())
            now = time.monotonic()
            for box, killed_at in list(self.orphans.items()):
                if box not in there and box not in self.removed_after:
                    self.removed_after[box] = now - killed_at
            if self.finished.wait(0.25) and time.monotonic() - self.last_kill > 60:
                return

    def note(self, what: str, event: bool = True) -> None:
        if event:
            self.events[what] += 1
        self.timeline.append(f"{time.monotonic() - self.t0:.1f}s {what}")

    def kill_redis(self) -> None:
        proc = self.server.proc
        assert proc is not None
        down_at = time.monotonic()
        proc.kill()
        proc.wait()
        self.done.wait(1.0)
        self.server = EmbeddedRedis(self.tmp_path / "redis", port=self.server.port, appendfsync="always").start()
        self.outage = (down_at, time.monotonic())
        self.note("redis SIGKILL + restart")

    def run(self) -> None:
        # Paced by the rollouts that came in, so that every kill lands while the suite still runs.
        for step, after in (("worker", 0), ("worker", 4), ("redis", 8), ("worker", 12), ("worker", 16)):
            if self.done.wait(1.5) or not wait_until(lambda: self.arrived >= after or self.done.is_set(), 120):
                return
            self.kill_worker() if step == "worker" else self.kill_redis()

    def stop(self) -> list:
        self.done.set()
        self.finished.set()
        for thread in (self.thread, self.watcher):
            if thread.is_alive():
                thread.join(120)
        for p in self.workers:
            if p.returncode is None:
                stop(p, timeout=60)
        return [p.returncode for p in self.workers]


SAMPLES = {"docker": 3, "local": 6}


@pytest.mark.parametrize("backend", ["docker", "local"])
def test_oracle_run_through_kills_and_a_redis_restart(tmp_path, backend):
    need_backend(backend)
    namespace = f"hchaos-{uuid.uuid4().hex[:8]}"
    server = EmbeddedRedis(tmp_path / "redis", appendfsync="always").start()
    settings = make_settings(
        server.url,
        namespace,
        redis_down_max_s=60.0,
        visibility_timeout_s=5.0,
        heartbeat_ttl_s=TTL_S,
        sandbox_sweep_s=SWEEP_S,
        max_attempts=5,
    )
    # Several samples per task, so the run outlasts the kills however fast the backend is.
    rows = suite_rows(agent=AGENT) * SAMPLES[backend]
    chaos = Chaos(server, settings, backend, tmp_path)

    async def run():
        client = FarmClient(settings)
        tasks = [client.task(run_id="harbor-chaos", agent=AGENT, row=r) for r in rows]
        await client.submit(tasks)
        chaos.t0 = time.monotonic()
        chaos.thread.start()
        chaos.watcher.start()
        got = []
        async for rollout in client.results(tasks, timeout_s=240):
            got.append(rollout)
            chaos.arrived = len(got)
            if len(got) % 7 == 0:
                chaos.note(f"{len(got)} rollouts", event=False)
        duplicates = client.reader("harbor-chaos").duplicates
        await client.aclose()
        return tasks, got, duplicates

    t0 = time.monotonic()
    try:
        tasks, got, duplicates = asyncio.run(run())
        ran_s = time.monotonic() - t0
        chaos.done.set()
        chaos.thread.join(120)
        left_at_end = sandboxes_left(backend, namespace)
        cleared = wait_until(lambda: not sandboxes_left(backend, namespace), BOUND_S, every_s=0.1)
        clear_s = time.monotonic() - t0 - ran_s
        left_after = sandboxes_left(backend, namespace)
        chaos.finished.set()
        chaos.watcher.join(BOUND_S + 5)
        codes = chaos.stop()
        r = redis.Redis.from_url(chaos.server.url)
        dead = r.xlen(settings.keys.dead(AGENT))
        pending = r.xpending(settings.keys.tasks(AGENT), GROUP)["pending"]
        r.close()
    finally:
        chaos.stop()
        chaos.server.stop()
        if backend == "docker":
            remove_namespace(namespace)

    counts = Counter(x.task_id for x in got)
    swept = sorted(chaos.removed_after.values())
    late = {  # orphan -> (seconds it lived, its bound), for those past their bound
        b: (after, orphan_bound(chaos.orphans[b], chaos.outage))
        for b, after in chaos.removed_after.items()
        if after > orphan_bound(chaos.orphans[b], chaos.outage)
    }
    outage = f"{chaos.outage[1] - chaos.outage[0]:.1f}s" if chaos.outage else "none"
    rewards = Counter(x.reward if x.ok else f"failed: {x.error.kind}: {x.error.message}" for x in got)
    print(
        f"\nharbor chaos tally ({backend}): {len(tasks)} tasks, {len(got)} rollouts in {ran_s:.1f}s "
        f"({sum(x.ok for x in got)} ok; rewards {dict(rewards)}), {duplicates} duplicate deliveries dropped, "
        f"{dead} dead letters, {pending} pending; chaos: {dict(chaos.events)}; worker exit codes {codes}\n"
        f"  sandboxes the killed workers left: {len(chaos.orphans)}, removed {len(swept)}, the last "
        f"{swept[-1] if swept else 0:.1f}s after its worker's SIGKILL (bound {BOUND_S:g}s, more if Redis's outage "
        f"({outage}) fell in its window); left right after "
        f"the run: {len(left_at_end)}, after the sweep: {len(left_after)} (cleared {clear_s:.1f}s after the run, "
        f"{time.monotonic() - chaos.last_kill:.1f}s after the last kill)\n"
        f"  timeline: {', '.join(chaos.timeline)}\n"
        f"  per kill, sandboxes left and the seconds to remove them: "
        + ", ".join(
            f"{len(k)} in {max((chaos.removed_after.get(b, -1) for b in k), default=0):.1f}s" for k in chaos.kills
        )
    )
    assert sum(chaos.events.values()) == KILLS + 1, chaos.events
    assert set(counts) == {t.task_id for t in tasks} and set(counts.values()) == {1} and duplicates == 0
    assert rewards == Counter({1.0: len(tasks)}), rewards
    assert dead == 0 and pending == 0
    assert cleared and left_after == [], f"left {BOUND_S:g}s after the run: {left_after}"
    assert chaos.orphans and len(swept) == len(chaos.orphans), chaos.orphans
    assert not late, "orphans that outlived their bound (seconds lived, bound): " + ", ".join(
        f"{after:.1f}s > {bound:.1f}s" for after, bound in late.values()
    )


@pytest.fixture
def docker_ns(redis_url):
    need_base_image()
    namespace = f"hsweep-{uuid.uuid4().hex[:8]}"
    yield namespace
    remove_namespace(namespace)
    cleanup(redis_url, namespace)


def labelled_box(namespace: str, worker: str, expires: float, lifetime_s: int = 300) -> str:
    """A running container with the farm's labels, as a worker's backend would start it."""
    labels = {LABEL_NAMESPACE: namespace, LABEL_WORKER: worker, LABEL_EXPIRES: f"{expires:.0f}"}
    flags = [a for k, v in labels.items() for a in ("--label", f"{k}={v}")]
    out = docker(
        "run", "-d", "--rm", "--network", "none", *flags, "rollout-farm/base:bookworm", "sleep", str(lifetime_s)
    )
    return out.stdout.strip()


def test_a_killed_workers_sandbox_is_swept_and_live_ones_are_not(tmp_path, redis_url, docker_ns):
    settings = make_settings(redis_url, docker_ns, heartbeat_ttl_s=TTL_S, sandbox_sweep_s=SWEEP_S, max_attempts=5)
    r = redis.Redis.from_url(redis_url)
    control_worker = f"{AGENT}@control:1:{uuid.uuid4().hex[:6]}"  # a live worker: its heartbeat key is kept
    r.set(settings.keys.worker(control_worker), "{}", px=int(TTL_S * 1000))
    control = labelled_box(docker_ns, control_worker, time.time() + 300)
    victim, survivor = harbor_worker(settings, "docker", 1), harbor_worker(settings, "docker", 1)

    async def submit() -> None:
        client = FarmClient(settings)
        rows = [sleepy_row(tmp_path, 60, f"sleepy{i}") for i in range(2)]
        await client.submit([client.task(run_id="sweep", agent=AGENT, row=row) for row in rows])
        await client.aclose()

    try:
        asyncio.run(submit())

        def owners() -> dict[str, str]:
            r.set(settings.keys.worker(control_worker), "{}", px=int(TTL_S * 1000))
            return labelled(docker_ns)

        both = wait_until(lambda: len({worker_pid(w) for w in owners().values() if "@control" not in w}) == 2, 60)
        assert both, f"two rollouts did not start: {owners()}"
        boxes = owners()
        victim.kill()
        victim.communicate()
        killed_at = time.monotonic()
        orphan = next(b for b, w in boxes.items() if worker_pid(w) == victim.pid)
        live = next(b for b, w in boxes.items() if worker_pid(w) == survivor.pid)
        assert docker("inspect", "-f", "{{.State.Running}}", orphan).stdout.strip() == "true"
        gone = wait_until(lambda: orphan not in owners(), BOUND_S, every_s=0.1)
        took = time.monotonic() - killed_at
        left = owners()
        print(f"\nsweep: the killed worker's sandbox removed {took:.1f}s after the SIGKILL (bound {BOUND_S:g}s)")
        assert gone, f"the killed worker's sandbox {orphan[:12]} is still there {BOUND_S:g}s after the kill"
        assert live in left and control in left, "a live worker's sandbox was removed"
    finally:
        stop(survivor, timeout=60)
        if victim.poll() is None:
            victim.kill()
            victim.communicate()
        r.close()


def test_cli_lists_and_sweeps(redis_url, docker_ns, capsys, monkeypatch):
    settings = make_settings(redis_url, docker_ns)
    r = redis.Redis.from_url(redis_url)
    live_worker, gone_worker = "harbor@live:1:aaaaaa", "harbor@gone:2:bbbbbb"
    r.set(settings.keys.worker(live_worker), "{}", px=60_000)
    now = time.time()
    live = labelled_box(docker_ns, live_worker, now + 300)
    orphan = labelled_box(docker_ns, gone_worker, now + 300)
    expired = labelled_box(docker_ns, live_worker, now - 10)
    argv = ["--redis-url", redis_url, "--namespace", docker_ns, "sandbox"]
    try:
        capsys.readouterr()
        assert main([*argv, "list", "--backend", "docker"]) == 0
        listed = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:-1]}
        assert set(listed) == {live[:12], orphan[:12], expired[:12]}
        assert [listed[b[:12]][2] for b in (live, orphan, expired)] == ["yes", "no", "yes"]
        assert listed[expired[:12]][3].startswith("-") and int(listed[live[:12]][3].rstrip("s")) > 250

        assert main([*argv, "sweep"]) == 0
        out = capsys.readouterr().out
        assert f"removed {orphan[:12]}: its worker {gone_worker} is gone" in out
        assert f"removed {expired[:12]}: outlived its lifetime" in out
        assert "2 of 3 sandbox(es) removed" in out, out
        assert containers_of(docker_ns) == [live]  # the live worker's sandbox, within its lifetime, stays

        with monkeypatch.context() as m:
            m.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
            assert main([*argv, "sweep"]) == 3
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "does not answer" in err, err
        assert containers_of(docker_ns) == [live]
    finally:
        r.close()


def test_a_redis_outage_longer_than_the_heartbeat_ttl_sweeps_no_live_sandbox(tmp_path):
    """Regression: Redis down past heartbeat_ttl_s expires every worker's heartbeat at once; the first
    worker back swept the other (live) worker's sandbox, whose rollout then failed."""
    need_base_image()
    namespace = f"hout-{uuid.uuid4().hex[:8]}"
    server = EmbeddedRedis(tmp_path / "redis", appendfsync="always").start()
    settings = make_settings(
        server.url, namespace, heartbeat_ttl_s=TTL_S, sandbox_sweep_s=SWEEP_S, redis_down_max_s=60.0, max_attempts=5
    )
    workers = [harbor_worker(settings, "docker", 1) for _ in range(2)]

    async def run() -> list:
        client = FarmClient(settings)
        tasks = [client.task(run_id="o", agent=AGENT, row=sleepy_row(tmp_path, 25, f"s{i}")) for i in range(2)]
        await client.submit(tasks)
        await asyncio.to_thread(outage)
        got = [r async for r in client.results(tasks, timeout_s=120)]
        await client.aclose()
        return got

    def outage() -> None:
        nonlocal server
        assert wait_until(lambda: len(labelled(namespace)) == 2, 60), "two rollouts did not start"
        proc = server.proc
        assert proc is not None
        proc.kill()
        proc.wait()
        time.sleep(TTL_S + 3)
        server = EmbeddedRedis(tmp_path / "redis", port=server.port, appendfsync="always").start()

    try:
        got = asyncio.run(run())
    finally:
        for w in workers:
            stop(w, timeout=60)
        server.stop()
        remove_namespace(namespace)
    print(f"\noutage: {[(x.reward if x.ok else x.error.kind) for x in got]}")
    assert [x.ok and x.reward for x in got] == [1.0, 1.0], [x.error for x in got]
