"""`farm cancel TASK_ID...` and `farm cancel --run RUN_ID`: stop work nobody needs any more.

A queued task is never run and a running one is stopped at once; each ends in one `cancelled`
rollout on its run's result stream (farm.cancel). Ids (or a run) already cancelled within
cancel_ttl_s, and ids that are unknown or already finished, are a no-op that says which (exit 0);
a run this namespace has never seen exits 6; a malformed id exits 2 and Redis being unreachable 3,
as every command does.
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
@pass_globals
def cancel(g: Globals, task_ids: tuple[str, ...], run_id) -> int:
    """Cancel tasks by id, or every task of a run: each ends in one `cancelled` rollout."""
    if bool(task_ids) == bool(run_id):
        raise click.UsageError("give task ids or --run RUN_ID (one of the two)")
    s = g.settings()
    if not s.redis_url:
        s = s.replace(redis_url=f"redis://127.0.0.1:{s.embedded_port}/0")
    report = asyncio.run(_cancel(s, list(task_ids), run_id))
    if run_id and not report.run_known:
        raise NotFound(f"{report.line()} (namespace {s.namespace!r}; check --run and --namespace)")
    click.echo(report.line())
    return 0


async def _cancel(s, task_ids: list[str], run_id):
    from farm.client import FarmClient

    client = FarmClient(s)
    try:
        return await (client.cancel_run(run_id) if run_id else client.cancel(task_ids))
    finally:
        await client.aclose()
