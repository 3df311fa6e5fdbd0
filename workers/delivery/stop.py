"""A worker's stop: what starts it (a signal, a second one, Redis gone for good) and its clock.

The first SIGTERM/SIGINT starts the stop: from then on the Outage retries nothing and lets no Redis
call outlive the grace period (grace_period_s from the signal), and the worker stops fetching. A
second signal, past SAME_STOP_S of the first, forces it: in-flight rollouts are not waited for. One
within SAME_STOP_S is the same stop delivered twice (a `--processes` supervisor forwards the SIGTERM
or Ctrl-C its process group, or Slurm's step, already delivered to every worker). Redis unreachable
or refusing the worker (`fail`) stops it at once, forced, with that error to raise at the end, unless
a signal came first: then Redis going away is no error of its own.

Every step of the shutdown is bounded by `left_s()`: what is left of grace_period_s + STOP_MARGIN_S
from the stop, less EXIT_RESERVE_S that the process keeps for its own exit.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Optional

from farm.errors import RedisUnavailable, TransportError
from farm.transport import Outage
from workers.delivery.chores import STOP_MARGIN_S

log = logging.getLogger("farm.worker")

SAME_STOP_S = 1.0  # stop signals this close together are one request, not a second (forcing) one
EXIT_RESERVE_S = 0.4  # of that margin, what the process keeps for its own exit once the worker returns


class Stop:
    """One worker's stop: `requested` is set when it starts; `wake` is called then (the fetch loop
    may be waiting for a free slot)."""

    def __init__(self, grace_period_s: float, outage: Outage, wake: Callable[[], None]):
        self.grace_period_s = grace_period_s
        self.outage = outage
        self.wake = wake
        self.requested = asyncio.Event()
        self.requested_at = 0.0
        self.signalled = False  # stopped by a signal (not by Redis failing): its status says what was left
        self.grace_ends: Optional[float] = None  # when the grace period ends (time.monotonic())
        self.force = False
        self.fatal: Optional[TransportError] = None

    def signal(self) -> None:
        """A stop signal: the first starts the stop, a later one (past SAME_STOP_S) forces it."""
        now = time.monotonic()
        if self.signalled:
            if now - self.requested_at < SAME_STOP_S:
                return  # one stop delivered twice: to the process group (Ctrl-C, Slurm) and by a supervisor
            self.force = True
            self.outage.stop(now)
            log.warning("second stop signal: not waiting for in-flight rollouts")
        else:
            self.signalled, self.requested_at = True, now
        self.begin(now)

    def begin(self, now: float) -> None:
        """Start the stop's clock (once): the grace period ends grace_period_s from now, and the Outage
        retries nothing from now on and lets no Redis call outlive the grace period."""
        if self.grace_ends is None:
            self.grace_ends = now + self.grace_period_s
            self.outage.stop(self.grace_ends)
        self.requested.set()
        self.wake()

    def fail(self, exc: TransportError) -> None:
        """Redis is gone for good (or refuses us): stop at once, without the grace period. After a stop
        signal Redis unreachable is no error of its own: the stop's status says what was left."""
        if self.signalled and isinstance(exc, RedisUnavailable):
            if not self.force:
                log.info("Redis unreachable while stopping (%s): not waiting for in-flight rollouts", exc)
        elif self.fatal is None:
            self.fatal = exc
            log.error("stopping: %s", exc)
        self.force = True
        self.outage.stop(time.monotonic())
        self.begin(time.monotonic())

    def left_s(self) -> float:
        """What is left of the stop's bound (grace_period_s + STOP_MARGIN_S from the stop, less what the
        process keeps for its own exit), at least a moment for each step."""
        assert self.grace_ends is not None, "the stop's clock starts before the drain"
        return max(0.05, self.grace_ends + STOP_MARGIN_S - EXIT_RESERVE_S - time.monotonic())

    def after_fatal(self) -> int:
        """The level for a shutdown step that failed on Redis: stopping because Redis is gone, the
        error line said so once, and each step need not warn again (one warning a second per process)."""
        return logging.INFO if self.fatal is not None else logging.WARNING

    async def forced(self) -> None:
        """Return once the stop is forced (a second signal, Redis gone)."""
        while not self.force:
            await asyncio.sleep(0.1)
