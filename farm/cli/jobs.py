"""Commands that run a job to its end: demo, collect, train."""

from __future__ import annotations

import json
from pathlib import Path

import click

from farm.cli.base import COUNT, POSITIVE, Finite, Globals, cli, pass_globals
from farm.errors import ConfigError
from farm.settings import Settings, load_settings

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
    "--share",
    type=Finite(0, min_open=True, max=1e6),
    default=1.0,
    show_default=True,
    help="this run's share of the workers' slots while other runs also have tasks queued.",
)
@click.option(
    "--max-in-flight",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="most of this run's tasks running at once per agent (0: no cap).",
)
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
    share,
    max_in_flight,
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
        share=share,
        max_in_flight=max_in_flight,
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
    return run_collect(_run_settings(g, embedded), options)["exit_code"]


def _run_settings(g: Globals, embedded: bool) -> Settings:
    """The settings of a collect or eval run, its embedded workers told of the config, Redis checked."""
    settings = g.settings()
    if embedded and g.config:  # the embedded workers are children: they read the same file through FARM_CONFIG
        import os

        os.environ["FARM_CONFIG"] = str(Path(g.config).resolve())
    if not embedded or settings.redis_url:  # --embedded without a redis_url starts one
        from farm.connection import reached

        reached(settings)  # a Redis that never answered: one line and exit 3, not a start that waits it out
    return settings


@cli.command(
    epilog="Examples:\n\n  farm train --config configs/grpo_smollm2_multi_env.yaml --embedded\n\n"
    "  farm train --config configs/grpo_smollm2_multi_env.yaml   (Redis, vLLM and workers started apart)"
)
@click.option(
    "-c",
    "--config",
    "train_config",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="training YAML: TRL's GRPOConfig keys at the top, the farm's settings under `farm:`.",
)
@click.option(
    "--embedded",
    is_flag=True,
    help="start Redis (unless redis_url is set), vLLM serving model_name with weight sync, and one worker "
    "pool per agent the rows name; stop them at the end.",
)
@click.option("--workers", type=COUNT, default=1, show_default=True, help="worker processes per agent with --embedded.")
@click.option("--worker-concurrency", type=COUNT, default=None, help="rollouts per worker process with --embedded.")
@click.option(
    "--policy-port",
    type=click.IntRange(0, 65535),
    default=0,
    help="the port the vLLM of --embedded listens on (default: a free one).",
)
@click.option("--max-steps", type=COUNT, default=None, help="override the config's max_steps.")
@pass_globals
def train(g: Globals, train_config, embedded, workers, worker_concurrency, policy_port, max_steps) -> int:
    """GRPO with TRL on rollouts from the farm: pre-flight checks, then training with weight sync."""
    from farm.settings import read_yaml_mapping
    from trainer.config import load_train_config
    from trainer.launch import Embedded, run

    # A key the farm refuses fails here, before anything starts.
    cfg = load_train_config(train_config, {"max_steps": max_steps} if max_steps else None)
    # The farm's settings: the global --config, else the training file's `farm:` section, else defaults.
    own = g.config or (train_config if "farm" in read_yaml_mapping(train_config) else None)
    settings = load_settings(own, overrides=g.overrides)
    if policy_port and not embedded:
        raise click.UsageError("--policy-port is the port of the vLLM --embedded starts: add --embedded")
    spec = Embedded(workers, worker_concurrency, own, policy_port) if embedded else None
    click.echo(json.dumps(run(settings, cfg, spec)))
    return 0


@cli.command(
    "eval",
    epilog="Examples:\n\n  farm eval --input heldout.jsonl --output eval.jsonl --embedded\n\n"
    "  farm eval --input heldout.jsonl --output eval.jsonl --limit 200 --json",
)
@click.option("--input", "input_", required=True, type=click.Path(exists=True, dir_okay=False), help="JSONL rows.")
@click.option("--output", required=True, type=click.Path(dir_okay=False), help="rollouts file (rewritten).")
@click.option("--agent", default=None, help="override every row's agent_ref.name.")
@click.option("--limit", type=COUNT, default=None, help="only the first N valid rows.")
@click.option("--embedded", is_flag=True, help="start Redis, the policy and the worker pools as collect does.")
@click.option("--workers", type=COUNT, default=1, show_default=True, help="worker processes per agent with --embedded.")
@click.option("--temperature", type=Finite(0), default=0.0, show_default=True, help="0: greedy.")
@click.option("--seed", type=int, default=0, show_default=True, help="sampling seed (matters when temperature > 0).")
@click.option("--max-tokens", type=COUNT, default=None)
@click.option("--pass-threshold", type=Finite(), default=1.0, show_default=True, help="reward that counts as a pass.")
@click.option("--timeout", type=POSITIVE, default=None, help="seconds per rollout from submission.")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON instead of a table.")
@pass_globals
def evaluate(
    g: Globals,
    input_,
    output,
    agent,
    limit,
    embedded,
    workers,
    temperature,
    seed,
    max_tokens,
    pass_threshold,
    timeout,
    as_json,
) -> int:
    """Pass rate on held-out rows (one rollout each), with a 95% interval."""

    from farm.schema import Sampling
    from producer.collect import CollectOptions, run_collect
    from producer.evaluate import render, score
    from producer.output import Paths

    options = CollectOptions(
        input=Path(input_),
        output=Path(output),
        agent=agent,
        num_repeats={"default": 1},
        limit=limit,
        timeout_s=timeout,
        overwrite=True,
        embedded=embedded,
        worker_processes=workers,
        sampling=Sampling(temperature=temperature, max_tokens=max_tokens, seed=seed),
        pass_threshold=pass_threshold,
        progress=not as_json,
    )
    summary = run_collect(_run_settings(g, embedded), options)
    paths = Paths.for_output(Path(output))
    result = score(paths.output, paths.failures, pass_threshold)
    result.update(input=str(input_), temperature=temperature, seed=seed, complete=summary["complete"])
    (paths.output.parent / f"{paths.output.stem}_eval.json").write_text(json.dumps(result, indent=2) + "\n")
    click.echo(json.dumps(result) if as_json else render(result))
    return summary["exit_code"]
