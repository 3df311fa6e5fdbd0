"""The Dockerfile subset the `local` backend builds: a task's image without a Docker daemon.

Supported (one stage, built on the base tree):
  FROM     the base (`rollout-farm/base:bookworm`) or a name envs.boxes.aliases maps onto it;
           `AS name` is allowed, a second FROM (multi-stage) is not
  RUN      shell form (`/bin/sh -c`) or JSON form, in a build sandbox over the layers so far, network
           off, as the current USER in the current WORKDIR; what it writes becomes a new layer
  COPY     from the context (globs; a directory copies its contents); `--chown=user[:group]` and
           `--chmod=octal`; `--from` is multi-stage and refused
  ADD      as COPY for local files; a URL or an archive (which ADD would unpack) is refused
  WORKDIR  (created), ENV (both forms), ARG (a build-time variable, not kept in the image),
           USER (later RUNs, and the sandbox's default exec user)
  ignored  CMD, ENTRYPOINT, EXPOSE, LABEL, MAINTAINER, STOPSIGNAL, HEALTHCHECK, VOLUME: a sandbox
           is driven by exec, so they change nothing
  refused  anything else (SHELL, ONBUILD, ...): SandboxStartError naming the instruction and line.
`$VAR` and `${VAR}` in ENV, WORKDIR, COPY, ADD and USER are expanded from ENV and ARG values (RUN
leaves them to its shell). `.dockerignore` is not read: every file of the context is copied and
hashed.

Cache: an image is keyed by a hash of the Dockerfile, every file of the context (path, mode,
content) and the base tree's content id; it is built once per key, under a file lock (concurrent
builders wait, then find it), into a temporary directory renamed to
`<data_dir>/sandbox/images/<key>/` when complete. `build_image` returns `local:<key>`.
A RUN that fails is a SandboxStartError: `Dockerfile line N: RUN ... failed (exit X): <stderr>`.
"""

from __future__ import annotations

import asyncio
import fcntl
import glob
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any, Mapping, Optional, Protocol

from envs.boxes.base import load_base
from envs.boxes.images import REF_PREFIX, ImageConfig, images_dir, is_base
from envs.boxes.local_exec import Identity
from envs.sdk.sandbox import ImageSpec, SandboxSpec, SandboxStartError, SandboxUnavailable


class LocalBackend(Protocol):
    """What a build needs of the local backend (envs/boxes/local.py), typed here so the backend may
    import this module and not the other way round."""

    aliases: Mapping[str, str]
    data_dir: Path

    async def start_on(
        self, spec: SandboxSpec, image: ImageConfig, lowerdirs: list[str], upper: Optional[Path] = None
    ) -> Any: ...


__all__ = ["Instruction", "build_image", "parse"]

SUPPORTED = {"FROM", "RUN", "COPY", "ADD", "WORKDIR", "ENV", "ARG", "USER"}
IGNORED = {"CMD", "ENTRYPOINT", "EXPOSE", "LABEL", "MAINTAINER", "STOPSIGNAL", "HEALTHCHECK", "VOLUME"}
ARCHIVES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst")
STEP_TIMEOUT_S = 1800.0
STEP_SPEC = SandboxSpec(image="build", lifetime_s=STEP_TIMEOUT_S + 60, cpus=2.0, memory_mb=4096, pids=4096)
_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


@dataclass(frozen=True)
class Instruction:
    line: int
    op: str
    args: str

    def fail(self, why: str) -> SandboxStartError:
        return SandboxStartError(f"Dockerfile line {self.line}: {self.op} {why}")


def parse(text: str) -> list[Instruction]:
    """Instructions with their first line's number; continuations joined, comments dropped."""
    out: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if not pending:
            start = n
        if line.endswith("\\"):
            pending.append(line[:-1])
            continue
        words = " ".join([*pending, line]).strip().split(None, 1)
        pending = []
        if words:
            out.append(Instruction(start, words[0].upper(), words[1] if len(words) > 1 else ""))
    if pending:
        words = " ".join(pending).split(None, 1)
        out.append(Instruction(start, words[0].upper(), words[1] if len(words) > 1 else ""))
    return out


def check(steps: list[Instruction], aliases: Mapping[str, str]) -> list[Instruction]:
    """The steps to run, or SandboxStartError at the first one outside the subset."""
    froms = [s for s in steps if s.op == "FROM"]
    if not froms:
        raise SandboxStartError("Dockerfile line 1: no FROM instruction")
    for s in steps:
        if s.op not in SUPPORTED and s.op not in IGNORED:
            raise s.fail("is not supported by the local sandbox backend")
        if s.op == "FROM" and s is not froms[0]:
            raise s.fail("again: multi-stage builds are not supported by the local sandbox backend")
        if s.op in ("COPY", "ADD") and "--from" in s.args.split("=")[0].split():
            raise s.fail("--from (multi-stage) is not supported by the local sandbox backend")
        if s.op in ("RUN", "COPY", "ADD", "WORKDIR", "ENV", "USER") and steps.index(s) < steps.index(froms[0]):
            raise s.fail("before FROM")
    words = [w for w in froms[0].args.split() if not w.startswith("--")]
    if not words or not is_base(words[0], aliases):
        raise froms[0].fail(f"{words[0] if words else ''}: the local backend builds only on its base image or an alias")
    return [s for s in steps if s.op in SUPPORTED and s.op != "FROM"]


def _expand(text: str, values: Mapping[str, str]) -> str:
    return _VAR.sub(lambda m: values.get(m.group(1) or m.group(2), ""), text)


def _env_pairs(args: str, values: Mapping[str, str]) -> dict[str, str]:
    words = shlex.split(args)
    if words and "=" not in words[0]:  # legacy `ENV KEY value with spaces`
        key, _, rest = args.strip().partition(" ")
        return {key: _expand(rest.strip(), values)}
    return {k: _expand(v, values) for k, _, v in (w.partition("=") for w in words)}


def _digest(context: Path, dockerfile: str, base_id: str) -> str:
    h = hashlib.sha256(json.dumps(["local-image/1", base_id, dockerfile]).encode())
    for root, dirs, files in os.walk(context):
        dirs.sort()
        for name in sorted(files):
            path = Path(root, name)
            rel = path.relative_to(context).as_posix()
            st = path.lstat()
            h.update(f"\0{rel}\0{st.st_mode:o}\0".encode())
            h.update(os.readlink(path).encode() if path.is_symlink() else path.read_bytes())
    return h.hexdigest()[:32]


@dataclass
class _State:
    env: dict[str, str] = field(default_factory=dict)
    args: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    user: Optional[str] = None

    def values(self) -> dict[str, str]:
        return {**self.args, **self.env}

    def path(self, p: str) -> str:
        return str(PurePosixPath(self.workdir, _expand(p, self.values())))


def _copy_tar(step: Instruction, context: Path, state: _State) -> bytes:
    """The tar that extracted at / performs this COPY (or local ADD)."""
    words = json.loads(step.args) if step.args.lstrip().startswith("[") else shlex.split(step.args)
    flags = {k: v for k, _, v in (w[2:].partition("=") for w in words if w.startswith("--"))}
    paths = [w for w in words if not w.startswith("--")]
    if len(paths) < 2:
        raise step.fail("needs a source and a destination")
    dest = state.path(paths[-1])
    owner, _, group = _expand(flags.get("chown", "root"), state.values()).partition(":")
    base = context.resolve()
    matches: list[Path] = []
    for src in paths[:-1]:
        src = _expand(src, state.values())
        if step.op == "ADD" and (re.match(r"^\w+://", src) or src.endswith(ARCHIVES)):
            raise step.fail(f"{src}: URLs and archives are not supported by the local backend (use COPY)")
        found = sorted(glob.glob(str(base / src.lstrip("/"))))
        if not found:
            raise step.fail(f"{src}: no such file in the build context")
        for f in found:
            if not Path(f).resolve().is_relative_to(base):
                raise step.fail(f"{src}: outside the build context")
            matches.append(Path(f))

    def own(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uname, info.gname = owner, group or owner
        info.uid = info.gid = int(owner) if owner.isdigit() else 0
        if "chmod" in flags:
            info.mode = int(flags["chmod"], 8)
        return info

    into_dir = paths[-1].endswith(("/", "/.")) or paths[-1] in (".", "..") or len(matches) > 1
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for m in matches:
            if m.is_dir():
                for child in sorted(m.iterdir()):
                    tar.add(str(child), arcname=f"{dest}/{child.name}".lstrip("/"), filter=own)
            else:
                target = f"{dest}/{m.name}" if into_dir else dest
                tar.add(str(m), arcname=target.lstrip("/"), filter=own)
    return buf.getvalue()


async def _step(
    backend: LocalBackend, base: Path, work: Path, layers: list[str], state: _State, step: Instruction, context: Path
) -> None:
    """Run one RUN / COPY / WORKDIR in a build sandbox; what it wrote becomes layers[len(layers)]."""
    stdin: Optional[bytes] = None
    if step.op == "RUN":
        argv = json.loads(step.args) if step.args.lstrip().startswith("[") else ["/bin/sh", "-c", step.args]
        cwd, user = state.workdir, state.user
    elif step.op == "WORKDIR":
        argv, cwd, user = ["mkdir", "-p", "--", state.workdir], "/", None
    else:
        stdin = _copy_tar(step, context, state)
        argv, cwd, user = ["tar", "-x", "-p", "-C", "/", "-f", "-"], "/", None
    scratch = work / f"step-{len(layers)}"
    (scratch / "upper").mkdir(parents=True)
    (scratch / "work").mkdir()
    image = ImageConfig(tuple(layers), dict(state.env), state.workdir, state.user)
    box = await backend.start_on(STEP_SPEC, image, image.lowerdirs(base), upper=scratch)
    try:
        who = await box._identity(user) if user else Identity()
        ran = await box._run(argv, timeout_s=STEP_TIMEOUT_S, who=who, stdin=stdin, cwd=cwd, env=state.args)
    finally:
        await box.close()
    if ran.exit_code != 0:
        tail = " | ".join(ran.stderr.decode(errors="replace").strip().splitlines()[-3:]) or "no output"
        shown = " ".join(step.args.split())[:100]
        raise step.fail(f"{shown} failed ({'timed out' if ran.timed_out else f'exit {ran.exit_code}'}): {tail[:300]}")
    layer = work / "layers" / str(len(layers))
    (scratch / "upper").rename(layer)
    shutil.rmtree(scratch, ignore_errors=True)
    layers.append(str(layer))


async def _build_into(
    backend: LocalBackend, spec: ImageSpec, steps: list[Instruction], work: Path, base: Path, base_id: str
) -> None:
    state = _State()
    layers: list[str] = []
    (work / "layers").mkdir()
    for step in steps:
        if step.op == "ENV":
            state.env.update(_env_pairs(step.args, state.values()))
        elif step.op == "ARG":
            name, _, default = step.args.strip().partition("=")
            state.args[name] = _expand(default.strip().strip('"'), state.values())
        elif step.op == "USER":
            state.user = _expand(step.args.strip(), state.values()) or None
        else:
            if step.op == "WORKDIR":
                state.workdir = state.path(step.args.strip())
            await _step(backend, base, work, layers, state, step, spec.context)
    rel = [str(Path(layer).relative_to(work)) for layer in layers]
    config = replace(ImageConfig(tuple(rel), state.env, state.workdir, state.user), base_content_id=base_id)
    (work / "config.json").write_text(config.to_json())


async def _locked(path: Path) -> int:
    """An exclusive flock on `path`, polled from the event loop: a builder cancelled while it waits
    holds nothing (a lock taken in a thread after its waiter was cancelled would never be let go)."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                await asyncio.sleep(0.1)
    except BaseException:
        os.close(fd)
        raise


async def build_image(backend: LocalBackend, spec: ImageSpec) -> str:
    """`local:<key>` for the Dockerfile in `spec`, built at most once per content."""
    try:
        text = (spec.context / spec.dockerfile).read_text()
    except OSError as exc:
        raise SandboxStartError(f"cannot read the Dockerfile: {exc}") from None
    steps = check(parse(text), backend.aliases)
    base = load_base(backend.data_dir)
    if base is None:
        raise SandboxUnavailable(f"no sandbox base tree under {backend.data_dir}: run `farm sandbox base`")
    key = await asyncio.to_thread(_digest, spec.context, text, base.content_id)
    home = images_dir(backend.data_dir)
    home.mkdir(parents=True, exist_ok=True)
    if (home / key / "config.json").exists():
        return REF_PREFIX + key
    fd = await _locked(home / f".{key}.lock")
    try:
        if (home / key / "config.json").exists():  # another builder finished while we waited
            return REF_PREFIX + key
        work = Path(tempfile.mkdtemp(prefix=f".build-{key}-", dir=home))
        try:
            await _build_into(backend, spec, steps, work, base.rootfs, base.content_id)
            work.rename(home / key)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, work, True)
            raise
    finally:
        os.close(fd)
    return REF_PREFIX + key
