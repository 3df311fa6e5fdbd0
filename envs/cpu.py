"""CPU-heavy verification off the worker's event loop, with a per-call CPU-time limit.

A verifier that parses LaTeX, runs a solver or scores a long answer must not stall the
other rollouts a worker is running. `CpuPool.run(fn, *args, cpu_s=...)` runs a module-level
function in a separate process (pebble's ProcessPool) and awaits it. The limit is the CPU time
that one call uses (an ITIMER_PROF timer in the pool process), not wall time: on a loaded
machine a comparison that needs 3 s of CPU may take 20 s of wall time, and it still passes. A
wall-clock backstop (`wall_s`, by default `WALL_FACTOR` times the CPU limit) kills and replaces
a process that is blocked rather than computing (or stuck in C code that never returns to
Python). Either limit raises VerifierTimeout. Exceptions raised by `fn` come back as they are,
and the agent loop records them as `verifier` failures.

The limit cannot be swallowed. Verifier libraries catch every Exception and answer "not equal"
(math-verify's verify, reasoning-gym checkers with a bare `except:`), which would score a right
but slow answer 0 and train on it as wrong. So the timer's CpuTimeExceeded is a BaseException,
and once the timer has fired the call fails with it whatever `fn` then returns or raises (code
that catches it and computes on meets the wall-clock backstop).

A limit must measure the comparison, not a library's first import and parse, which in a fresh
process alone can cost more than a small limit. `CpuPool(warmup=fn)` runs `fn` (no time limit)
in every pool process as it starts, replacements included, before the process takes a call;
an environment's `setup()` awaits `start()`, which starts the processes and raises what the
warm-up raises (a verifier library that cannot work fails the worker at startup, with the reason).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import signal
from typing import Any, Callable, Optional

from pebble import ProcessPool

WALL_FACTOR = 6.0  # the default wall-clock backstop, in multiples of the CPU limit


class VerifierTimeout(Exception):
    pass


class CpuTimeExceeded(BaseException):
    """Raised inside the pool process when one call has used up its CPU time. A BaseException, so
    that the `except Exception` of library code does not turn it into an answer."""


_fired = False  # whether the running call's timer has fired (in this pool process)


def _on_cpu_limit(signum: int, frame: Any) -> None:
    global _fired
    _fired = True
    raise CpuTimeExceeded()


def _cpu_limited(fn: Callable[..., Any], cpu_s: float, args: tuple) -> Any:
    """`fn(*args)` in the pool process, interrupted once it has used `cpu_s` seconds of CPU; past
    that, CpuTimeExceeded even when `fn` caught it and returned or raised something else."""
    global _fired
    _fired = False
    previous = signal.signal(signal.SIGPROF, _on_cpu_limit)
    signal.setitimer(signal.ITIMER_PROF, cpu_s)
    try:
        result = fn(*args)
    except BaseException as exc:
        if _fired and not isinstance(exc, CpuTimeExceeded):
            raise CpuTimeExceeded() from exc  # e.g. "does not parse", after a parser swallowed the limit
        raise
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
    if _fired:
        raise CpuTimeExceeded()
    return result


def _warm(warmup: Optional[Callable[..., Any]], args: tuple) -> None:
    """The pool's initializer: `warmup(*args)` once in each new process. Its errors are logged, not
    raised (pebble would replace the process again and again); start() raises them."""
    if warmup is None:
        return
    try:
        warmup(*args)
    except Exception:
        logging.getLogger(__name__).exception("CPU pool warm-up %s failed", getattr(warmup, "__name__", warmup))


def _ready() -> None:
    """A call that only shows a pool process is up (start() without a warm-up)."""


class CpuPool:
    def __init__(
        self, workers: Optional[int] = None, warmup: Optional[Callable[..., Any]] = None, warmup_args: tuple = ()
    ):
        """`warmup(*warmup_args)`: a module-level function every pool process runs as it starts,
        e.g. one cheap call of the verifier, so that its imports and caches are ready."""
        self.workers = workers or max(1, min(4, (os.cpu_count() or 2)))
        self.warmup = warmup
        self.warmup_args = tuple(warmup_args)
        self._pool: Optional[ProcessPool] = None

    def _get(self) -> ProcessPool:
        if self._pool is None or not self._pool.active:
            self._pool = ProcessPool(
                max_workers=self.workers, initializer=_warm, initargs=(self.warmup, self.warmup_args)
            )
        return self._pool

    async def start(self, wall_s: float = 300.0) -> None:
        """Start the processes (each warms up as it starts) and run the warm-up once more as a call,
        so that what it raises is raised here; for an environment's setup()."""
        if self.warmup is None:
            await self.run(_ready, cpu_s=wall_s, wall_s=wall_s)
        else:
            await self.run(self.warmup, *self.warmup_args, cpu_s=wall_s, wall_s=wall_s)

    async def run(self, fn: Callable[..., Any], *args: Any, cpu_s: float, wall_s: Optional[float] = None) -> Any:
        """`fn(*args)` in a pool process; VerifierTimeout past `cpu_s` of CPU or `wall_s` of wall time."""
        wall_s = wall_s if wall_s is not None else cpu_s * WALL_FACTOR
        name = getattr(fn, "__name__", fn)
        future = self._get().schedule(_cpu_limited, args=(fn, cpu_s, args), timeout=wall_s)
        try:
            return await asyncio.wrap_future(future)
        except CpuTimeExceeded:
            raise VerifierTimeout(f"{name} used more than {cpu_s}s of CPU time and was stopped") from None
        except concurrent.futures.TimeoutError:
            raise VerifierTimeout(f"{name} ran past {wall_s}s of wall time and was killed") from None

    async def aclose(self) -> None:
        """close() off the event loop (it joins the pool's processes)."""
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.stop()
            self._pool.join(timeout=5)
            self._pool = None
