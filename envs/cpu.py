"""CPU-heavy verification off the worker's event loop, with a hard time limit.

A verifier that parses LaTeX, runs a solver or scores a long answer must not stall the
other rollouts a worker is running. `CpuPool.run(fn, *args, timeout_s=...)` runs a
module-level function in a separate process (pebble's ProcessPool) and awaits it; past the
limit the process is killed and replaced, and VerifierTimeout is raised. Exceptions raised
by `fn` come back as they are, and the agent loop records them as `verifier` failures.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from typing import Any, Callable, Optional

from pebble import ProcessPool


class VerifierTimeout(Exception):
    pass


class CpuPool:
    def __init__(self, workers: Optional[int] = None):
        self.workers = workers or max(1, min(4, (os.cpu_count() or 2)))
        self._pool: Optional[ProcessPool] = None

    def _get(self) -> ProcessPool:
        if self._pool is None or not self._pool.active:
            self._pool = ProcessPool(max_workers=self.workers)
        return self._pool

    async def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float) -> Any:
        future = self._get().schedule(fn, args=args, timeout=timeout_s)
        try:
            return await asyncio.wrap_future(future)
        except concurrent.futures.TimeoutError:
            raise VerifierTimeout(f"{getattr(fn, '__name__', fn)} ran past {timeout_s}s and was killed") from None

    async def aclose(self) -> None:
        """close() off the event loop (it joins the pool's processes)."""
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.stop()
            self._pool.join(timeout=5)
            self._pool = None
