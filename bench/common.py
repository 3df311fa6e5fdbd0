"""What the benchmarks share: a Redis check, a namespace's clean-up, and pools of worker processes.

Every benchmark runs real `python -m farm worker` children in a namespace of its own
(`bench-<uuid>`), waits until each has written its heartbeat so start-up is not timed, and
deletes the namespace's keys afterwards; this module is that part. The children are started,
watched and stopped by `workers.supervise.stack.LocalStack`, as `farm up` starts its own.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import redis

from farm.errors import FarmError
from farm.settings import load_settings
from workers.supervise.stack import LocalStack, Pool

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


class WorkerPool:
    """P separate `python -m farm worker --processes 1` children, as a deployment would run them: a
    `LocalStack` on the benchmark's Redis, with nothing else started.

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
        settings = load_settings(env={}, overrides={"redis_url": url, "namespace": namespace})
        self.labels = [f"{label}-{i}" for i in range(processes)]
        self.stack = LocalStack(
            settings,
            [Pool(agent, 1, concurrency, impl, label=name) for name in self.labels],
            env={
                "FARM_LOG_LEVEL": "WARNING",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                **env,
            },
            log_dir=log_dir,
            cwd=ROOT,
            stop_timeout_s=30.0,
        )

    def __enter__(self) -> "WorkerPool":
        self.stack.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stack.close()

    @property
    def children(self) -> list[subprocess.Popen]:
        return self.stack.procs

    @property
    def pids(self) -> list[int]:
        return [c.pid for c in self.children]

    def check(self) -> None:
        for label, c in zip(self.labels, self.children):
            if c.poll() is not None:
                log = self.stack.log_path(label)
                tail = log.read_text(errors="replace")[-2000:] if log else ""
                raise SystemExit(f"worker {label} exited with {c.returncode}:\n{tail}")

    async def ready(self, client=None, timeout_s: float = 60.0, every_s: float = 0.1) -> None:
        """Until every worker has written its heartbeat (after its agent loads), so all of them share the load.

        `client` is not needed (the stack reads the heartbeats itself); callers still pass theirs."""
        try:
            await asyncio.to_thread(self.stack.wait_live, timeout_s, every_s)
        except FarmError as exc:
            self.check()  # a child that exited: its log's tail
            raise SystemExit(str(exc)) from exc
