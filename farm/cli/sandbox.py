"""`farm sandbox base [--force] [--no-docker]`: the sandboxes' base image, built offline.

`base` runs envs.boxes.base: a Debian bookworm tree from this machine's own apt mirror
(debootstrap, minutes the first time), stored under the data dir, then imported into Docker as
`rollout-farm/base:bookworm` when a daemon answers (skipped when the image already holds the same
content). It prints where the tree is and the image's name. Expected failures (not root, no
debootstrap, no mirror, a failed import) end in one line and exit 2.

`list` prints this namespace's sandboxes (id, state, worker, whether the worker's heartbeat is
alive, task, seconds until its expiry); `sweep` removes, once, those a worker's sweeper would
(workers/delivery/sweeper.py: the worker's heartbeat expired, or the sandbox outlived its expiry)
and prints each with its reason. Both take --backend (default: the sandbox_backend setting). A
Docker daemon that does not answer ends in one line and exit 3, Redis unreachable too (3).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Optional

import click

from farm.cli.base import CONTEXT, Globals, cli, pass_globals
from farm.errors import ConfigError


@cli.group(context_settings=CONTEXT)
def sandbox() -> None:
    """Sandboxes for agentic tasks: their base image and the sandboxes this host runs."""


@sandbox.command(epilog="Examples:\n\n  farm sandbox base\n\n  farm sandbox base --force --no-docker")
@click.option("--force", is_flag=True, help="build the tree again even when one is there.")
@click.option("--no-docker", is_flag=True, help="build the tree only; do not import it into Docker.")
@pass_globals
def base(g: Globals, force: bool, no_docker: bool) -> int:
    """Build the sandbox base tree (debootstrap) and import it into Docker."""
    from envs.boxes.base import BASE_IMAGE, build_base, docker_answers, import_docker
    from envs.sdk.sandbox import SandboxError

    def say(line: str) -> None:
        click.echo(line, err=True)

    try:
        tree = build_base(g.settings().data_path, force=force, progress=say)
        docker = not no_docker and docker_answers()
        if docker:
            import_docker(tree, progress=say)
    except SandboxError as exc:
        raise ConfigError(str(exc)) from None
    click.echo(f"tree: {tree.rootfs} (content id {tree.content_id})")
    if docker:
        click.echo(f"image: {BASE_IMAGE}")
    else:
        click.echo("image: not imported (" + ("--no-docker" if no_docker else "no Docker daemon answers") + ")")
    return 0


BACKEND = click.option(
    "--backend",
    type=click.Choice(["docker", "local"]),
    default=None,
    help="the sandbox backend (default: the sandbox_backend setting, $FARM_SANDBOX_BACKEND).",
)


def _sandbox_settings(g: Globals, backend: Optional[str]) -> Any:
    s = g.settings(sandbox_backend=backend)
    return s if s.redis_url else s.replace(redis_url=f"redis://127.0.0.1:{s.embedded_port}/0")


@sandbox.command(
    "list", epilog="Examples:\n\n  farm sandbox list\n\n  farm --namespace exp1 sandbox list --backend local"
)
@BACKEND
@pass_globals
def list_(g: Globals, backend: Optional[str]) -> int:
    """This namespace's sandboxes: id, worker, whether that worker is alive, task, expiry."""
    s = _sandbox_settings(g, backend)
    rows = asyncio.run(list_sandboxes(s))
    click.echo(f"{'ID':<12}  {'STATE':<7}  {'ALIVE':<5}  {'EXPIRES IN':>10}  {'WORKER':<40}  TASK")
    for r in rows:
        expires = "-" if r["expires_in_s"] is None else f"{r['expires_in_s']:.0f}s"
        click.echo(
            f"{r['id'][:12]:<12}  {r['state']:<7}  {'yes' if r['alive'] else 'no':<5}  {expires:>10}  "
            f"{r['worker'] or '-':<40}  {r['task'] or '-'}"
        )
    click.echo(f"{len(rows)} sandbox(es) in namespace {s.namespace!r}")
    return 0


@sandbox.command(epilog="Examples:\n\n  farm sandbox sweep\n\n  farm --namespace exp1 sandbox sweep --backend local")
@BACKEND
@pass_globals
def sweep(g: Globals, backend: Optional[str]) -> int:
    """Remove the sandboxes whose worker's heartbeat expired or that outlived their expiry."""
    s = _sandbox_settings(g, backend)
    found, removed = asyncio.run(sweep_sandboxes(s))
    for box_id, why in removed.items():
        click.echo(f"removed {box_id[:12]}: {why}")
    click.echo(f"{len(removed)} of {found} sandbox(es) removed in namespace {s.namespace!r}")
    return 0


async def _with_backend(s: Any, work: Any) -> Any:
    """`work(backend, alive)` with the process's backend and a Redis heartbeat check, both closed
    after; an unreachable backend is one line (docker daemon: exit 3, else 2)."""
    from envs.sdk.sandbox import SandboxError, SandboxUnavailable
    from farm.connection import connect
    from farm.transport import errors
    from workers.delivery.sweeper import alive_workers
    from workers.loops.sandboxes import BackendUnavailable, make_backend

    tracked = make_backend(s)
    r = connect(s)
    alive = alive_workers(r, s.keys)

    async def checked(workers: set[str]) -> set[str]:
        with errors(s.redis_url):
            return await alive(workers)

    try:
        return await work(tracked.backend, checked)
    except SandboxUnavailable as exc:
        raise (BackendUnavailable if s.sandbox_backend == "docker" else ConfigError)(
            f"sandbox_backend {s.sandbox_backend}: {exc}"
        ) from None
    except SandboxError as exc:
        raise ConfigError(f"sandbox_backend {s.sandbox_backend}: {exc}") from None
    finally:
        await tracked.aclose()
        await r.aclose()


async def list_sandboxes(s: Any) -> list[dict[str, Any]]:
    """One dict per sandbox of the namespace: id, state, worker, alive, task, expires_in_s."""
    from envs.sdk.sandbox import LABEL_EXPIRES, LABEL_TASK, LABEL_WORKER

    async def work(backend: Any, alive: Any) -> list[dict[str, Any]]:
        boxes = await backend.list(s.namespace)
        owners = {b.labels.get(LABEL_WORKER, "") for b in boxes} - {""}
        live = await alive(owners) if owners else set()
        now, out = time.time(), []
        for b in boxes:
            try:
                expires: Optional[float] = float(b.labels[LABEL_EXPIRES]) - now
            except (KeyError, ValueError):
                expires = None
            worker = b.labels.get(LABEL_WORKER, "")
            state = "running" if b.running else "stopped"
            out.append(
                dict(
                    id=b.id,
                    state=state,
                    worker=worker,
                    alive=worker in live,
                    task=b.labels.get(LABEL_TASK, ""),
                    expires_in_s=expires,
                )
            )
        return out

    return await _with_backend(s, work)


async def sweep_sandboxes(s: Any) -> tuple[int, dict[str, str]]:
    """One sweep of the namespace (workers/delivery/sweeper.py): (sandboxes found, {removed id: why})."""
    from workers.delivery.sweeper import sweep as sweep_once

    async def work(backend: Any, alive: Any) -> tuple[int, dict[str, str]]:
        result = await sweep_once(backend, s.namespace, alive)
        return result.found, result.reasons

    return await _with_backend(s, work)
