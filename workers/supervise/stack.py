"""A farm on this machine: Redis, then the policy server, then worker pools; stopped in reverse.

`farm up`, `farm collect --embedded`, `farm demo` and the benchmarks all need the same
sequence, so it is written once here:

1. Redis: the configured `redis_url`, else the embedded one already listening on
   embedded_port, else a new embedded one owned by the stack (`farm.embedded.ensure_redis`).
2. Optionally the embedded policy server (real vLLM, `workers.policy.serving`); the children
   and the stack's settings then point at it (`policy_env`). For a training run it serves the
   dev endpoints weight sync reloads through (`ServePolicy(weight_sync=True)`).
3. One `python -m farm worker --agent NAME --processes P` child per pool, each in a session
   of its own (so a pool's own children are stopped with it), with settings passed as FARM_*
   variables, never on the command line, logging to `<log_dir>/<log_prefix>-<label>.log`.
4. It waits until the pools' workers are live (their heartbeats in Redis), so what follows
   measures the farm, not its start-up; a child that exits first is named with its code and its
   own one-line error (read back from its log), and the stack's command exits as the child did
   for a setting, an unknown agent or Redis (2, 5, 3, 4), not as a crash.

Leaving the context sends SIGTERM to every child (a worker's graceful drain), SIGKILL to the
process group of any still running after stop_timeout_s, then stops the policy server and the
embedded Redis, leaving no process behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from farm.errors import ConfigError, FarmError, RedisAuthError, RedisUnavailable, UnknownAgent
from farm.settings import Settings
from workers.policy.serving import PolicyServer


@dataclass(frozen=True)
class Pool:
    """One `farm worker` child: P processes of one agent. `label` names its log (default: the agent),
    so several pools of one agent log apart."""

    agent: str
    processes: int = 1
    concurrency: Optional[int] = None
    impl: Optional[str] = None
    label: Optional[str] = None


@dataclass(frozen=True)
class ServePolicy:
    """The embedded policy server to start: vLLM serving `model` (default: SmolLM2, prepared offline)."""

    model: Optional[Path] = None
    port: int = 0  # 0: a free port
    max_model_len: int = 2048
    log_name: str = "vllm.log"  # under the data directory's logs/
    weight_sync: bool = False  # serve the dev endpoints a trainer reloads weights through (VLLM_SERVER_DEV_MODE=1)


def policy_env(url: str, model: str, tokenizer: str | os.PathLike) -> dict[str, str]:
    """The variables that point a child farm process (a worker, a collect) at one policy server."""
    return {"FARM_POLICY_URLS": url, "FARM_POLICY_MODEL": model, "FARM_POLICY_TOKENIZER": str(tokenizer)}


def worker_command(
    agent: str, processes: int = 1, concurrency: Optional[int] = None, impl: Optional[str] = None
) -> list[str]:
    """The `farm worker` command line of one pool (settings travel as FARM_* variables, never here)."""
    cmd = [sys.executable, "-m", "farm", "worker", "--agent", agent, "--processes", str(processes)]
    if concurrency:
        cmd += ["--concurrency", str(concurrency)]
    if impl:
        cmd += ["--impl", impl]
    return cmd


# A child's exit code, as the error its stack's command ends with (farm.errors' codes); others are crashes.
_AS_CHILD_EXITED: dict[int, type[FarmError]] = {2: ConfigError, 3: RedisUnavailable, 4: RedisAuthError, 5: UnknownAgent}


def child_error(cmd: Sequence[Any], code: int, log: Optional[Path], start: int, where: str) -> FarmError:
    """The error for a child that exited before it was ready: its command, its exit code and the last
    `farm: ` line it wrote to its log after byte `start` (its own one-line error: the file and line of
    an environment that raised at import), typed by its code."""
    line = ""
    if log is not None and log.exists():
        with open(log, "rb") as f:
            f.seek(max(start, log.stat().st_size - 65536))
            said = [t for t in f.read().decode(errors="replace").splitlines() if t.startswith("farm: ")]
        line = said[-1][len("farm: ") :] if said else ""
    what = " ".join(str(a) for a in cmd[2:])
    message = f"`{what}` exited with {code} before it was ready" + (f": {line}" if line else "") + where
    return _AS_CHILD_EXITED.get(code, FarmError)(message) if line else FarmError(message)


def stop_all(procs: Sequence[subprocess.Popen], timeout_s: float = 60.0) -> None:
    """SIGTERM (a worker's graceful drain) to every child, then SIGKILL to any still running after timeout_s
    (to its whole process group when it leads one: a pool's own children go with it)."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            try:
                if os.getpgid(p.pid) == p.pid:
                    os.killpg(p.pid, signal.SIGKILL)
                else:
                    p.kill()
            except ProcessLookupError:
                pass
            p.wait()


class ReloadableServer(PolicyServer):
    """A PolicyServer with vLLM's dev endpoints on: `/collective_rpc`, which a trainer's weight sync
    reloads through (trainer/weights.py), exists only with VLLM_SERVER_DEV_MODE=1."""

    def environment(self) -> dict[str, str]:
        return {**super().environment(), "VLLM_SERVER_DEV_MODE": "1"}


class LocalStack:
    """Redis, the policy server (with `policy`), one worker child per pool; live on entering, stopped on leaving.

    `env` adds to the children's environment (a config file, a log level, an outside policy's
    address). With `log_prefix=None` the children write to this process's stdout and stderr.
    Once entered: `settings` point at the Redis (and the served policy), `env` is what the
    children got, `procs` the children (watched by `exited`, stopped on leaving).
    """

    def __init__(
        self,
        settings: Settings,
        pools: Sequence[Pool],
        *,
        policy: Optional[ServePolicy] = None,
        env: Optional[Mapping[str, str]] = None,
        log_prefix: Optional[str] = "worker",
        log_dir: Optional[Path] = None,
        cwd: Optional[Path] = None,
        ready_timeout_s: float = 120.0,
        stop_timeout_s: float = 60.0,
    ):
        self.settings, self.pools, self.policy = settings, list(pools), policy
        self.extra_env = dict(env or {})
        self.log_prefix, self.cwd = log_prefix, cwd
        self.log_dir = log_dir or settings.data_path / "logs"
        self.ready_timeout_s, self.stop_timeout_s = ready_timeout_s, stop_timeout_s
        self.env: dict[str, str] = {}
        self.procs: list[subprocess.Popen] = []
        self._logs: dict[int, tuple[Path, int]] = {}  # a child's pid: its log, and its size then (appended to)
        self.policy_server: Any = None  # a workers.policy.serving.PolicyServer when `policy` is given
        self._exit = ExitStack()

    def start(self) -> "LocalStack":
        """Start everything without waiting for the workers (`wait_live`); `close` undoes it."""
        from farm.embedded import ensure_redis

        try:
            s = self._exit.enter_context(ensure_redis(self.settings))
            self.env = {**os.environ, "FARM_REDIS_URL": s.redis_url, "FARM_NAMESPACE": s.namespace, **self.extra_env}
            if self.policy:
                s = self._serve(s, self.policy)
            self.settings = s
            self._exit.callback(stop_all, self.procs, self.stop_timeout_s)
            offset = 0
            for pool in self.pools:
                pool_env = dict(self.env)
                if s.health_port:  # each process a port of its own: health_port, health_port + 1, ... in order
                    pool_env["FARM_HEALTH_PORT"] = str(s.health_port + offset)
                    offset += pool.processes
                cmd = worker_command(pool.agent, pool.processes, pool.concurrency, pool.impl)
                self.spawn(cmd, pool.label or pool.agent, pool_env)
        except BaseException:
            self.close()
            raise
        return self

    def _serve(self, s: Settings, spec: ServePolicy) -> Settings:
        from workers.policy.serving import default_cache, prepare_model

        model = spec.model or prepare_model(default_cache())
        log_path = s.data_path / "logs" / spec.log_name
        kind = ReloadableServer if spec.weight_sync else PolicyServer
        server = kind(model, port=spec.port, max_model_len=spec.max_model_len, log_path=log_path)
        self.policy_server = self._exit.enter_context(server)
        self.env.update(policy_env(server.url, server.served_model_name, model))
        return s.replace(policy_urls=[server.url], policy_model=server.served_model_name, policy_tokenizer=str(model))

    def spawn(self, cmd: list[str], label: str, env: Optional[Mapping[str, str]] = None) -> subprocess.Popen:
        """Start one more child (the stack's environment unless `env`), watched and stopped with the pools."""
        out: Any = None
        path = self.log_path(label)
        if path is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            out = open(path, "ab")
            start = out.seek(0, os.SEEK_END)
        try:
            proc = subprocess.Popen(
                cmd,
                env=dict(env if env is not None else self.env),
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT if out else None,
                start_new_session=True,
            )
        finally:
            if out:
                out.close()  # the child holds its own copy
        self.procs.append(proc)
        if path is not None:
            self._logs[proc.pid] = (path, start)
        return proc

    def log_path(self, label: str) -> Optional[Path]:
        """Where the child `label` logs; None when the children write to this terminal."""
        return self.log_dir / f"{self.log_prefix}-{label}.log" if self.log_prefix is not None else None

    def exited(self) -> Optional[subprocess.Popen]:
        """The first child that has exited, if any."""
        return next((p for p in self.procs if p.poll() is not None), None)

    def wait_live(self, timeout_s: Optional[float] = None, every_s: float = 0.1) -> None:
        """Until as many workers are live as the pools have processes; a FarmError if a child exits first
        or the time runs out."""
        from farm.connection import connect_sync
        from farm.state import live_workers
        from farm.transport import errors

        n = sum(p.processes for p in self.pools)
        timeout_s = self.ready_timeout_s if timeout_s is None else timeout_s
        to_file = self.log_prefix is not None
        log, logs = (f" (log in {self.log_dir})", f" (logs in {self.log_dir})") if to_file else ("", "")
        r = connect_sync(self.settings)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                with errors(self.settings.redis_url):
                    if len(live_workers(r, self.settings.keys)) >= n:
                        return
                gone = self.exited()
                if gone is not None:
                    path, start = self._logs.get(gone.pid, (None, 0))
                    raise child_error(gone.args, gone.returncode, path, start, log)
                if time.monotonic() > deadline:
                    raise FarmError(f"{n} workers not up after {timeout_s:.0f}s{logs}")
                time.sleep(every_s)
        finally:
            r.close()

    def close(self) -> None:
        """Stop the children (drained), then the policy server, then the embedded Redis."""
        self._exit.close()

    def __enter__(self) -> "LocalStack":
        self.start()
        try:
            self.wait_live()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
