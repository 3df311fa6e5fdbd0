"""Task images for the docker backend: a task's Dockerfile built once per content, offline.

Why: every rollout of a task starts from the same image, and a farm host reaches no registry.
`Builder.build` rewrites each `FROM` that names an alias (envs/boxes/aliases.py) onto its target,
hashes what the image is made of (the rewritten Dockerfile, every context file's path, mode and
bytes, and the image id of every base it names) and tags the result
`rollout-farm/task:<first 16 hex of that sha256>`. A tag that exists is the cache hit: nothing is
sent to the daemon but one `image inspect`. Concurrent callers for the same content in this
process wait on one lock per hash, so it builds once (two processes may both build it; the second
build is the daemon's own layer cache and gives the same tag).

The build runs with networking off (`networkmode=none`), through the daemon's classic builder (the
API's default), so its progress names each step; a failure is SandboxStartError in one line with
the step number, its instruction, the daemon's error and the step's last output line. A base that
is not present is refused before the build (no pull is attempted: there is no registry).
Not honoured: `.dockerignore` (the whole context is sent and hashed), build arguments.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from pathlib import Path, PurePosixPath
from typing import Mapping

from envs.boxes.aliases import map_base
from envs.boxes.base import BASE_IMAGE
from envs.boxes.docker_engine import ApiError, Engine, tar_dir
from envs.sdk.sandbox import ImageSpec, SandboxStartError

__all__ = ["Builder", "TASK_REPOSITORY", "rewrite_from"]

TASK_REPOSITORY = "rollout-farm/task"

_FROM = re.compile(
    r"^(?P<lead>[ \t]*FROM[ \t]+(?:--\S+[ \t]+)*)(?P<image>\S+)(?P<rest>.*)$", re.IGNORECASE | re.MULTILINE
)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_STAGE = re.compile(r"[ \t]+AS[ \t]+(\S+)", re.IGNORECASE)


def rewrite_from(dockerfile: str, aliases: Mapping[str, str]) -> tuple[str, list[str]]:
    """The Dockerfile with aliased FROMs replaced, and the external images it builds on (a FROM
    naming an earlier stage is left alone and is not a base)."""
    stages: set[str] = set()
    bases: list[str] = []

    def one(m: re.Match) -> str:
        image = m["image"]
        if image.lower() not in stages:
            image = map_base(image, aliases)
            bases.append(image)
        stage = _STAGE.match(m["rest"])
        if stage:
            stages.add(stage.group(1).lower())
        return f"{m['lead']}{image}{m['rest']}"

    return _FROM.sub(one, dockerfile), bases


def _digest(context: Path, dockerfile: str, text: str, base_ids: list[str]) -> str:
    h = hashlib.sha256()
    for part in (text.encode(), *(b.encode() for b in base_ids)):
        h.update(len(part).to_bytes(8, "big") + part)
    for path in sorted(context.rglob("*")):
        rel = path.relative_to(context).as_posix()
        if rel == dockerfile:
            continue
        if path.is_symlink():
            body = b"link:" + str(path.readlink()).encode()
        elif path.is_file():
            body = b"file:" + path.read_bytes()
        else:
            body = b"dir"
        for part in (rel.encode(), oct(path.lstat().st_mode & 0o7777).encode(), body):
            h.update(len(part).to_bytes(8, "big") + part)
    return h.hexdigest()


class Builder:
    def __init__(self, engine: Engine, aliases: Mapping[str, str]):
        self.engine = engine
        self.aliases = aliases
        self.builds_run = 0  # builds sent to the daemon (the cache's hits are the other calls)
        self._locks: dict[str, asyncio.Lock] = {}

    async def _image_id(self, image: str) -> str | None:
        try:
            return (await self.engine.call("GET", f"/images/{image}/json"))["Id"]
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def build(self, spec: ImageSpec) -> str:
        spec = ImageSpec(spec.context, PurePosixPath(spec.dockerfile).as_posix())  # `./Dockerfile` is `Dockerfile`
        path = spec.context / spec.dockerfile
        try:
            text, bases = rewrite_from(path.read_text(), self.aliases)
        except OSError as e:
            raise SandboxStartError(f"cannot read {path}: {e.strerror or e}") from None
        ids = []
        for image in bases:
            found = await self._image_id(image)
            if found is None:
                hint = (
                    "run `farm sandbox base`"
                    if image == BASE_IMAGE
                    else "no registry is reachable: load or build it first"
                )
                raise SandboxStartError(f"{path}: FROM {image}: no such image here ({hint})")
            ids.append(found)
        digest = _digest(spec.context, spec.dockerfile, text, ids)
        tag = f"{TASK_REPOSITORY}:{digest[:16]}"
        lock = self._locks.setdefault(digest, asyncio.Lock())
        async with lock:
            if await self._image_id(tag) is None:
                await self._run(spec, text, tag)
        return tag

    async def _run(self, spec: ImageSpec, text: str, tag: str) -> None:
        self.builds_run += 1
        context = tar_dir(spec.context, ".", replace={spec.dockerfile: text.encode()})
        params = {
            "t": tag,
            "dockerfile": spec.dockerfile,
            "networkmode": "none",
            "rm": "1",
            "forcerm": "1",
        }
        resp = await self.engine.open(
            "POST", "/build", params=params, data=context, headers={"Content-Type": "application/x-tar"}, timeout_s=None
        )
        step, last = "before its first step", ""
        async for event in self.engine.lines(resp):
            out = _ANSI.sub("", event.get("stream") or "")
            for line in out.splitlines():
                if re.match(r"Step \d+/\d+ : ", line):
                    step, last = line[len("Step ") :].replace(" : ", " (", 1) + ")", ""
                elif line.strip() and not line.startswith((" ---> ", "Removing intermediate container")):
                    last = line.strip()
            if "error" in event:
                error = " ".join(str(event["error"]).split())
                tail = f"; last output: {last[:200]}" if last else ""
                raise SandboxStartError(f"{spec.context / spec.dockerfile}: build failed at step {step}: {error}{tail}")
