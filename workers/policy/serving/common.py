"""What every serving step shares: the error, progress messages, a file lock, logged subprocess steps."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Optional, Sequence

from farm.errors import FarmError

# Offline on purpose: a missing file must fail here, not turn into a hub download elsewhere.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


class PolicyServerError(FarmError):
    """The serving venv, the model or the vLLM server could not be made ready."""


PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In a child, before exec: the kernel sends it SIGTERM when the process that started it dies,
    so a step (the model conversion, a pip install) never outlives a stub or server stopped by
    SIGTERM or SIGKILL mid-step (Linux; elsewhere a no-op)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def say(message: str) -> None:
    print(f"[policy] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Serialize installs between processes (a worker pool may all start at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_step(cmd: Sequence[str], log_path: Path, what: str, env: Optional[dict] = None) -> None:
    """Run a step with its output appended to log_path; echo its `farm:` lines; fail with the log's tail."""
    started = time.monotonic()
    say(f"{what} ...")
    shown = [str(c) if len(str(c)) < 200 else "<script>" for c in cmd]
    with open(log_path, "a") as log:
        log.write(f"\n$ {' '.join(shown)}\n")
        log.flush()
        proc = subprocess.Popen(
            list(map(str, cmd)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            text=True,
            errors="replace",
            preexec_fn=die_with_parent,
        )
        for line in proc.stdout:
            log.write(line)
            if line.startswith("farm: "):
                say(line[6:].rstrip())
        code = proc.wait()
    if code != 0:
        raise PolicyServerError(f"{what} failed (exit {code}); last lines of {log_path}:\n{tail(log_path)}")
    say(f"{what}: done in {time.monotonic() - started:.0f}s")


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) or "(the log is empty)"
    except OSError:
        return "(no log)"


def json_or_none(path: Path) -> object:
    """What `path` holds as JSON; None when it is missing or not JSON (a stamp not written yet, or torn)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
