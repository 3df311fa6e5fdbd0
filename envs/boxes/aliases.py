"""Which `FROM` images a task's Dockerfile may name and get the farm's base image instead.

Why: task suites are written against public bases (`ubuntu:24.04`, `python:3.12-slim`), but a farm
host reaches no registry; it has one base built offline (`farm sandbox base`). A task whose FROM
names one of these aliases is built on the base instead; any other FROM is used as written (a
local image, or a build error naming the step).

The mapping is one dict of image patterns (fnmatch: `*` matches anything, `?` one character) to
images, tried in order after an exact match. Names are compared normalised: `docker.io/` and
`library/` dropped, `:latest` added to a name without a tag, so `ubuntu`, `docker.io/ubuntu` and
`ubuntu:latest` are the same name. Where it comes from, first found: the caller's dict when it is
not empty (the `sandbox_base_aliases` setting, empty by default), then FARM_SANDBOX_BASE_ALIASES
(a JSON object; `{}` maps nothing), then DEFAULT_ALIASES. A given mapping replaces the defaults,
it does not extend them.

Used by the docker backend's build and by the local backend's Dockerfile subset (`map_base`).
"""

from __future__ import annotations

import fnmatch
import json
import os
from typing import Mapping, Optional

from envs.boxes.base import BASE_IMAGE
from envs.sdk.sandbox import SandboxStartError

__all__ = ["ALIASES_ENV", "DEFAULT_ALIASES", "load_aliases", "map_base", "normalise_image"]

ALIASES_ENV = "FARM_SANDBOX_BASE_ALIASES"

# Bases the common task suites start FROM: a Debian-family userland with bash and python3.
DEFAULT_ALIASES: Mapping[str, str] = {
    "ubuntu:*": BASE_IMAGE,
    "debian:*": BASE_IMAGE,
    "buildpack-deps:*": BASE_IMAGE,
    "python:3*": BASE_IMAGE,
}


def normalise_image(name: str) -> str:
    """`docker.io/library/ubuntu` -> `ubuntu:latest`; a digest or a tag is kept as written."""
    for prefix in ("docker.io/", "index.docker.io/", "library/"):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    last = name.rsplit("/", 1)[-1]
    if "@" not in last and ":" not in last:
        name += ":latest"
    return name


def load_aliases(
    aliases: Optional[Mapping[str, str]] = None, env: Optional[Mapping[str, str]] = None
) -> dict[str, str]:
    """The mapping in force: `aliases` unless empty, else FARM_SANDBOX_BASE_ALIASES, else the defaults.
    A malformed variable is a SandboxStartError in one line (a build cannot go on without it)."""
    if aliases:
        return dict(aliases)
    raw = (os.environ if env is None else env).get(ALIASES_ENV)
    if raw is None:
        return dict(DEFAULT_ALIASES)
    try:
        value = json.loads(raw)
    except ValueError as e:
        raise SandboxStartError(f"{ALIASES_ENV} is not JSON: {e}") from None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise SandboxStartError(
            f'{ALIASES_ENV} must be a JSON object of image patterns to images, e.g. {{"ubuntu:*": "{BASE_IMAGE}"}}'
        )
    return value


def map_base(image: str, aliases: Mapping[str, str]) -> str:
    """The image a FROM naming `image` builds on: its alias's target, or `image` itself."""
    name = normalise_image(image)
    for pattern, target in aliases.items():
        if normalise_image(pattern) == name:
            return target
    for pattern, target in aliases.items():
        if fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, normalise_image(pattern)):
            return target
    return image
