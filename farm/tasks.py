"""Stopping asyncio tasks that may sit in a Redis call.

`task.cancel()` then `await gather(task)` waits forever when the cancellation is lost: redis-py's
asyncio client, in a read that is being cancelled under CPU load, can absorb the CancelledError
and go on to read again (seen with blocking XREADs: `farm collect` then never exited after its
work was done). `cancel_and_wait` repeats the cancellation while a task has not ended, so shutdown
is bounded whichever call the task was in.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Iterable

log = logging.getLogger("farm.tasks")


async def cancel_and_wait(tasks: Iterable[asyncio.Task], grace_s: float = 1.0, tries: int = 10) -> None:
    """Cancel `tasks` and wait for them to end, cancelling again every `grace_s` a task is still
    running (up to `tries` times; one left after that is logged and abandoned). Their exceptions
    are retrieved, as `gather(..., return_exceptions=True)` would."""
    everything = list(tasks)
    pending = {t for t in everything if not t.done()}
    for _ in range(tries):
        if not pending:
            break
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=grace_s)
    for t in pending:
        log.warning("task %s did not stop after %d cancellations; abandoned", t.get_name(), tries)
    for t in everything:
        if t.done() and not t.cancelled():
            t.exception()  # retrieved: a failure here was already handled, or is moot at shutdown


def cancelling() -> bool:
    """Whether the task running this is itself being cancelled, not only something it awaited (an
    inner task a cancel reached: a client's cancel of an agent run, a rollout's model call that its
    end stopped). Python 3.11+ tells; earlier versions answer False."""
    me = asyncio.current_task()
    being = getattr(me, "cancelling", None)
    return bool(being and being())
