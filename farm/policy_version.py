"""Which weights the policy serves, as the trainer announces them, watched by every worker process.

A weight sync is announced in two steps on Redis. Before the trainer reloads the servers it
sets `{ns}:policy_next` to the new version N and publishes `loading N` on `{ns}:policy_events`;
once every server serves the new weights it sets `{ns}:policy_version` to N, deletes
`{ns}:policy_next` and publishes `live N` (`announce_loading` / `announce_live`).

A worker process keeps one `PolicyVersions` watcher: one subscription and two reads at start,
not a lookup per rollout. Each rollout takes a `mark()` when its generation starts and asks
`span(mark)` when it ends: the version it started on, and the version it ended on when a sync
was announced in between (or was running at either end), so a rollout whose tokens may come
from two sets of weights says so. With no trainer announcing anything both are None and the
rollout keeps the version its task carried.

The watch is a farm.watch.ChannelWatch: one subscription per process, read again on every
resubscription, through the process's `Outage` (no retry loop of its own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from farm.keys import Keys
from farm.transport import Outage
from farm.watch import ChannelWatch


@dataclass(frozen=True)
class Mark:
    live: Optional[int]
    loading: Optional[int]
    events: int


def announce_loading(r: Any, keys: Keys, version: int) -> None:
    """Before a weight sync (sync redis client): version `version` is about to be loaded."""
    pipe = r.pipeline(transaction=True)
    pipe.set(keys.policy_next(), version)
    pipe.publish(keys.policy_events(), f"loading {version}")
    pipe.execute()


def announce_live(r: Any, keys: Keys, version: int) -> None:
    """After a weight sync (sync redis client): every server serves `version`."""
    pipe = r.pipeline(transaction=True)
    pipe.set(keys.policy_version(), version)
    pipe.delete(keys.policy_next())
    pipe.publish(keys.policy_events(), f"live {version}")
    pipe.execute()


def _int(raw: Any) -> Optional[int]:
    try:
        return int(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None


class PolicyVersions(ChannelWatch):
    """The live version and any version being loaded, kept current from the events channel."""

    what = "policy versions"

    def __init__(self, redis: Any, keys: Keys, outage: Outage):
        super().__init__(redis, keys.policy_events(), outage)
        self.keys = keys
        self.live: Optional[int] = None
        self.loading: Optional[int] = None
        self.events = 0  # bumped on every announcement (and on every resubscription: unknown gap)

    def mark(self) -> Mark:
        return Mark(self.live, self.loading, self.events)

    def span(self, start: Mark) -> tuple[Optional[int], Optional[int]]:
        """(version at start, version at end when weights may have changed in between, else None)."""
        if start.loading is None and self.loading is None and self.events == start.events:
            return start.live, None
        return start.live, self.loading if self.loading is not None else self.live

    async def _read(self) -> None:
        live, loading = await self.r.mget(self.keys.policy_version(), self.keys.policy_next())
        self.live, self.loading = _int(live), _int(loading)
        self.events += 1  # a new subscription: whatever happened in the gap counts as a change

    def _apply(self, data: Any) -> None:
        text = data.decode() if isinstance(data, bytes) else str(data)
        what, _, number = text.partition(" ")
        version = _int(number)
        if version is None:
            return
        self.events += 1
        if what == "loading":
            self.loading = version
        elif what == "live":
            self.live, self.loading = version, None
