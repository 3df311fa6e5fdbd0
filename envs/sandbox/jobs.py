"""The sandbox as a queue: one rq job function, a worker that runs nothing else, and the client.

Why a queue at all: a farm worker runs thousands of rollouts on one event loop; sandbox runs
are CPU-bound processes better kept on their own workers (or hosts). rq carries them, with
its JSON serializer (never pickle).

Why the worker is locked down: anyone who can write to the queue's Redis can name any
importable function in a job. The worker therefore
  * runs one function only: `perform_job` refuses every job whose function is not
    envs.sandbox.run_job (an allow-list enforced here, before anything is imported or
    called), and records the refusal as the job's failure;
  * drops root at start: it takes a sandbox uid of its own (envs.sandbox.isolation) and, if
    the machine allows, a delegated cgroup subtree, then serves as that uid; the runs it
    makes are namespaced under it;
  * takes its work horses along when it dies: rq forks one per job in a process group of its
    own, which a SIGKILLed worker would leave running (with its program) until the wall limit;
    each horse asks for SIGKILL at its worker's death (PR_SET_PDEATHSIG), as the programs do;
  * reads its Redis URL (with the password) from FARM_SANDBOX_REDIS_URL, never argv;
  * talks to a Redis of its own by default: SandboxClient.private() starts a password-protected
    redis-server on 127.0.0.1 for the queue, so the farm's task database is never the
    sandbox's unless configured so (`sandbox_redis_url`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from envs.sandbox import cgroups, isolation
from envs.sandbox.result import Limits, SandboxError, SandboxResult
from envs.sandbox.run import run_program

log = logging.getLogger("farm.sandbox")

QUEUE = "farm-sandbox"
JOB = "envs.sandbox.run_job"
ALLOWED = frozenset({JOB})
URL_ENV = "FARM_SANDBOX_REDIS_URL"


class JobRefused(Exception):
    """A job naming a function other than the sandbox's own."""


def run_job(program: str, unit_tests: dict, limits: dict) -> dict:
    """The rq job (JSON in, JSON out): what the sandbox worker runs for each request."""
    if not isinstance(program, str) or not isinstance(unit_tests, dict) or not isinstance(limits, dict):
        raise TypeError("run_job takes program: str, unit_tests: dict, limits: dict")
    return run_program(program, unit_tests, Limits(**limits)).to_json()


def _worker_class():
    from rq import Worker

    class SandboxWorker(Worker):
        """An rq worker that performs envs.sandbox.run_job and refuses every other job."""

        def perform_job(self, job, queue, execution) -> bool:
            try:
                name = job.func_name
            except Exception as exc:  # data that does not even decode names nothing we run
                name = f"<undecodable: {type(exc).__name__}>"
            if name not in ALLOWED or job.instance is not None or job.args:
                try:
                    raise JobRefused(
                        f"refused job {job.id}: {name!r} is not the sandbox's job ({JOB}); nothing was run"
                    )
                except JobRefused:
                    log.warning("refused job %s naming %r", job.id, name)
                    self._finalize_failure(job, queue, execution, sys.exc_info())
                return False
            return super().perform_job(job, queue, execution)

        def main_work_horse(self, job, queue) -> None:
            # rq forks a horse per job in a process group of its own: it would outlive a worker
            # killed with SIGKILL (an OOM kill, a pod's end), and so would the program it runs,
            # until the wall limit. Dying with the worker ends both (the program dies with it).
            isolation.die_with(self.pid)
            super().main_work_horse(job, queue)

    return SandboxWorker


# Modules a worker needs after it has dropped root (the interpreter's own library may then be
# unreadable: /root is 0700 where pyenv installs live), imported while it still can read them.
_PRELOAD = (
    "json",
    "subprocess",
    "tempfile",
    "shutil",
    "resource",
    "ctypes",
    "fcntl",
    "secrets",
    "signal",
    "zlib",
    "base64",
    "uuid",
    "datetime",
    "_strptime",
    "calendar",
    "locale",
    "time",
    "traceback",
    "linecache",
    "tokenize",
    "logging.handlers",
    "encodings.idna",
    "encodings.latin_1",
    "encodings.ascii",
    "socket",
    "selectors",
    "select",
    "ssl",
    "hashlib",
    "hmac",
    "random",
    "struct",
    "copy",
    "decimal",
    "redis",
    "redis.client",
    "redis.connection",
    "rq",
    "rq.job",
    "rq.worker",
    "rq.serializers",
    "rq.timeouts",
    "rq.results",
    "rq.registry",
    "rq.executions",
    "rq.intermediate_queue",
    "rq.scheduler",
    "rq.suspension",
    "rq.worker_registration",
    "rq.maintenance",
    "rq.command",
    "rq.utils",
    "envs.sandbox",
    "envs.sandbox.runner",
)


def serve(redis_url: str, queue: str = QUEUE, name: Optional[str] = None) -> None:
    """Serve the queue: as root, first take a sandbox uid (and a cgroup subtree) and drop to it."""
    import datetime
    import importlib

    import redis
    from rq import Queue
    from rq.serializers import JSONSerializer

    for module in _PRELOAD:
        try:
            importlib.import_module(module)
        except ImportError:
            pass
    datetime.datetime.strptime("2000-01-01", "%Y-%m-%d")  # strptime's lazy set-up, while it can still load
    lease = None
    if os.geteuid() == 0:
        lease = isolation.UidLease()
        uid = lease.__enter__()
        delegated = cgroups.delegate_cgroups(uid)
        if delegated:
            os.environ[cgroups.DELEGATED] = delegated
        isolation.can_unshare()  # probed (and cached) before the drop, as the runs will be made
        os.chdir("/")
        isolation.drop_to(uid)
        os.environ["HOME"] = "/"
        log.info("sandbox worker serving as uid %d", uid)
    conn = redis.Redis.from_url(redis_url)
    worker_class = _worker_class()
    worker = worker_class(
        [Queue(queue, connection=conn, serializer=JSONSerializer)],
        connection=conn,
        serializer=JSONSerializer,
        name=name or f"sandbox-{uuid.uuid4().hex[:8]}",
    )
    worker.work(logging_level="WARNING")


def start_worker(redis_url: str, queue: str = QUEUE, name: Optional[str] = None) -> subprocess.Popen:
    """An rq worker process for `queue`; it dies with the process that started it.

    The URL travels in the environment (it may hold a password); the command line holds none."""

    def die_with_parent() -> None:
        isolation.libc().prctl(isolation.PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)

    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    env[URL_ENV] = redis_url
    cmd = [sys.executable, "-m", "envs.sandbox", "worker", "--queue", queue] + (["--name", name] if name else [])
    return subprocess.Popen(cmd, env=env, cwd=root, preexec_fn=die_with_parent if sys.platform == "linux" else None)


class PrivateRedis:
    """A password-protected redis-server on 127.0.0.1 for the sandbox queue alone."""

    def __init__(self) -> None:
        from farm.embedded import EmbeddedRedis

        self.dir = tempfile.mkdtemp(prefix="farm-sandbox-redis-")
        self.server = EmbeddedRedis(self.dir, password=secrets.token_urlsafe(24), persist=False).start()

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self) -> None:
        import shutil

        self.server.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class SandboxClient:
    """Enqueue runs on the sandbox queue and await their results without blocking the loop.

    With `start_workers` > 0 the client starts that many rq workers on first use and
    restarts one that died (a bounded number of times); a job whose worker died mid-run,
    or no result within wall_s + wait_margin_s, raises SandboxError."""

    def __init__(
        self,
        redis_url: str,
        queue: str = QUEUE,
        *,
        start_workers: int = 1,
        wait_margin_s: float = 60.0,
        max_restarts: int = 5,
        poll_s: float = 0.02,
        private: Optional[PrivateRedis] = None,
    ):
        self.redis_url, self.queue_name = redis_url, queue
        self.start_workers, self.wait_margin_s = start_workers, wait_margin_s
        self.max_restarts, self.poll_s = max_restarts, poll_s
        self.restarts = 0
        self.workers: dict[str, subprocess.Popen] = {}
        self.private = private
        self._queue = None
        self._aredis = None

    @classmethod
    def private_queue(cls, **options) -> "SandboxClient":
        """A client whose queue lives in a Redis of its own, started now and stopped by close()."""
        private = PrivateRedis()
        return cls(private.url, QUEUE, private=private, **options)

    def _ensure_workers(self) -> None:
        for name, proc in list(self.workers.items()):
            if proc.poll() is not None:
                del self.workers[name]
                if self.restarts >= self.max_restarts:
                    raise SandboxError(
                        f"sandbox worker exited with {proc.returncode}; gave up after {self.restarts} restarts"
                    )
                self.restarts += 1
        while len(self.workers) < self.start_workers:
            name = f"sandbox-{os.getpid()}-{uuid.uuid4().hex[:6]}"
            self.workers[name] = start_worker(self.redis_url, self.queue_name, name)

    def _enqueue(self, payload: dict, timeout_s: float):
        import redis
        from rq import Queue
        from rq.serializers import JSONSerializer

        if self._queue is None:
            self._queue = Queue(
                self.queue_name, connection=redis.Redis.from_url(self.redis_url), serializer=JSONSerializer
            )
        return self._queue.enqueue(
            JOB, kwargs=payload, job_timeout=int(timeout_s) + 5, result_ttl=300, failure_ttl=300, ttl=int(timeout_s) + 5
        )

    async def run(self, program: str, unit_tests: dict, limits: Limits = Limits()) -> SandboxResult:
        job = await self.submit(program, unit_tests, limits)
        return await self.wait(job, limits.wall_s + self.wait_margin_s)

    async def submit(self, program: str, unit_tests: dict, limits: Limits = Limits()):
        """Enqueue one run (starting or restarting the owned workers first); returns the rq Job."""
        if self.start_workers:
            self._ensure_workers()
        payload = {"program": program, "unit_tests": unit_tests, "limits": asdict(limits)}
        try:
            return await asyncio.to_thread(self._enqueue, payload, limits.wall_s + self.wait_margin_s)
        except Exception as exc:
            raise SandboxError(f"could not enqueue on {self.queue_name!r}: {type(exc).__name__}: {exc}") from exc

    async def wait(self, job, budget_s: float) -> SandboxResult:
        """Poll the job's status off the event loop's back until it ends, its worker dies or time runs out."""
        import redis.asyncio as aioredis

        if self._aredis is None:
            self._aredis = aioredis.Redis.from_url(self.redis_url)
        deadline = time.monotonic() + budget_s
        try:
            while True:
                status = (await self._aredis.hget(job.key, "status") or b"").decode()
                if status in ("finished", "failed", "stopped", "canceled"):
                    break
                if time.monotonic() > deadline:
                    await asyncio.to_thread(job.cancel)
                    raise SandboxError(
                        f"no sandbox result within {budget_s:.0f}s (job {status or 'gone'}); "
                        f"is an rq worker serving queue {self.queue_name!r}?"
                    )
                dead = [n for n, p in self.workers.items() if p.poll() is not None]
                if dead:
                    running = (await self._aredis.hget(job.key, "worker_name") or b"").decode()
                    self._ensure_workers()
                    if status == "started" and running in dead:
                        raise SandboxError(f"sandbox worker {running} died while running job {job.id}")
                await asyncio.sleep(self.poll_s)
            result = await asyncio.to_thread(job.latest_result)
        except asyncio.CancelledError:
            # The rollout was cancelled (farm.cancel) or its worker is stopping: nobody wants this
            # result, so the program stops now instead of running out its wall limit.
            await asyncio.shield(asyncio.to_thread(self._stop, job))
            raise
        except SandboxError:
            raise
        except Exception as exc:  # Redis or rq trouble: the machinery's failure, not the program's
            raise SandboxError(f"waiting for sandbox job {job.id} failed: {type(exc).__name__}: {exc}") from exc
        if status != "finished" or result is None or not isinstance(result.return_value, dict):
            why = result.exc_string.strip().splitlines()[-1] if result is not None and result.exc_string else status
            raise SandboxError(f"sandbox job {job.id} {status}: {why}")
        return SandboxResult.from_json(result.return_value)

    @staticmethod
    def _stop(job) -> None:
        """Stop a job nobody waits for: kill its work horse when it runs (the program, its child
        with PDEATHSIG, dies with it), else take it off the queue."""
        from rq.command import send_stop_job_command
        from rq.serializers import JSONSerializer

        try:
            send_stop_job_command(job.connection, job.id, serializer=JSONSerializer)
        except Exception:  # noqa: BLE001 - not running (queued, or just ended): cancel it instead
            try:
                job.cancel()
            except Exception as exc:  # noqa: BLE001 - it ended meanwhile; nothing to stop
                log.debug("sandbox job %s: nothing to stop (%s)", job.id, exc)

    def close(self) -> None:
        for proc in self.workers.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.workers.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.workers.clear()
        if self.private is not None:
            self.private.stop()
            self.private = None
