"""A sandbox per rollout: the async protocol environments program against, whatever runs it.

An agentic task (a terminal, a repository) runs its agent's commands and its verifier inside a
sandbox started for that one rollout and removed when it ends. Backends (envs/boxes): `docker`
(a Docker daemon; every container labelled with the farm's namespace, the worker and the task, so
the farm can always find its own) and `local` (no daemon: namespaces, a cgroup and an overlay
over a root filesystem tree). Both honour the same contract:

- `start(spec)` starts from an image with the spec's cpus / memory / pids / network limits and
  its `mounts` (host directories bound read-only inside); the
  sandbox ends by itself after `spec.lifetime_s` (its PID 1 exits, and the backend removes it),
  so a sandbox whose worker died is bounded even before a sweeper finds it;
- `exec` runs one command, returns its exit code and output (each stream truncated to
  `max_output` bytes, with the count dropped); past its timeout every process the command
  started is killed, not only the client that waited for it;
- `kill_all()` ends every process in the sandbox but its PID 1 (before a verifier runs, so
  nothing the agent started keeps editing files while the tests read them);
- `close()` ends everything in the sandbox at once and removes it; idempotent, and safe to call
  from a cancelled task.

Errors: `SandboxUnavailable` (the backend cannot run at all: no daemon, no namespaces; a worker
refuses to start), `SandboxStartError` (this one sandbox did not start: retried once, then the
rollout fails with kind `infrastructure`), `SandboxError` (a call on a running sandbox failed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Protocol, Sequence, Union

__all__ = [
    "ExecResult",
    "ImageSpec",
    "Sandbox",
    "SandboxBackend",
    "SandboxError",
    "SandboxInfo",
    "SandboxSpec",
    "SandboxStartError",
    "SandboxUnavailable",
    "LABEL_NAMESPACE",
    "LABEL_TASK",
    "LABEL_WORKER",
    "LABEL_EXPIRES",
    "expired",
]

# Labels (docker) / metadata (local) every sandbox carries, so a sweeper finds the farm's own.
LABEL_NAMESPACE = "rollout-farm.namespace"
LABEL_WORKER = "rollout-farm.worker"
LABEL_TASK = "rollout-farm.task"
LABEL_EXPIRES = "rollout-farm.expires"  # unix time past which the sandbox has outlived its lifetime


def expired(labels: Mapping[str, str], now: float) -> bool:
    """Whether a sandbox with these labels has outlived its lifetime (LABEL_EXPIRES, unix seconds);
    a sandbox without a readable expiry has not."""
    try:
        return float(labels.get(LABEL_EXPIRES, "inf")) < now
    except ValueError:
        return False


DEFAULT_MAX_OUTPUT = 64 * 1024  # bytes kept of each of stdout and stderr per exec


class SandboxError(Exception):
    """A call on a sandbox failed (its backend's error, in one line)."""


class SandboxUnavailable(SandboxError):
    """The backend cannot run sandboxes at all here (no daemon, no namespaces, no base image)."""


class SandboxStartError(SandboxError):
    """One sandbox failed to start (an image that does not build or exist, a daemon error)."""


@dataclass(frozen=True)
class ImageSpec:
    """What to build: a Dockerfile in a context directory. Backends build it once and cache it by
    the content of the context (the Dockerfile included), so the same task builds once."""

    context: Path
    dockerfile: str = "Dockerfile"


@dataclass(frozen=True)
class SandboxSpec:
    image: str  # a reference a backend's `build` returned (or, for docker, any local image)
    lifetime_s: float  # the sandbox's whole life: agent + verifier timeouts plus slack
    cpus: float = 1.0
    memory_mb: int = 2048
    pids: int = 512
    disk_mb: int = 4096  # what the sandbox may write (local: the overlay's upper tmpfs)
    network: bool = False
    workdir: str = "/"
    env: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)  # LABEL_NAMESPACE, LABEL_WORKER, LABEL_TASK
    # host directory -> absolute path inside, bound read-only (a socket in it can still be connected
    # to: the gateway's, for an agent that runs inside, workers/loops/sandbox_command.py)
    mounts: Mapping[str, str] = field(default_factory=dict)


@dataclass
class ExecResult:
    exit_code: int  # the command's exit status; 128 + N when killed by signal N; -1 when timed out
    stdout: str
    stderr: str
    stdout_dropped: int = 0  # bytes of stdout cut past max_output
    stderr_dropped: int = 0
    timed_out: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class SandboxInfo:
    """A sandbox a backend found (for the sweeper and `farm sandbox list`)."""

    id: str
    labels: Mapping[str, str]
    running: bool


class Sandbox(Protocol):
    id: str

    async def exec(
        self,
        cmd: Union[str, Sequence[str]],  # a string runs under `bash -lc` (sh when the image has no bash)
        timeout_s: float,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        user: Optional[str] = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> ExecResult: ...

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None: ...

    async def read_file(self, path: str, max_bytes: int = 1 << 20) -> bytes:
        """The file's first max_bytes; SandboxError (FileNotFoundError's message) when it is absent."""
        ...

    async def upload_dir(self, src: Path, dest: str) -> None:
        """Copy a host directory's contents into `dest` (created) inside the sandbox."""
        ...

    async def download_dir(self, src: str, dest: Path) -> None: ...

    async def kill_all(self) -> None:
        """End every process but the sandbox's PID 1."""
        ...

    async def close(self) -> None:
        """End every process and remove the sandbox; idempotent."""
        ...


class SandboxBackend(Protocol):
    name: str  # "docker" or "local"

    async def check(self) -> None:
        """Raise SandboxUnavailable, in one line a user can act on, when this backend cannot run."""
        ...

    async def build(self, image: ImageSpec) -> str:
        """The image reference for `image`, built at most once per content (SandboxStartError naming
        the failing instruction when it does not build)."""
        ...

    async def start(self, spec: SandboxSpec) -> Sandbox: ...

    async def list(self, namespace: str) -> list[SandboxInfo]: ...

    async def remove(self, sandbox_id: str) -> None:
        """Kill and remove a sandbox by id (the sweeper's tool); no error when it is gone."""
        ...
