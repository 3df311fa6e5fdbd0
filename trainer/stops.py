"""Stopping a training run on SIGINT or SIGTERM: at once, cleanly, saying where it stopped.

Ctrl-C used to land wherever the main thread was: inside the wait for rollouts it left the
result stream half-read (an outage warning, `aclose(): asynchronous generator is already
running`, `Task was destroyed but it is pending!`) and the run's tasks queued for the next
worker; during training it said nothing about where the run stopped.

`StopSignals` (installed by trainer.train.run_train for the whole run) turns either signal into
`StopRun`, a BaseException, so no `except Exception` in TRL or the farm swallows it. The rollout
function's wait cancels its coroutine when interrupted (trainer.loop_thread.LoopThread), then the
run cancels its outstanding tasks (`cancel_run`) and ends with `Interrupted`: one line
("interrupted at step N of M; last weights at DIR, policy version K") and exit 130 (SIGINT) or
143 (SIGTERM), no traceback.

`held_signals` defers both signals over a section that must not be cut in half (a weight sync:
save, reload, announce), then delivers the one that came, so what the line reports is whole.
It works for the scripts that use the farm's callbacks without run_train, too: there the
deferred Ctrl-C becomes the usual KeyboardInterrupt once the sync is done.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator, Optional

from farm.errors import FarmError

__all__ = [
    "Interrupted",
    "StopRun",
    "StopSignals",
    "held_signals",
    "stop_line",
]

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRun(BaseException):
    """A stop signal arrived (raised in the main thread by StopSignals)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Interrupted(FarmError):
    """The run stopped on a signal; the message is the one line, the exit code 128 + the signal."""

    def __init__(self, line: str, signum: int):
        super().__init__(line)
        self.exit_code = 128 + signum


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class StopSignals:
    """While entered (main thread only), SIGINT and SIGTERM raise StopRun; the old handlers come back on exit."""

    def __init__(self) -> None:
        self._old: dict[int, Any] = {}

    def _raise(self, signum: int, frame: Any) -> None:
        raise StopRun(signum)

    def __enter__(self) -> "StopSignals":
        if _main_thread():
            for sig in SIGNALS:
                self._old[sig] = signal.signal(sig, self._raise)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()


@contextlib.contextmanager
def held_signals() -> Iterator[None]:
    """SIGINT/SIGTERM wait until the block is done, then are delivered (the first one that came)."""
    if not _main_thread():
        yield
        return
    came: list[int] = []
    old = {sig: signal.signal(sig, lambda signum, frame: came.append(signum)) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if came:
        signal.raise_signal(came[0])


def stop_line(step: int, max_steps: int, weights: Optional[str], version: Optional[int]) -> str:
    """The one line an interrupted run ends with (version None: before training began)."""
    if version is None:
        return f"interrupted at step {step} of {max_steps}, before training began: no task submitted, no weights pushed"
    where = f"last weights at {weights}" if weights else "no weights saved (weight_sync: none)"
    return f"interrupted at step {step} of {max_steps}; {where}, policy version {version}"
