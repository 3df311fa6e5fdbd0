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
embedded Redis, in that order, leaving no process behind (`workers.supervise.stack.LocalStack`,
which `farm collect --embedded`, `farm demo` and the benchmarks start too).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from farm.errors import ConfigError
from farm.settings import Settings, read_yaml_mapping
from farm.transport import redact
from workers.supervise.stack import LocalStack, Pool, ServePolicy


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


def run_up(settings: Settings, path: str | os.PathLike) -> int:
    plan = parse_up(path)
    if plan["redis"] == "external" and not settings.redis_url:
        raise ConfigError(f"{path}: up.redis is external but no redis_url is set")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    policy = plan["policy"]
    serve = None
    if policy.get("serve"):
        serve = ServePolicy(
            Path(policy["model"]) if policy.get("model") else None,
            port=int(policy.get("port", 8000)),
            max_model_len=int(policy.get("max_model_len", 2048)),
            log_name="vllm-up.log",
        )
    pools = plan["pools"]
    with LocalStack(settings, pools, policy=serve, env={"FARM_CONFIG": str(path)}, log_prefix="up") as stack:
        s = stack.settings
        lines = [f"redis     {redact(s.redis_url)}  namespace {s.namespace!r}"]
        if stack.policy_server is not None:
            lines.append(f"policy    {stack.policy_server.openai_url}  model {stack.policy_server.served_model_name}")
        elif s.policy_urls:
            lines.append(f"policy    {', '.join(s.policy_urls)} (configured)")
        dashboard = plan["dashboard"]
        if dashboard:
            port = int((dashboard if isinstance(dashboard, dict) else {}).get("port", 8600))
            stack.spawn([sys.executable, "-m", "farm", "dashboard", "--port", str(port)], "dashboard")
            lines.append(f"dashboard http://127.0.0.1:{port}/  (metrics at /metrics)")
        for pool in pools:
            lines.append(
                f"workers   {pool.agent}: {pool.processes} process(es)"
                + (f" x {pool.concurrency}" if pool.concurrency else "")
                + f"  (log {stack.log_path(pool.agent)})"
            )
        print("farm up:\n  " + "\n  ".join(lines) + "\nCtrl-C stops everything.", flush=True)
        code = 0
        while not stop.is_set():
            for p in stack.procs:
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
