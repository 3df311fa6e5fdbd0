"""`farm cancel TASK_ID...` and `farm cancel --run RUN_ID`: stop work nobody needs any more.

A queued task is never run and a running one is stopped at once; each ends in one `cancelled`
rollout on its run's result stream (farm.cancel). Ids (or a run) already cancelled within
cancel_ttl_s, and ids that are unknown or already finished, are a no-op that says which (exit 0);
a run this namespace has never seen exits 6; a malformed id exits 2 and Redis being unreachable 3,
as every command does. `--interrupt` stops them keeping what they generated (an `interrupted`
rollout each, farm.resume); `farm resume --input FILE` submits their continuations, refusing in
one line (exit 2), before anything is submitted, a rollout it cannot go on from.
"""

from __future__ import annotations

import asyncio

import click

from farm.cli.base import CONTEXT, Globals, cli, pass_globals
from farm.errors import NotFound


@cli.command(
    context_settings=CONTEXT,
    epilog="Examples:\n\n  farm cancel --run train-3f2a\n\n  farm cancel 9c1e0b7a... 77d2f1c0...",
)
@click.argument("task_ids", nargs=-1)
@click.option("--run", "run_id", default=None, help="cancel every queued or running task of this run.")
@click.option(
    "--interrupt", is_flag=True, help="interrupt instead: each ends `interrupted`, keeping what it generated."
)
@pass_globals
def cancel(g: Globals, task_ids: tuple[str, ...], run_id, interrupt: bool) -> int:
    """Cancel tasks by id, or every task of a run: each ends in one `cancelled` rollout."""
    if bool(task_ids) == bool(run_id):
        raise click.UsageError("give task ids or --run RUN_ID (one of the two)")
    s = _settings(g)
    report = asyncio.run(_cancel(s, list(task_ids), run_id, interrupt))
    if run_id and not report.run_known:
        raise NotFound(f"{report.line()} (namespace {s.namespace!r}; check --run and --namespace)")
    click.echo(report.line())
    return 0


async def _cancel(s, task_ids: list[str], run_id, interrupt: bool):
    from farm.client import FarmClient

    client = FarmClient(s)
    try:
        if interrupt:
            return await (client.interrupt_run(run_id) if run_id else client.interrupt(task_ids))
        return await (client.cancel_run(run_id) if run_id else client.cancel(task_ids))
    finally:
        await client.aclose()


def _settings(g: Globals):
    s = g.settings()
    return s if s.redis_url else s.replace(redis_url=f"redis://127.0.0.1:{s.embedded_port}/0")


@cli.command(context_settings=CONTEXT, epilog="Example:\n\n  farm resume --input interrupted.jsonl")
@click.option(
    "--input",
    "path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="interrupted rollouts, one JSON object per line (msgspec.json.encode of a Rollout).",
)
@click.option("--model", default=None, help="refuse rollouts sampled by another served model.")
@pass_globals
def resume(g: Globals, path: str, model) -> int:
    """Submit a continuation of each interrupted rollout: it goes on from its last token."""
    rollouts = _read_rollouts(path)
    tasks = asyncio.run(_resume(_settings(g), rollouts, model))
    click.echo(f"{len(tasks)} continuations submitted")
    for t in tasks:
        click.echo(f"{t.resume.origin if t.resume else t.task_id} -> {t.task_id}")
    return 0


def _read_rollouts(path: str) -> list:
    import msgspec

    from farm.errors import ConfigError
    from farm.schema import Rollout

    out = []
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(msgspec.json.decode(line, type=Rollout))
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise ConfigError(f"{path}:{number}: not a rollout ({exc})") from None
    return out


async def _resume(s, rollouts: list, model):
    from farm.client import FarmClient

    client = FarmClient(s)
    try:
        return await client.resume(rollouts, model=model)
    finally:
        await client.aclose()
