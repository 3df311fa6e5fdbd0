"""Reading a run's result stream: one reader per stream, rollouts deduplicated by task id.

`ResultReader.batches()` is the one consuming path (farm.client): it reads the run's result
stream, drops duplicates by task_id (delivery is at-least-once), trims what it read, and turns an
entry it cannot decode (garbage, too deep, too large, another version) into a dead letter on
`{ns}:dead-results` with the reason, plus a `malformed` failure for its task when the entry still
says which task it was. Rollouts that arrive before anyone asks for them wait in a bounded buffer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator, Optional

import redis.asyncio as aioredis

from farm import schema
from farm.errors import SchemaError
from farm.keys import Keys
from farm.schema import Rollout
from farm.transport import Outage

__all__ = ["ResultReader"]

log = logging.getLogger("farm.client")


class ResultReader:
    """Reads one result stream: deduplicates by task_id, dead-letters poison, buffers early arrivals."""

    def __init__(
        self,
        r: aioredis.Redis,
        stream: str,
        *,
        keys: Keys,
        outage: Outage,
        block_ms: int = 500,
        max_entry_bytes: int = schema.MAX_ENTRY_BYTES,
        delete_delivered: bool = True,
        dedupe: bool = True,
    ):
        self.r, self.stream, self.keys, self.outage, self.block_ms = r, stream, keys, outage, block_ms
        # dedupe=False hands out every copy: for a caller that matches rollouts to what it waits
        # for itself (`farm collect`, whose resubmitted tasks reuse the ids of a crashed run's).
        self.dedupe = dedupe
        self.max_entry_bytes = max_entry_bytes
        self.delete_delivered = delete_delivered
        self.last_id = "0-0"
        self.buffer: dict[str, Rollout] = {}
        self.seen: set[str] = set()
        self.duplicates = 0
        self.malformed = 0
        self._lock = asyncio.Lock()

    async def pull(self, block_ms: int) -> int:
        """Read what arrived (waiting up to block_ms) into the buffer; returns how many new rollouts."""
        async with self._lock:
            return await self._pull(block_ms)

    async def _pull(self, block_ms: int) -> int:
        resp: Any = await self.outage.call(
            lambda: self.r.xread({self.stream: self.last_id}, count=1000, block=block_ms), f"reading {self.stream}"
        )
        ids: list[str] = []
        letters: list[dict] = []
        new = 0
        for _, entries in resp or []:
            for entry_id, fields in entries:
                self.last_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                ids.append(self.last_id)
                rollout: Optional[Rollout]
                try:
                    rollout = schema.decode_rollout(fields, self.max_entry_bytes)
                except SchemaError as exc:
                    self.malformed += 1
                    letters.append(self._letter(fields, exc))
                    rollout = self._salvaged(fields, exc)
                    if rollout is None:
                        continue
                if rollout.task_id in self.seen or rollout.task_id in self.buffer:
                    self.duplicates += 1
                    continue
                self.buffer[rollout.task_id] = rollout
                new += 1
        if letters or (ids and self.delete_delivered):
            # Dead letters first, then the trim: an unreadable entry is never dropped unrecorded.
            async def settle() -> None:
                pipe = self.r.pipeline(transaction=True)
                for letter in letters:
                    pipe.xadd(self.keys.dead_results(), letter)
                if ids and self.delete_delivered:
                    # The rollouts now live in this process; keep the stream from growing without bound.
                    pipe.xdel(self.stream, *ids)
                await pipe.execute()

            await self.outage.call(settle, f"trimming {self.stream}")
        return new

    def _letter(self, fields: dict, exc: SchemaError) -> dict:
        log.error("dead-lettering unreadable result in %s: %s", self.stream, exc)
        return {
            "v": fields.get(b"v", b""),
            "d": fields.get(b"d", b"")[: self.max_entry_bytes],
            "kind": exc.kind,
            "reason": str(exc),
            "stream": self.stream,
            "entry_id": self.last_id,
            "at": time.time(),
        }

    def _salvaged(self, fields: dict, exc: SchemaError) -> Optional[Rollout]:
        """A `malformed` failure for the task an unreadable result answered, when the entry still names it."""
        return schema.salvaged_failure(schema.salvage(fields), exc.kind, f"unreadable result: {exc}")

    def take(self, task_id: str) -> Optional[Rollout]:
        rollout = self.buffer.pop(task_id, None)
        if rollout is not None and self.dedupe:
            self.seen.add(task_id)
        return rollout

    def drop(self, task_id: str) -> None:
        """Stop waiting for a task: a late rollout for it is dropped as a duplicate."""
        self.buffer.pop(task_id, None)
        self.seen.add(task_id)

    async def batches(self) -> AsyncIterator[list[Rollout]]:
        """Every rollout that arrives on the stream, once, in batches as read (empty after an idle block_ms)."""
        while True:
            if not self.buffer:
                await self.pull(self.block_ms)
            got = [self.take(task_id) for task_id in list(self.buffer)]
            yield [r for r in got if r is not None]
