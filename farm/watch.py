"""One pub/sub channel mirrored in a process: subscribe, read the state the channel changes, listen.

Both signals a worker process follows from the trainer or a client (the policy version,
farm.policy_version; cancels, farm.cancel) work the same way: the state lives in Redis keys, a
channel announces every change, and each process keeps a local copy fed by one subscription, so
a rollout consults memory, never Redis. Subscribing comes first and the keys are read after
it, so no change falls between the two; every resubscription reads them again, so a change
announced while the process was disconnected is not lost.

The watch has no retry loop of its own: subscribing and reading go through the process's
`Outage` (farm.transport), so while Redis is away the process retries once, warns at most once
a second whatever the subsystem, and gives up on one clock.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Optional

from redis import exceptions as rx

from farm.errors import RedisUnavailable, TransportError
from farm.tasks import cancel_and_wait
from farm.transport import Outage

log = logging.getLogger("farm.watch")


class ChannelWatch:
    """Subclasses say which channel (`channel`), how to read the state (`_read`) and how a message
    changes it (`_apply`); `start()` returns once the state was read the first time (or after wait_s)."""

    what = "a channel"

    def __init__(self, redis: Any, channel: str, outage: Outage):
        self.r, self.channel, self.outage = redis, channel, outage
        self._task: Optional[asyncio.Task] = None
        self._ready = asyncio.Event()

    async def start(self, wait_s: float = 5.0) -> None:
        self._task = asyncio.create_task(self._watch(), name=f"watch {self.channel}")
        try:
            await asyncio.wait_for(self._ready.wait(), wait_s)
        except asyncio.TimeoutError:
            log.warning("%s not read within %.0fs; going on without it for now", self.what, wait_s)

    async def aclose(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None

    async def _read(self) -> None:
        """Read the state the channel announces changes of (after subscribing)."""
        raise NotImplementedError

    def _apply(self, data: Any) -> None:
        """One message of the channel."""
        raise NotImplementedError

    async def _subscribe(self) -> Any:
        """A subscription, then the state it starts from (subscribed first: no event falls between)."""
        pubsub = self.r.pubsub()
        try:
            await pubsub.subscribe(self.channel)
            await self._read()
        except BaseException:
            await asyncio.shield(pubsub.aclose())
            raise
        self._ready.set()
        return pubsub

    async def _watch(self) -> None:
        while True:
            try:
                pubsub = await self.outage.call(self._subscribe, f"watching {self.what}")
            except RedisUnavailable:
                return  # the process gives up on the same clock; nothing more to say here
            except TransportError as exc:
                log.error("%s watch stopped: %s", self.what, exc)
                return
            try:
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        self._apply(message.get("data"))
            except (rx.RedisError, OSError) as exc:  # the subscription dropped: resubscribe via the Outage
                log.info("%s subscription lost (%s); resubscribing", self.what, type(exc).__name__)
            finally:
                await asyncio.shield(pubsub.aclose())
