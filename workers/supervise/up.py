"""`farm up`: a whole farm from one config file, as one supervised group, until Ctrl-C.

The file's `up:` section says what to start (its other keys are the farm's settings, read as
every farm process reads them):

    up:
      redis: embedded            # embedded (default when redis_url is unset) or external
      policy:                    # optional: serve SmolLM2 (or `model:`) on the embedded vLLM
        serve: true
        port: 8000
        max_model_len: 2048
      workers:                   # one pool per agent: processes (and concurrency, impl)
        single_tool_call: {processes: 1, concurrency: 16}
        mcqa: 2
      dashboard: {port: 8600}    # `farm dashboard` on 127.0.0.1

It prints where everything is, keeps the group until SIGINT or SIGTERM (or until a part
exits, which stops the rest), then stops the pools (they drain), the policy server and the
embedded Redis, in that order, leaving no process behind. `producer.pools` starts its pools
through `start_pools` too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from farm.errors import ConfigError, FarmError
from farm.settings import Settings, read_yaml_mapping
from farm.transport import redact


@dataclass(frozen=True)
class Pool:
    agent: str
    processes: int = 1
    concurrency: Optional[int] = None
    impl: Optional[str] = None


def parse_up(path: str | os.PathLike) -> dict[str, Any]:
    """The `up:` section of a config file, checked; a ConfigError names what is wrong."""
    data = read_yaml_mapping(path)
    section = data["farm"] if isinstance(data.get("farm"), dict) else data  # where the settings reader looks
    up = section.get("up")
    if not isinstance(up, dict):
        raise ConfigError(f"{path} has no `up:` section saying what to start (see configs/farm_up.yaml)")
    unknown = sorted(set(up) - {"redis", "policy", "workers", "dashboard"})
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) under up: {', '.join(unknown)} (redis, policy, workers, dashboard)")
    if up.get("redis", "embedded") not in ("embedded", "external"):
        raise ConfigError(f"{path}: up.redis must be embedded or external, got {up.get('redis')!r}")
    workers = up.get("workers") or {}
    if not isinstance(workers, dict) or not workers:
        raise ConfigError(f"{path}: up.workers must map agent names to process counts or {{processes, concurrency}}")
    pools = []
    for agent, spec in workers.items():
        spec = {"processes": spec} if isinstance(spec, int) and not isinstance(spec, bool) else spec
        if not isinstance(spec, dict) or set(spec) - {"processes", "concurrency", "impl"}:
            raise ConfigError(f"{path}: up.workers.{agent} must be a count or {{processes, concurrency, impl}}")
        for key in ("processes", "concurrency"):
            value = spec.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ConfigError(f"{path}: up.workers.{agent}.{key} must be an integer >= 1, got {value!r}")
        pools.append(Pool(str(agent), spec.get("processes", 1), spec.get("concurrency"), spec.get("impl")))
    policy = up.get("policy") or {}
    if not isinstance(policy, dict):
        raise ConfigError(f"{path}: up.policy must be a mapping ({{serve: true, port: 8000}})")
    return {"redis": up.get("redis", "embedded"), "policy": policy, "pools": pools, "dashboard": up.get("dashboard")}


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


def start_pools(
    stack: ExitStack, settings: Settings, pools: list[Pool], env: dict[str, str], log_dir: Path, prefix: str = "worker"
) -> list[subprocess.Popen]:
    """One `farm worker` pool per agent, logging to log_dir; stopped (drained) when the stack closes.

    With a health_port set, each worker process gets a port of its own: the pools' processes take
    health_port, health_port + 1, ... in order (one pool's slots are its base + 0..P-1)."""
    log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    procs: list[subprocess.Popen] = []
    stack.callback(stop_all, procs)
    offset = 0
    for pool in pools:
        cmd = worker_command(pool.agent, pool.processes, pool.concurrency, pool.impl)
        pool_env = dict(env)
        if settings.health_port:
            pool_env["FARM_HEALTH_PORT"] = str(settings.health_port + offset)
            offset += pool.processes
        out = open(log_dir / f"{prefix}-{pool.agent}.log", "ab")
        stack.callback(out.close)
        procs.append(subprocess.Popen(cmd, env=pool_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
    return procs


def wait_for_workers(
    settings: Settings, n: int, procs: list[subprocess.Popen], log_dir: Path, timeout_s: float = 120.0
) -> None:
    from farm.connection import connect_sync
    from farm.transport import errors

    r = connect_sync(settings)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            with errors(settings.redis_url):
                up = len(list(r.scan_iter(match=settings.keys.worker_pattern())))
            if up >= n:
                return
            for p in procs:
                if p.poll() is not None:
                    raise FarmError(
                        f"`{' '.join(p.args[2:])}` exited with {p.returncode} before it was ready (log in {log_dir})"
                    )
            if time.monotonic() > deadline:
                raise FarmError(f"{n} workers not up after {timeout_s:.0f}s (logs in {log_dir})")
            time.sleep(0.1)
    finally:
        r.close()


def stop_all(procs: list[subprocess.Popen], timeout_s: float = 60.0) -> None:
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


def run_up(settings: Settings, path: str | os.PathLike) -> int:
    from farm.embedded import ensure_redis

    plan = parse_up(path)
    if plan["redis"] == "external" and not settings.redis_url:
        raise ConfigError(f"{path}: up.redis is external but no redis_url is set")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    lines: list[str] = []
    with ExitStack() as stack:
        s = stack.enter_context(ensure_redis(settings))
        lines.append(f"redis     {redact(s.redis_url)}  namespace {s.namespace!r}")
        env = dict(os.environ, FARM_REDIS_URL=s.redis_url, FARM_NAMESPACE=s.namespace, FARM_CONFIG=str(path))
        policy = plan["policy"]
        if policy.get("serve"):
            from workers.policy.serving import PolicyServer, default_cache, prepare_model

            model = Path(policy["model"]) if policy.get("model") else prepare_model(default_cache())
            server = stack.enter_context(
                PolicyServer(
                    model,
                    port=int(policy.get("port", 8000)),
                    max_model_len=int(policy.get("max_model_len", 2048)),
                    log_path=s.data_path / "logs" / "vllm-up.log",
                )
            )
            env.update(
                FARM_POLICY_URLS=server.url,
                FARM_POLICY_MODEL=server.served_model_name,
                FARM_POLICY_TOKENIZER=str(model),
            )
            lines.append(f"policy    {server.openai_url}  model {server.served_model_name}")
        elif s.policy_urls:
            lines.append(f"policy    {', '.join(s.policy_urls)} (configured)")
        log_dir = s.data_path / "logs"
        procs = start_pools(stack, s, plan["pools"], env, log_dir, prefix="up")
        dashboard = plan["dashboard"]
        if dashboard:
            port = int((dashboard if isinstance(dashboard, dict) else {}).get("port", 8600))
            out = open(log_dir / "up-dashboard.log", "ab")
            stack.callback(out.close)
            cmd = [sys.executable, "-m", "farm", "dashboard", "--port", str(port)]
            procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
            lines.append(f"dashboard http://127.0.0.1:{port}/  (metrics at /metrics)")
        wait_for_workers(s, sum(p.processes for p in plan["pools"]), procs, log_dir)
        for pool in plan["pools"]:
            lines.append(
                f"workers   {pool.agent}: {pool.processes} process(es)"
                + (f" x {pool.concurrency}" if pool.concurrency else "")
                + f"  (log {log_dir}/up-{pool.agent}.log)"
            )
        print("farm up:\n  " + "\n  ".join(lines) + "\nCtrl-C stops everything.", flush=True)
        code = 0
        while not stop.is_set():
            for p in procs:
                if p.poll() is not None:
                    print(
                        f"farm up: `{' '.join(p.args[2:])}` exited with {p.returncode}; stopping the rest",
                        file=sys.stderr,
                        flush=True,
                    )
                    code = 1
                    stop.set()
            stop.wait(0.5)
        print("farm up: stopping", flush=True)
    return code
