"""Dataset commands (data generate, prepare, blend) and shell completion."""

from __future__ import annotations

import json
from typing import Any

import click

from farm.cli.base import CONTEXT, COUNT, Globals, cli, pass_globals

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
    "  farm data generate code_gen --size 20 --seed 3 -o -\n\n"
    "  farm data generate harbor --tasks my-suite/ -o harbor.jsonl",
)
@click.argument("env")
@click.option("--size", type=COUNT, default=None, help="number of rows (harbor: of tasks; default all).")
@click.option(
    "--tasks", default=None, metavar="DIR", help="harbor: the suite of task directories (default: the project's)."
)
@click.option(
    "--build",
    is_flag=True,
    help="harbor: build every task's image now with sandbox_backend; a Dockerfile that does not build is named.",
)
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
@pass_globals
def data_generate(g: Globals, env, size, build, tasks, seed, agent, output, env_options) -> int:
    """Rows from an environment's generator, deterministic by seed."""
    from envs import data as data_mod

    data_mod.run_generate(env, size, seed, output, agent=agent, options=_options(env_options), tasks=tasks)
    if build:
        _build_images(g, output)
    return 0


def _build_images(g: Globals, output: str) -> None:
    """`--build`: every task's image of the rows just written, built by the sandbox backend."""
    import asyncio

    from farm.errors import ConfigError
    from workers.loops.sandboxes import build_images, make_backend

    if output == "-":
        raise ConfigError("--build needs the rows in a file (-o FILE)")
    with open(output) as f:
        dirs = [json.loads(line)["task_dir"] for line in f if line.strip()]
    errors = asyncio.run(build_images(make_backend(g.settings()), dirs, lambda line: click.echo(line, err=True)))
    for line in errors:
        click.echo(f"farm: {line}", err=True)
    if errors:
        raise ConfigError(f"{len(errors)} task image(s) do not build (rows written to {output})")


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
    from workers.loops.agent import known_agents

    settings = g.settings()
    agents = None if no_check_agents else known_agents(settings)
    types = None if no_check_agents else data_mod.row_types(settings.agents)
    try:
        data_mod.run_prepare(
            path,
            agent=agent,
            output=output,
            strict=not lenient,
            agents=agents,
            replace_agent=replace_agent,
            row_type_of=types,
        )
    except data_mod.DataError as exc:
        if not exc.errors:
            raise
        _echo_line_errors(path, exc)
        raise data_mod.DataError(exc.summary) from None  # the summary: the error boundary's one line
    return 0


def _echo_line_errors(path: str, exc: Any) -> None:
    """One line per bad line of the file (each naming its line number), before the summary line."""
    for error in exc.errors:
        click.echo(" ".join(f"{path}: {error}".split()), err=True)
    if exc.total > len(exc.errors):
        click.echo(f"{path}: ... and {exc.total - len(exc.errors)} more invalid lines", err=True)


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
