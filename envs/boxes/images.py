"""What a `local` image reference means: the cache layout, the reference format, base aliases.

References the `local` backend accepts in `SandboxSpec.image`:
- `local:<id>`: an image `LocalBackend.build` made from a Dockerfile, cached by content under
  `<data_dir>/sandbox/images/<id>/` (`layers/<n>/`, bottom first, and `config.json`: layers, env,
  workdir, user, the base's content id);
- `rollout-farm/base:bookworm` (BASE_IMAGE), or any name an alias maps onto it.

Aliases (envs.boxes.aliases, shared with the docker backend): a `FROM` or image name that an alias
maps onto BASE_IMAGE (Debian, Ubuntu, python:3.x, buildpack-deps by default) runs on the base tree;
any other name is refused rather than run on a base it was not written for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional

from envs.boxes.aliases import ALIASES_ENV, map_base
from envs.boxes.base import BASE_IMAGE
from envs.sdk.sandbox import SandboxStartError

REF_PREFIX = "local:"


def is_base(name: str, aliases: Mapping[str, str]) -> bool:
    """Whether `name` is the base image itself or maps onto it."""
    return name in (BASE_IMAGE, "base") or map_base(name, aliases) == BASE_IMAGE


def images_dir(data_dir: Path) -> Path:
    return Path(data_dir).expanduser() / "sandbox" / "images"


@dataclass(frozen=True)
class ImageConfig:
    layers: tuple[str, ...] = ()  # layer directories, bottom first (the base not included); in
    # config.json relative to the image's directory (it is built under another name, then renamed)
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
        home = images_dir(data_dir) / ref[len(REF_PREFIX) :]
        try:
            raw = json.loads((home / "config.json").read_text())
        except (OSError, ValueError):
            raise SandboxStartError(f"no local image {ref} (build it with the local backend first)") from None
        return ImageConfig(
            tuple(str(home / layer) for layer in raw["layers"]),
            dict(raw["env"]),
            raw["workdir"],
            raw.get("user"),
            raw.get("base_content_id", ""),
        )
    if is_base(ref, aliases):
        return ImageConfig()
    raise SandboxStartError(
        f"image {ref!r} is not one the local backend has: use {BASE_IMAGE}, a `local:` reference from build, "
        f"or map it onto the base with {ALIASES_ENV}"
    )
