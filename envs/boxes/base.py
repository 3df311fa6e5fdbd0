"""The base image of every sandbox, built offline from a Debian mirror: no registry needed.

Why: a farm host may reach a Debian mirror (its own apt does) but no container registry, and the
`local` backend needs a plain root filesystem tree anyway. `build_base` runs `debootstrap`
(variant minbase plus the tools an agent expects: bash, python3 with pytest, git, make, jq, ...)
from the mirror this machine's apt already uses (/etc/apt/sources.list and sources.list.d, deb822
`.sources` included; FARM_SANDBOX_MIRROR overrides; no mirror host is written in the code).

What it guarantees:
- the tree lives at `base_rootfs(data_dir)` = `<data_dir>/sandbox/bookworm/rootfs`, next to a
  `manifest.json` (packages with versions, build time, content id); the directory is built under
  a temporary name and renamed into place, so the path holds a whole tree or nothing, and
  `load_base` (which reads the manifest) never sees a half-built one;
- one builder at a time per data dir (a file lock); a second waits and then finds it built;
- the content id is a hash of the installed packages and their versions (the same package set
  gives the same id); local images are cached against it, docker's image carries it as a label;
- `import_docker` loads the tree into a Docker daemon as BASE_IMAGE (`tar | docker import`),
  skipped when the image already carries the same content id.

Errors are SandboxUnavailable in one line a user can act on (not root, no debootstrap, no mirror).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional

from envs.sdk.sandbox import SandboxUnavailable

__all__ = [
    "BASE_IMAGE",
    "BASE_PACKAGES",
    "BaseTree",
    "CONTENT_LABEL",
    "base_dir",
    "base_rootfs",
    "build_base",
    "docker_answers",
    "import_docker",
    "load_base",
    "mirror_url",
]

SUITE = "bookworm"
BASE_IMAGE = "rollout-farm/base:bookworm"
CONTENT_LABEL = "rollout-farm.content-id"
MIRROR_ENV = "FARM_SANDBOX_MIRROR"
BASE_PACKAGES = (
    "bash,python3,python3-pytest,git,coreutils,procps,findutils,grep,sed,diffutils,patch,make,"
    "ca-certificates,less,file,jq,python-is-python3"
).split(",")
SOURCES = Path("/etc/apt")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

PER_PACKAGE = {"Retrieving", "Validating", "Extracting"}  # debootstrap's lines per package: not shown

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BaseTree:
    rootfs: Path
    content_id: str
    manifest: Mapping[str, object]


def base_dir(data_dir: Path) -> Path:
    return Path(data_dir).expanduser() / "sandbox" / SUITE


def base_rootfs(data_dir: Path) -> Path:
    """Where the base tree is (it may not be built yet: `load_base` says whether it is)."""
    return base_dir(data_dir) / "rootfs"


def load_base(data_dir: Path) -> Optional[BaseTree]:
    """The built tree, or None when there is none (the manifest is written before the rename)."""
    d = base_dir(data_dir)
    try:
        manifest = json.loads((d / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    if not (d / "rootfs" / "bin").exists():
        return None
    return BaseTree(d / "rootfs", str(manifest["content_id"]), manifest)


# ── the mirror ─────────────────────────────────────────────────────────────────────────────
def _deb822_entries(text: str) -> list[tuple[str, list[str]]]:
    """(uri, suites) of each `Types: deb` stanza of a deb822 .sources file."""
    out = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, value = line.split(":", 1)
            fields[key.strip().lower()] = value.strip()
        if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes").lower() != "no":
            for uri in fields.get("uris", "").split():
                out.append((uri, fields.get("suites", "").split()))
    return out


def _one_line_entries(text: str) -> list[tuple[str, list[str]]]:
    out = []
    for line in text.splitlines():
        words = re.sub(r"\[[^\]]*\]", " ", line.split("#", 1)[0]).split()  # [options] dropped
        if len(words) >= 3 and words[0] == "deb":
            out.append((words[1], [words[2]]))
    return out


def mirror_url(env: Optional[Mapping[str, str]] = None, apt_dir: Path = SOURCES) -> str:
    """The Debian mirror for `bookworm`: $FARM_SANDBOX_MIRROR, else the first apt source that
    serves the suite itself (not -security or -updates)."""
    env = os.environ if env is None else env
    if env.get(MIRROR_ENV):
        return env[MIRROR_ENV]
    files = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*"))]
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        entries = _deb822_entries(text) if path.suffix == ".sources" else _one_line_entries(text)
        for uri, suites in entries:
            if SUITE in suites and uri.startswith(("http://", "https://", "file:/")):
                return uri
    raise SandboxUnavailable(
        f"no apt source serves Debian {SUITE} (read {apt_dir}/sources.list*); set {MIRROR_ENV}=<mirror url>"
    )


# ── the build ──────────────────────────────────────────────────────────────────────────────
def _preflight() -> None:
    if os.geteuid() != 0:
        raise SandboxUnavailable("building the sandbox base tree needs root (debootstrap, mknod): run it as root")
    if shutil.which("debootstrap") is None:
        raise SandboxUnavailable("debootstrap is not installed: apt-get install debootstrap")


def _run_debootstrap(target: Path, mirror: str, progress: Progress) -> None:
    cmd = [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(BASE_PACKAGES)}",
        SUITE,
        str(target),
        mirror,
    ]
    started = last = time.monotonic()
    phase = ""
    tail: list[str] = []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = raw.strip()
        tail = (tail + [line])[-5:]
        word = line[3:].split(" ", 1)[0] if line.startswith("I: ") else ""
        now = time.monotonic()
        # One line per phase (not per package), and one every 15 s within a long phase.
        if word and ((word != phase and word not in PER_PACKAGE) or now - last > 15):
            phase, last = word, now
            progress(f"base: {now - started:5.0f}s {line[3:]}")
    if proc.wait() != 0:
        raise SandboxUnavailable(f"debootstrap failed (exit {proc.returncode}): {' | '.join(tail)}")


def _packages(rootfs: Path) -> dict[str, str]:
    out = subprocess.run(
        ["dpkg-query", f"--admindir={rootfs}/var/lib/dpkg", "-W", "-f", "${Package}\t${Version}\n"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(sorted(line.split("\t", 1) for line in out.splitlines() if "\t" in line))


def _finish_tree(rootfs: Path) -> None:
    """Leave what a sandbox needs and nothing the build downloaded."""
    for leftover in (rootfs / "var/cache/apt/archives").glob("*.deb"):
        leftover.unlink()
    shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
    (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc/hostname").write_text("sandbox\n")
    for d in ("tmp", "proc", "dev", "sys", "run", "workspace"):
        (rootfs / d).mkdir(exist_ok=True)
    (rootfs / "tmp").chmod(0o1777)


def _discard(path: Path) -> None:
    """Remove a build directory, first detaching anything debootstrap left mounted in it (/proc,
    /sys of an interrupted build), so the removal never reaches into a live filesystem."""
    prefix = str(path) + "/"
    for line in reversed(Path("/proc/self/mountinfo").read_text().splitlines()):
        point = line.split()[4]
        if point.startswith(prefix):
            subprocess.run(["umount", "-l", point], capture_output=True)
    shutil.rmtree(path, ignore_errors=True)


def build_base(
    data_dir: Path,
    *,
    force: bool = False,
    mirror: Optional[str] = None,
    progress: Progress = print,
) -> BaseTree:
    """Build the base tree unless one is there (or `force`); the tree, whichever it is."""
    final = base_dir(data_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{SUITE}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = load_base(data_dir)
        if found is not None and not force:
            return found
        _preflight()
        for stale in [*final.parent.glob(f".{SUITE}-build-*"), *final.parent.glob(f".{SUITE}-old-*")]:
            _discard(stale)  # an interrupted build's (we hold the lock: no builder is running)
        url = mirror or mirror_url()
        progress(f"base: debootstrap {SUITE} (minbase + {len(BASE_PACKAGES)} packages) from {url}; takes minutes")
        work = Path(tempfile.mkdtemp(prefix=f".{SUITE}-build-", dir=final.parent))
        try:
            _run_debootstrap(work / "rootfs", url, progress)
            _finish_tree(work / "rootfs")
            packages = _packages(work / "rootfs")
            digest = hashlib.sha256(json.dumps([SUITE, packages], sort_keys=True).encode()).hexdigest()
            manifest = {
                "suite": SUITE,
                "mirror": url,
                "packages": packages,
                "requested": BASE_PACKAGES,
                "built_at": time.time(),
                "content_id": digest[:32],
            }
            (work / "manifest.json").write_text(json.dumps(manifest, indent=1))
            old = None
            if final.exists():
                old = final.parent / f".{SUITE}-old-{os.getpid()}-{time.monotonic_ns()}"
                final.rename(old)
            work.rename(final)
            if old is not None:
                _discard(old)
        except BaseException:
            _discard(work)
            raise
        progress(f"base: {len(packages)} packages, content id {manifest['content_id']}, at {final / 'rootfs'}")
        tree = load_base(data_dir)
        assert tree is not None
        return tree


# ── docker ────────────────────────────────────────────────────────────────────────────────
def docker_answers(timeout_s: float = 5.0) -> bool:
    """Whether a Docker CLI is here and its daemon answers."""
    if shutil.which("docker") is None:
        return False
    try:
        probe = subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return False
    return probe.returncode == 0


def _docker_content_id(image: str) -> str:
    probe = subprocess.run(
        ["docker", "image", "inspect", image, "--format", f'{{{{ index .Config.Labels "{CONTENT_LABEL}" }}}}'],
        capture_output=True,
        text=True,
    )
    return probe.stdout.strip() if probe.returncode == 0 else ""


def import_docker(tree: BaseTree, *, image: str = BASE_IMAGE, progress: Progress = print) -> bool:
    """Load the tree into Docker as `image`; False when it already holds this content id."""
    if _docker_content_id(image) == tree.content_id:
        progress(f"base: docker image {image} is current ({tree.content_id})")
        return False
    progress(f"base: importing {tree.rootfs} into docker as {image}")
    changes = [f"ENV PATH={DEFAULT_PATH}", "WORKDIR /", 'CMD ["bash"]', f"LABEL {CONTENT_LABEL}={tree.content_id}"]
    tar = subprocess.Popen(
        ["tar", "--numeric-owner", "--xattrs", "-C", str(tree.rootfs), "-c", "."], stdout=subprocess.PIPE
    )
    args = ["docker", "import", *[a for c in changes for a in ("--change", c)], "-", image]
    done = subprocess.run(args, stdin=tar.stdout, capture_output=True, text=True)
    assert tar.stdout is not None
    tar.stdout.close()
    if tar.wait() != 0 or done.returncode != 0:
        raise SandboxUnavailable(f"docker import of {tree.rootfs} failed: {' '.join(done.stderr.split())[:300]}")
    progress(f"base: docker image {image} ({tree.content_id})")
    return True
