"""One asyncio loop in a daemon thread, for the trainer's synchronous rollout_func.

TRL calls `FarmRollout` from its training loop, which is not async; the client is. The loop lives
in its own thread for the whole run, so connections and the result stream's reader are reused from
step to step.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

__all__ = ["LoopThread"]


class LoopThread:
    """One asyncio loop in a daemon thread; `run(coro)` blocks until the coroutine finishes.

    Interrupted while it waits (Ctrl-C, SIGTERM: an exception raised in the calling thread), `run`
    cancels the coroutine and lets it finish its cleanup (closing its result stream) before the
    exception goes on, so the client is free for the run's cancel and nothing is left pending.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="farm-rollout-loop", daemon=True)
        self.thread.start()

    def run(self, coro, cleanup_s: float = 10.0) -> Any:
        ended = threading.Event()

        async def watched():
            try:
                return await coro
            finally:
                ended.set()

        future = asyncio.run_coroutine_threadsafe(watched(), self.loop)
        try:
            return future.result()
        except BaseException:
            if not future.done():
                future.cancel()  # cancels the coroutine in the loop's thread
                ended.wait(cleanup_s)
            raise

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
