"""A policy replica, a rollout's session on one, and a group's home: the rotation's records.

Apart from the rotation (workers/policy/rotation.py, which re-exports them) so the load monitor
(workers/policy/load.py) and the backends read them without importing the rotation.
"""

from __future__ import annotations

import email.utils
import time
from dataclasses import dataclass, field
from typing import Optional

import aiohttp

__all__ = ["Home", "Replica", "Session", "retry_after_s"]


@dataclass
class Replica:
    url: str
    outstanding: int = 0  # requests in flight
    assigned: int = 0  # rollouts placed here and not yet ended (live sessions)
    healthy: bool = True  # in rotation
    cool_until: float = 0.0  # monotonic time before which it takes no request (429/503)
    cooldowns: int = 0  # consecutive 429/503 answers (for the backoff without Retry-After)
    errors: int = 0  # consecutive failures
    served: int = 0
    last_ok: float = 0.0  # monotonic time of the last good answer
    last_error: str = ""
    failed_at: float = float("-inf")  # monotonic time of the last failed request
    session: Optional[aiohttp.ClientSession] = None  # the token backend's connections to it
    cap: Optional[int] = None  # in-flight limit from its load (load.py); None: no limit

    def ready(self, now: float) -> bool:
        return self.healthy and now >= self.cool_until

    def has_slot(self) -> bool:
        """Below its in-flight limit (always, without one)."""
        return self.cap is None or self.outstanding < self.cap


@dataclass
class Home:
    """Where a group's samples start, and how many of them are live there."""

    replica: Replica
    live: int = 0


@dataclass
class Session:
    """One rollout's affinity to a replica: `group` is its task's group_id, `key` its task id.

    `end()` when the rollout is over: the replica stops counting it as assigned."""

    replica: Optional[Replica] = None
    group: Optional[str] = None
    key: Optional[str] = None
    moves: int = 0
    requests: int = 0
    home: Optional[Home] = field(default=None, repr=False)  # the group's home when it was placed there
    wanted: Optional[Replica] = field(default=None, repr=False)  # the full replica pick() waits for

    def end(self) -> None:
        if self.replica is not None:
            self.replica.assigned -= 1
            self.replica = None
        if self.home is not None:
            self.home.live -= 1
            self.home = None


def retry_after_s(value: Optional[str]) -> Optional[float]:
    """A Retry-After header (seconds or an HTTP date) in seconds from now; None if absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError, IndexError):
        return None
