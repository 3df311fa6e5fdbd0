"""`farm reverify --input rollouts.jsonl --output new.jsonl`: stored rollouts scored again by the
current verifiers, without the policy (producer/reverify.py does the work; docs/reverify.md).

Exit codes as every command's: 0 every answered rollout re-scored, 1 some could not be (their
reasons in the failures file), 2 bad input (no rollout line, a torn or foreign line under
--strict, an output that exists without --resume or --overwrite), 5 no environment for any line,
130 interrupted (rerun with --resume).
"""

from __future__ import annotations

from pathlib import Path

import click

from farm.cli.base import COUNT, POSITIVE, Globals, cli, pass_globals


@cli.command(
    epilog="Examples:\n\n  farm reverify --input rollouts.jsonl --output rescored.jsonl\n\n"
    "  farm reverify --input rollouts.jsonl --output rescored.jsonl --resume\n\n"
    "  farm reverify --input rollouts.jsonl --output rescored.jsonl --agent mymod:FixedEnv"
)
@click.option(
    "--input",
    "input_",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="rollouts as `farm collect` wrote them (JSONL).",
)
@click.option("--output", required=True, type=click.Path(dir_okay=False), help="re-scored rollouts (JSONL).")
@click.option(
    "--agent",
    default=None,
    help="score every line with this agent's environment (a configured agent, a registered environment, "
    "or module:Class) instead of each line's own.",
)
@click.option("--concurrency", type=COUNT, default=64, show_default=True, help="rollouts being verified at once.")
@click.option("--resume", is_flag=True, help="complete only the input lines not yet written.")
@click.option("--overwrite", is_flag=True, help="discard an existing output and start again.")
@click.option("--strict", is_flag=True, help="refuse an input with torn or foreign lines instead of skipping them.")
@click.option("--no-progress", is_flag=True, help="no progress and no table (the summary file only).")
@click.option(
    "--progress-every", type=POSITIVE, default=5.0, show_default=True, help="seconds between progress lines in logs."
)
@pass_globals
def reverify(
    g: Globals, input_, output, agent, concurrency, resume, overwrite, strict, no_progress, progress_every
) -> int:
    """Score stored rollouts again with the current verifiers; never calls the policy."""
    from producer.reverify import ReverifyOptions, run_reverify

    options = ReverifyOptions(
        input=Path(input_),
        output=Path(output),
        agent=agent,
        concurrency=concurrency,
        resume=resume,
        overwrite=overwrite,
        strict=strict,
        progress=not no_progress,
        progress_every_s=progress_every,
    )
    return run_reverify(g.settings(), options)["exit_code"]
