"""The Settler: settle scripts of many concurrent rollouts batched into pipelined round trips.

A worker process runs thousands of agent loops; each ends in one settle script (farm.scripts,
built by farm.streams.AgentStream). Sending them one by one would cost a round trip each, so the
Settler queues them and sends whatever is waiting as one pipeline, which is what lets a single
worker process settle thousands of rollouts a second.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any, Optional

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

from farm import scripts
from farm.connection import Durability, durability_of
from farm.scripts import NOT_PENDING, SETTLED, SettleOp, load_scripts
from farm.tasks import cancel_and_wait
from farm.transport import Outage, is_transient, mapped

log = logging.getLogger("farm.streams")


class Settler:
    """Batches settle scripts from many concurrent rollouts into pipelined round trips.

    `await settler.run(op)` returns the script's result (1 settled, 0 already settled by
    someone else, -1/-2 a bad reply stream: see farm/lua/settle.lua). Connection errors are
    retried by the Outage; the scripts are idempotent, so replaying a batch whose reply was
    lost is safe. A script that fails inside Redis fails only its own task, mapped to the
    farm's error.

    The worker's counters move here, by what the script answered, never by what the worker
    meant to do: a settle that settled its task counts as its outcome (done, failed, dead,
    retried), one that found its task already settled counts only as a `duplicate`, one that
    failed as `unsettled` (the task stays pending), and one whose reply stream was refused not
    at all (the dead letter that replaces it counts).

    The history (farm.history) costs no round trip and no work per task: the increments of the
    settles that acknowledged (result 1) are summed per bucket, and each bucket's sum rides in
    the next batch's pipeline as one BUCKET script (or goes alone after FLUSH_S without one).
    A settle that was already settled elsewhere is not counted; a pipeline replayed after a
    lost reply may count its buckets twice, and a worker killed with -9 loses at most its
    last FLUSH_S of counts: the history is for watching, the stats hash and the streams hold
    the exact record.

    With a Durability (`wait`, else the client's: redis_wait_replicas > 0) each batch of settles ends
    in one WAIT on the same pipeline, so a settle is acknowledged (its future resolved, its task
    counted) only once that many replicas have it, or the WAIT timed out (counted in
    `wait.short`, logged once): what a worker saw settled survives a failover. A settle script
    that meets READONLY (a demoted master still answering after a failover) fails the whole batch
    as transient: the pool's idle connections are dropped, so the Outage's next try asks the
    Sentinels for the new master.
    """

    FLUSH_S = 1.0

    def __init__(
        self,
        r: aioredis.Redis,
        outage: Outage,
        counters: Optional[Counter] = None,
        max_batch: int = 512,
        wait: Optional[Durability] = None,
    ):
        self.r, self.outage, self.max_batch = r, outage, max_batch
        self.wait = wait if wait is not None else durability_of(r)  # the client's, from redis_wait_replicas
        self.counters: Counter = Counter() if counters is None else counters
        self.queue: asyncio.Queue = asyncio.Queue()
        self._task: Optional[asyncio.Task] = None
        self._counts: dict[tuple[str, str, str, int], dict[str, float]] = {}

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="settler")

    async def run(self, op: SettleOp) -> int:
        fut = asyncio.get_running_loop().create_future()
        await self.queue.put((op, fut))
        return await fut

    async def close(self) -> None:
        if self._task:
            await cancel_and_wait([self._task])
        if self._counts:  # the last counts, once, without waiting out an outage
            try:
                await self._pipeline([], self._take_counts())
            except Exception as exc:  # noqa: BLE001 - history only; the settles themselves are done
                log.warning("could not write the last history counts: %s", exc)

    async def _next(self) -> Optional[tuple[SettleOp, asyncio.Future]]:
        if not self._counts:
            return await self.queue.get()
        try:
            return await asyncio.wait_for(self.queue.get(), self.FLUSH_S)
        except asyncio.TimeoutError:
            return None

    async def _loop(self) -> None:
        while True:
            first = await self._next()
            batch = [first] if first is not None else []
            while len(batch) < self.max_batch and not self.queue.empty():
                batch.append(self.queue.get_nowait())
            counts = self._take_counts()
            ops = [op for op, _ in batch]
            try:
                results = await self.outage.call(lambda: self._execute(ops, counts), "settling rollouts")
            except Exception as exc:  # TransportError after the bounded retries: tasks stay pending
                self._add_counts(counts)
                self.counters["unsettled"] += len(batch)
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            for (op, fut), res in zip(batch, results):
                self._count(op, res)
                if fut.done():
                    continue
                if isinstance(res, Exception):
                    fut.set_exception(mapped(res, self.outage.url))
                else:
                    fut.set_result(res)

    def _count(self, op: SettleOp, res: Any) -> None:
        """Count one settle by the script's answer (see the class docstring)."""
        if isinstance(res, Exception):
            self.counters["unsettled"] += 1
        elif res == SETTLED:
            self.counters[op.outcome] += 1
            if op.history is not None:
                h = op.history
                self._add_bucket((h.bucket, h.stream, h.backlog, h.ttl_s), h.increments)
        elif res == NOT_PENDING:
            self.counters["duplicate"] += 1

    def _add_counts(self, counts: dict[tuple[str, str, str, int], dict[str, float]]) -> None:
        for bucket, inc in counts.items():
            self._add_bucket(bucket, inc)

    def _add_bucket(self, bucket: tuple[str, str, str, int], inc: dict[str, float]) -> None:
        total = self._counts.setdefault(bucket, {})
        for k, v in inc.items():
            total[k] = total.get(k, 0) + v

    def _take_counts(self) -> dict[tuple[str, str, str, int], dict[str, float]]:
        counts, self._counts = self._counts, {}
        return counts

    async def _execute(self, ops: list[SettleOp], counts: dict) -> list:
        results = await self._pipeline(ops, counts)
        if any(isinstance(x, NoScriptError) for x in results):
            await load_scripts(self.r)  # Redis restarted and lost its script cache
            results = await self._pipeline(ops, counts)
        failover = next((x for x in results if isinstance(x, Exception) and is_transient(x)), None)
        if failover is not None:  # READONLY: this connection's server is a replica now
            await self.r.connection_pool.disconnect(inuse_connections=False)
            raise failover
        if ops and self.wait:
            self.wait.check(results[-1], "settling rollouts")
        return results[: len(ops)]

    async def _pipeline(self, ops: list[SettleOp], counts: dict) -> list:
        pipe = self.r.pipeline(transaction=False)
        for op in ops:
            op.queue(pipe)
        for (key, stream, backlog, ttl), inc in counts.items():
            scripts.bucket(bucket=key, stream=stream, backlog=backlog, ttl_s=ttl, counts=inc).queue(pipe)
        if ops:
            self.wait.queue(pipe)  # last, on the batch's own connection: one WAIT per batch
        return await pipe.execute(raise_on_error=False)
