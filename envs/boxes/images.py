"""What a `local` image reference means: the cache layout, the reference format, base aliases.

References the `local` backend accepts in `SandboxSpec.image`:
- `local:<id>`: an image `LocalBackend.build` made from a Dockerfile, cached by content under
  `<data_dir>/sandbox/images/<id>/` (`layers/<n>/`, bottom first, and `config.json`: layers, env,
  workdir, user, the base's content id);
- `rollout-farm/base:bookworm` (BASE_IMAGE), or any name an alias maps onto it.

Aliases: task Dockerfiles name the images they were written for; the local backend has one base,
a Debian bookworm tree, so `FROM` names that are close enough (Debian 12, Ubuntu, python:3.x,
buildpack-deps:bookworm) run on it. DEFAULT_ALIASES holds fnmatch patterns; FARM_SANDBOX_BASE_ALIASES
(a JSON object, name or pattern -> BASE_IMAGE) adds to them, and so does an `aliases` argument.
A name that matches nothing is refused rather than run on a base it was not written for.
"""

from __future__ import annotations

import fnmatch
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional

from envs.boxes.base import BASE_IMAGE
from envs.sdk.sandbox import SandboxStartError

REF_PREFIX = "local:"
ALIASES_ENV = "FARM_SANDBOX_BASE_ALIASES"
DEFAULT_ALIASES: Mapping[str, str] = {
    "debian:bookworm*": BASE_IMAGE,
    "debian:12*": BASE_IMAGE,
    "debian:stable*": BASE_IMAGE,
    "ubuntu:*": BASE_IMAGE,  # Ubuntu's userland differs in versions, not in kind
    "python:3*": BASE_IMAGE,  # the base has python3 (3.11) with pytest, and `python`
    "buildpack-deps:bookworm*": BASE_IMAGE,
    "base": BASE_IMAGE,
}


def all_aliases(extra: Optional[Mapping[str, str]] = None, env: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    env = os.environ if env is None else env
    out = dict(DEFAULT_ALIASES)
    if env.get(ALIASES_ENV):
        try:
            loaded = json.loads(env[ALIASES_ENV])
        except ValueError as exc:
            raise SandboxStartError(f"{ALIASES_ENV} is not JSON: {exc}") from None
        if not isinstance(loaded, dict):
            raise SandboxStartError(f"{ALIASES_ENV} must be a JSON object of image name -> {BASE_IMAGE}")
        out.update({str(k): str(v) for k, v in loaded.items()})
    out.update(extra or {})
    return out


def is_base(name: str, aliases: Mapping[str, str]) -> bool:
    """Whether `name` is the base image itself or maps onto it."""
    if name == BASE_IMAGE:
        return True
    if name in aliases:
        return aliases[name] == BASE_IMAGE
    return any(fnmatch.fnmatchcase(name, pattern) and target == BASE_IMAGE for pattern, target in aliases.items())


def images_dir(data_dir: Path) -> Path:
    return Path(data_dir).expanduser() / "sandbox" / "images"


@dataclass(frozen=True)
class ImageConfig:
    layers: tuple[str, ...] = ()  # absolute layer directories, bottom first (the base not included)
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str = "/"
    user: Optional[str] = None
    base_content_id: str = ""

    def lowerdirs(self, base_rootfs: Path) -> list[str]:
        """Overlay lowerdirs, top first, the base tree last."""
        return [*reversed(self.layers), str(base_rootfs)]

    def to_json(self) -> str:
        return json.dumps(
            {
                "layers": list(self.layers),
                "env": dict(self.env),
                "workdir": self.workdir,
                "user": self.user,
                "base_content_id": self.base_content_id,
            },
            indent=1,
        )


def load_image(ref: str, data_dir: Path, aliases: Mapping[str, str]) -> ImageConfig:
    """The image a reference names; SandboxStartError in one line when there is none."""
    if ref.startswith(REF_PREFIX):
        path = images_dir(data_dir) / ref[len(REF_PREFIX) :] / "config.json"
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError):
            raise SandboxStartError(f"no local image {ref} (build it with the local backend first)") from None
        return ImageConfig(
            tuple(raw["layers"]), dict(raw["env"]), raw["workdir"], raw.get("user"), raw.get("base_content_id", "")
        )
    if is_base(ref, aliases):
        return ImageConfig()
    raise SandboxStartError(
        f"image {ref!r} is not one the local backend has: use {BASE_IMAGE}, a `local:` reference from build, "
        f"or map it onto the base with {ALIASES_ENV}"
    )
