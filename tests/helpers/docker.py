"""A real Docker daemon and the farm's base image for the docker sandbox tests (and the benchmark).

scripts/test installs docker.io and debootstrap and starts dockerd when it runs as root; here a
daemon that does not answer, or a base image that cannot be built, is a skip that says why, and
under CI=true a failure. The base image is built (debootstrap, minutes) only when it is absent.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from envs.boxes.base import BASE_IMAGE
from envs.sdk.sandbox import LABEL_NAMESPACE

DATA_DIR = Path.home() / ".cache" / "rollout-farm"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    print(f"SKIP: {reason}")
    pytest.skip(reason)


def docker(*args: str, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """The `docker` command (what a user would look at), its output as text."""
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed: {done.stderr.strip()}")
    return done


def inspect(container: str) -> dict:
    return json.loads(docker("inspect", container).stdout)[0]


def need_daemon() -> None:
    try:
        answered = docker("version", "--format", "{{.Server.Version}}", check=False, timeout=20).returncode == 0
    except FileNotFoundError:
        answered = False
    if not answered:
        _unavailable("no Docker daemon answers (Debian package docker.io; scripts/test installs and starts it as root)")


def need_base_image() -> str:
    """The base image's name, built (debootstrap + docker import) when it is absent."""
    need_daemon()
    if docker("image", "inspect", BASE_IMAGE, check=False).returncode == 0:
        return BASE_IMAGE
    from envs.boxes.base import build_base, import_docker
    from envs.sdk.sandbox import SandboxUnavailable

    try:
        import_docker(build_base(DATA_DIR))
    except SandboxUnavailable as e:
        _unavailable(f"the base image {BASE_IMAGE} is absent and cannot be built here: {e}")
    return BASE_IMAGE


def containers_of(namespace: str) -> list[str]:
    """Every container (running or not) labelled with the namespace, as `docker ps` sees them."""
    out = docker("ps", "-aq", "--no-trunc", "--filter", f"label={LABEL_NAMESPACE}={namespace}").stdout
    return out.split()


def new_namespace() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


def remove_namespace(namespace: str) -> None:
    ids = containers_of(namespace)
    if ids:
        docker("rm", "-f", *ids, check=False)
