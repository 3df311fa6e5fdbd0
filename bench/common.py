"""What the benchmarks share: a Redis check, a namespace's clean-up, and pools of worker processes.

Every benchmark runs real `python -m farm worker` children in a namespace of its own
(`bench-<uuid>`), waits until each has written its heartbeat so start-up is not timed, and
deletes the namespace's keys afterwards; this module is that part, written once.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import redis

from workers.supervise.up import worker_command

ROOT = Path(__file__).resolve().parent.parent


def answers(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
    try:
        return bool(client.ping())
    except (redis.ConnectionError, redis.TimeoutError):
        return False
    finally:
        client.close()


def delete_namespace(url: str, namespace: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
        if keys:
            client.delete(*keys)
        return len(keys)
    finally:
        client.close()


def stop_all(children: list[subprocess.Popen], timeout_s: float = 30.0) -> None:
    """SIGTERM (a worker's graceful drain) to every child, then a kill for any still running after timeout_s."""
    from workers.supervise.up import stop_all as stop

    stop(children, timeout_s)


class WorkerPool:
    """P separate `python -m farm worker --processes 1` children, as a deployment would run them.

    Each child logs to `log_dir/worker-<label>-<i>.log`; `env` adds to the children's environment
    (the policy's address, a config file).
    """

    def __init__(
        self,
        url: str,
        namespace: str,
        agent: str,
        processes: int,
        concurrency: int,
        log_dir: Path,
        label: str,
        impl: str | None = None,
        **env: str,
    ):
        self.env = dict(
            os.environ,
            FARM_REDIS_URL=url,
            FARM_NAMESPACE=namespace,
            FARM_LOG_LEVEL="WARNING",
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            **env,
        )
        self.cmd = worker_command(agent, 1, concurrency, impl)
        self.processes, self.log_dir, self.label = processes, log_dir, label
        self.children: list[subprocess.Popen] = []

    def log(self, i: int) -> Path:
        return self.log_dir / f"worker-{self.label}-{i}.log"

    def __enter__(self) -> "WorkerPool":
        for i in range(self.processes):
            with open(self.log(i), "wb") as log:
                self.children.append(
                    subprocess.Popen(
                        self.cmd, env=self.env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
                    )
                )
        return self

    def __exit__(self, *exc) -> None:
        stop_all(self.children)

    @property
    def pids(self) -> list[int]:
        return [c.pid for c in self.children]

    def check(self) -> None:
        for i, c in enumerate(self.children):
            if c.poll() is not None:
                tail = self.log(i).read_text(errors="replace")[-2000:]
                raise SystemExit(f"worker {i} exited with {c.returncode}:\n{tail}")

    async def ready(self, client, timeout_s: float = 60.0, every_s: float = 0.1) -> None:
        """Until every worker has written its heartbeat (after its agent loads), so all of them share the load."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.check()
            live = [k async for k in client.r.scan_iter(match=client.keys.worker_pattern(), count=100)]
            if len(live) >= self.processes:
                return
            if time.monotonic() > deadline:
                raise SystemExit(f"only {len(live)} of {self.processes} workers came up in {timeout_s:.0f}s")
            await asyncio.sleep(every_s)
