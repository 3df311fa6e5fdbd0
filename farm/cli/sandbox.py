"""`farm sandbox base [--force] [--no-docker]`: the sandboxes' base image, built offline.

`base` runs envs.boxes.base: a Debian bookworm tree from this machine's own apt mirror
(debootstrap, minutes the first time), stored under the data dir, then imported into Docker as
`rollout-farm/base:bookworm` when a daemon answers (skipped when the image already holds the same
content). It prints where the tree is and the image's name. Expected failures (not root, no
debootstrap, no mirror, a failed import) end in one line and exit 2.

The group is the home of the other sandbox commands (`sweep`, `list`).
"""

from __future__ import annotations

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
