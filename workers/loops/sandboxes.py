"""The worker's side of sandboxes: which backend a process uses, what it counts, how a start fails.

A sandboxed environment (`Environment.sandboxes = True`) gets the process's one backend (the
`sandbox_backend` setting) through `RolloutScope.sandboxes`, wrapped in `Tracked`:

- a start that fails is tried once more (a daemon hiccup, a racing image build); a second
  failure is the rollout's `infrastructure` failure, which the trainer masks and the farm counts,
  never a reward of 0;
- starting / running / started / failed-to-start counts and the start latencies (the last 1,024)
  are kept per process; the heartbeat carries them (`farm status`, the dashboard, /metrics);
- every sandbox started is closed when its rollout ends, whatever ends it (the loop's `finally`
  calls `close_state`, shielded from the cancel that may be ending it).

`check()` at worker start turns an unusable backend into one line (exit 3 for an unreachable
Docker daemon, 2 for anything else) before the first task is fetched.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

from envs.sdk.sandbox import ImageSpec, Sandbox, SandboxBackend, SandboxError, SandboxInfo, SandboxSpec
from farm.errors import ConfigError, FarmError, RolloutFailure
from farm.schema import ErrorKind
from farm.settings import Settings

__all__ = ["SandboxStats", "Tracked", "make_backend", "BackendUnavailable", "close_quietly"]

log = logging.getLogger("farm.sandbox")

START_TRIES = 2  # a start failure is retried once
CLOSE_WAIT_CANCELLED_S = 30.0  # a cancelled rollout waits this long for its sandbox's close
CLOSE_WAIT_S = 5.0  # a stopping worker waits this long for its sandboxes to close before its backend does


class BackendUnavailable(FarmError):
    """The sandbox backend cannot run here (exit 3: like Redis, a service that is not there)."""

    exit_code = 3


@dataclass
class SandboxStats:
    """A process's sandboxes: what the heartbeat reports."""

    starting: int = 0
    running: int = 0
    started: int = 0
    start_failed: int = 0  # starts that failed (each try)
    infrastructure: int = 0  # rollouts failed because no sandbox started
    start_s: deque = field(default_factory=lambda: deque(maxlen=1024))

    def snapshot(self) -> dict[str, Any]:
        lat = sorted(self.start_s)
        out: dict[str, Any] = {
            "starting": self.starting,
            "running": self.running,
            "started": self.started,
            "start_failed": self.start_failed,
            "infrastructure": self.infrastructure,
        }
        if lat:
            out["start_p50_s"] = round(lat[len(lat) // 2], 3)
            out["start_p99_s"] = round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 3)
        return out


class Tracked:
    """A backend with the process's counts, one retry of a failed start, and infrastructure failures."""

    def __init__(self, backend: SandboxBackend):
        self.backend = backend
        self.name = backend.name
        self.stats = SandboxStats()

    async def check(self) -> None:
        await self.backend.check()

    async def build(self, image: ImageSpec) -> str:
        try:
            return await self.backend.build(image)
        except SandboxError as exc:
            self.stats.infrastructure += 1
            raise RolloutFailure(ErrorKind.infrastructure, f"sandbox image: {exc}") from None

    async def start(self, spec: SandboxSpec) -> Sandbox:
        last: Optional[BaseException] = None
        for attempt in range(START_TRIES):
            self.stats.starting += 1
            t0 = time.monotonic()
            try:
                box = await self.backend.start(spec)
            except Exception as exc:  # noqa: BLE001 - any start that fails is the infrastructure's, not the agent's
                last = exc
                self.stats.start_failed += 1
                log.warning("sandbox start failed (try %d of %d): %s", attempt + 1, START_TRIES, exc)
                continue
            finally:
                self.stats.starting -= 1
            self.stats.start_s.append(time.monotonic() - t0)
            self.stats.started += 1
            self.stats.running += 1
            return _Counted(box, self.stats)
        self.stats.infrastructure += 1
        raise RolloutFailure(ErrorKind.infrastructure, f"sandbox did not start ({START_TRIES} tries): {last}")

    async def list(self, namespace: str) -> list[SandboxInfo]:
        return await self.backend.list(namespace)

    async def remove(self, sandbox_id: str) -> None:
        await self.backend.remove(sandbox_id)

    async def aclose(self) -> None:
        """The backend's own connections (the docker backend's pool), when the worker stops: after the
        sandboxes still open have closed (their rollouts' cancels close them), within CLOSE_WAIT_S."""
        deadline = time.monotonic() + CLOSE_WAIT_S
        while self.stats.running > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        close = getattr(self.backend, "aclose", None)
        if close is not None:
            await close()


class _Counted:
    """A started sandbox that counts itself out of `running` when closed (once)."""

    def __init__(self, box: Sandbox, stats: SandboxStats):
        self._box, self._stats, self._open = box, stats, True
        self.id = box.id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._box, name)

    async def close(self) -> None:
        try:
            await self._box.close()
        finally:
            if self._open:
                self._open = False
                self._stats.running -= 1


async def close_quietly(close: Any, what: str) -> None:
    """Run `close()` to its end even when the task awaiting it is being cancelled (a timeout, a
    cancel, a stopping worker): the sandbox must go either way. A failure is logged, not raised
    (the sweeper removes what is left), whether it comes before or after the cancel."""
    job = asyncio.ensure_future(close())
    try:
        await asyncio.shield(job)
    except asyncio.CancelledError:
        job.add_done_callback(lambda done: _log_failed_close(done, what))
        try:
            await asyncio.wait({job}, timeout=CLOSE_WAIT_CANCELLED_S)  # never raises the close's own error
        except asyncio.CancelledError:  # cancelled again while waiting: the close still runs on its own
            pass
        raise
    except Exception as exc:  # noqa: BLE001 - a failed close is logged; the sweeper removes what is left
        log.warning("closing %s failed: %s", what, exc)


def _log_failed_close(job: asyncio.Future, what: str) -> None:
    if not job.cancelled() and job.exception() is not None:
        log.warning("closing %s failed: %s", what, job.exception())


def make_backend(settings: Settings) -> Tracked:
    """The process's backend for `settings.sandbox_backend`."""
    name = settings.sandbox_backend
    aliases = dict(settings.sandbox_base_aliases)
    try:
        if name == "docker":
            from envs.boxes.docker import DockerBackend

            backend: Any = DockerBackend(aliases=aliases)
        else:
            from envs.boxes.local import LocalBackend

            backend = LocalBackend(data_dir=settings.data_path, aliases=aliases)
    except ImportError as exc:
        raise ConfigError(f"sandbox_backend {name}: cannot load it: {exc}") from None
    return Tracked(backend)


async def check_backend(tracked: Tracked) -> None:
    """One line at worker start when the backend cannot run (no daemon: exit 3; else exit 2)."""
    from envs.sdk.sandbox import SandboxUnavailable

    try:
        await tracked.check()
    except SandboxUnavailable as exc:
        message = f"sandbox_backend {tracked.name}: {exc}"
        if tracked.name == "docker" and "daemon" in str(exc):
            raise BackendUnavailable(message) from None
        raise ConfigError(message) from None


async def build_images(tracked: Tracked, task_dirs: list[str], progress: Any = None) -> list[str]:
    """Build the image of every Harbor task in `task_dirs` now (`farm data generate harbor --build`),
    so a Dockerfile that does not build is named before any rollout runs: one line per broken task."""
    from envs.harbor.task import load_task

    await check_backend(tracked)
    errors = []
    distinct = sorted(set(task_dirs))
    for i, path in enumerate(distinct, 1):
        task = load_task(path)
        if task.config.environment.docker_image:
            continue
        t0 = time.monotonic()
        try:
            ref = await tracked.backend.build(ImageSpec(task.environment_dir))
        except SandboxError as exc:
            errors.append(f"{task.path}: environment/Dockerfile does not build: {exc}")
            continue
        if progress is not None:
            progress(f"[{i}/{len(distinct)}] {task.name}: {ref} ({time.monotonic() - t0:.1f}s)")
    await tracked.aclose()
    return errors
