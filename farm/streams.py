"""Worker-side stream operations on one agent's task stream.

Every call goes through the process's farm.transport.Outage (the one retry layer), so
nothing here catches a redis-py exception itself. Reads go through the consumer group
(`XREADGROUP ... COUNT free_slots`), so a worker never holds more tasks than it can run.
Settling a task (rollout to reply_to + XACK, a retry into the delayed set, or a dead
letter) is one Lua script per task; the Settler (farm.settler)
pipelines the scripts of many finished tasks into one round trip, which is what lets a
single worker process settle thousands of rollouts a second.
"""

from __future__ import annotations

import logging
import time
import zlib
from typing import Any, Iterable, Optional

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, ResponseError

from farm import history, schema, scripts
from farm.history import Recording
from farm.keys import GROUP, Keys, text
from farm.scripts import HistoryCount, Outcome, SettleOp, load_scripts
from farm.transport import Outage

log = logging.getLogger("farm.streams")

Entry = tuple[str, dict]


async def ensure_group(r: aioredis.Redis, stream: str) -> None:
    """Create the consumer group at id 0, so tasks added before any worker existed are read."""
    try:
        await r.xgroup_create(stream, GROUP, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


# What SETTLE's negative results mean, for the dead letter that replaces the settle.
BAD_REPLY = {-1: "is not a result stream of this namespace", -2: "holds a value that is not a stream"}


class AgentStream:
    """The task stream of one agent, as seen by one consumer (worker process)."""

    def __init__(
        self,
        r: aioredis.Redis,
        keys: Keys,
        agent: str,
        consumer: str,
        outage: Outage,
        recording: Optional[Recording] = None,
    ):
        self.r, self.keys, self.agent, self.consumer, self.outage = r, keys, agent, consumer, outage
        self.stream = keys.tasks(agent)
        self.stats = keys.stats(agent)
        self.rec = recording or Recording()
        self._bucket: tuple[int, str] = (-1, "")
        # The run each delivered entry counts against (its `r` field, farm.fairness), by entry id,
        # while this process holds it: its settle takes it out of the run's in flight.
        self.fed: dict[str, str] = {}
        self.fair, self.runs, self.backlog = keys.fair(agent), keys.runs(agent), keys.backlog(agent)
        self._feed_prefix = keys.queue_prefix(agent)

    async def setup(self) -> None:
        await self.outage.call(self._setup, "setting up the stream")

    async def _setup(self) -> None:
        await ensure_group(self.r, self.stream)
        await load_scripts(self.r)
        await self.r.sadd(self.keys.agents(), self.agent)

    async def _grouped(self, call) -> Any:
        """Run a group read; a NOGROUP reply (stream deleted, Redis came back empty) sets the group up again."""
        try:
            return await call()
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            await self._setup()
            return None

    async def read(self, count: int, block_ms: int) -> list[Entry]:
        """Up to `count` new tasks, waiting up to block_ms: in one round trip, FEED moves the runs'
        queued tasks into the stream in fair order (farm.fairness) and XREADGROUP reads them."""

        async def feed_and_read() -> Any:
            pipe = self.r.pipeline(transaction=False)
            scripts.feed(
                fair=self.fair,
                runs=self.runs,
                stream=self.stream,
                backlog=self.backlog,
                group=GROUP,
                want=count,
                queue_prefix=self._feed_prefix,
            ).queue(pipe)
            pipe.xreadgroup(GROUP, self.consumer, {self.stream: ">"}, count=count, block=block_ms)
            try:
                return (await pipe.execute())[1]
            except NoScriptError:
                await load_scripts(self.r)
                return None

        resp = await self.outage.call(lambda: self._grouped(feed_and_read), "fetching tasks")
        return self._entries(resp)

    def _entries(self, resp: Any) -> list[Entry]:
        out = []
        for _, entries in resp or []:
            for i, f in entries:
                entry_id = text(i)
                run = f.get(b"r")
                if run is not None:
                    self.fed[entry_id] = text(run)
                out.append((entry_id, f))
        return out

    def forget(self, entry_id: str) -> None:
        """The entry left this process (settled, or handed back)."""
        self.fed.pop(entry_id, None)

    async def reclaim(self, min_idle_ms: int, count: int) -> list[tuple[str, dict, int]]:
        """Take over entries idle longer than min_idle_ms; returns (id, fields, deliveries)."""
        resp = await self.outage.call(
            lambda: self._grouped(
                lambda: self.r.xautoclaim(self.stream, GROUP, self.consumer, min_idle_ms, "0-0", count=count)
            ),
            "reclaiming tasks",
        )
        if not resp:
            return []
        entries = self._entries([(self.stream, [(i, f) for i, f in resp[1] if f is not None])])
        if not entries:
            return []

        async def delivery_counts():
            pipe = self.r.pipeline(transaction=False)
            for i, _ in entries:
                pipe.xpending_range(self.stream, GROUP, min=i, max=i, count=1)
            return await pipe.execute()

        counts = await self.outage.call(delivery_counts, "reading delivery counts")
        out = []
        for (i, f), p in zip(entries, counts):
            deliveries = p[0]["times_delivered"] if p else 1
            out.append((i, f, deliveries))
        return out

    async def renew(self, ids: list[str]) -> list[str]:
        if not ids:
            return []
        call = scripts.renew(stream=self.stream, group=GROUP, consumer=self.consumer, ids=ids)
        lost = await self.outage.call(lambda: call.run(self.r), "renewing leases")
        return [text(x) for x in lost]

    async def release(self, ids: list[str], idle_ms: int) -> int:
        """Hand tasks back, in one attempt: this runs while stopping, when Redis may be gone."""
        if not ids:
            return 0
        call = scripts.release(stream=self.stream, group=GROUP, consumer=self.consumer, idle_ms=idle_ms, ids=ids)
        return await self.outage.once(lambda: call.run(self.r), "handing tasks back")

    async def prune_consumers(self, idle_ms: int) -> int:
        """Remove the group's consumers of workers that are gone (no pending entries, idle past idle_ms)."""
        call = scripts.prune(stream=self.stream, group=GROUP, idle_ms=idle_ms, keep=self.consumer)
        return await self.outage.call(lambda: call.run(self.r), "removing gone consumers")

    async def promote(self, limit: int = 200) -> int:
        return await self.outage.call(
            lambda: scripts.promote(
                delayed=self.keys.delayed(self.agent),
                stream=self.stream,
                fair=self.fair,
                runs=self.runs,
                now=time.time(),
                limit=limit,
                version=schema.SCHEMA_VERSION,
            ).run(self.r),
            "promoting due retries",
        )

    async def record_depth(self) -> None:
        """Write the agent's depth (every task not yet settled: the stream's length plus the backlog's)
        into this minute's history bucket, as a settle's counts do, in one round trip (BUCKET with no
        increments): the worker calls it on a clock, so a queue nobody settles from is still charted."""
        if self.rec.history:
            await self.outage.call(
                lambda: scripts.bucket(
                    bucket=self._bucket_key(), stream=self.stream, backlog=self.backlog, ttl_s=self.rec.ttl_s, counts={}
                ).run(self.r),
                "recording the queue depth",
            )

    # Settle operations, run by the Settler; the scripts' argument layouts are farm.scripts'.
    def settle_op(
        self,
        entry_id: str,
        outcome: Outcome,
        kind: str,
        appends: Iterable[tuple],
        reply_to: Optional[str] = None,
        bucket: Optional[dict[str, float]] = None,
        ids: tuple[str, str] = ("", ""),
    ) -> SettleOp:
        """SETTLE for one entry. `appends`: (stream, fields) or (stream, fields, maxlen, dropped-stat);
        `reply_to`, when given, is the first appended stream and is checked by the script; `bucket`
        (this minute's history increments, farm.history) rides along for the Settler, which adds
        it once the settle has acknowledged the task; `ids` (task id, run id) is no longer open
        once settled (farm.cancel)."""
        appends = list(appends)
        if reply_to is not None:
            assert appends and appends[0][0] == reply_to, "the reply is the first appended stream"
        call = scripts.settle(
            stream=self.stream,
            stats=self.stats,
            open_tasks=self.keys.open_tasks(),
            open_runs=self.keys.open_runs(),
            fair=self.fair,
            runs=self.runs,
            group=GROUP,
            entry_id=entry_id,
            stat=outcome,
            prefix=self.keys.results_prefix(),
            check_reply=reply_to is not None,
            task_id=ids[0],
            run_id=ids[1],
            flight=self.fed.get(entry_id, ""),
            appends=appends,
        )
        counts = None
        if bucket and self.rec.history:
            key = self._bucket_key()
            counts = HistoryCount(
                bucket=key, stream=self.stream, backlog=self.backlog, ttl_s=self.rec.ttl_s, increments=bucket
            )
        return SettleOp.of(
            call,
            entry_id=entry_id,
            agent=self.agent,
            outcome=outcome,
            kind=str(kind),
            history=counts,
        )

    def _bucket_key(self) -> str:
        """This minute's history bucket (the key is built once a minute, not once a settle)."""
        now = history.minute()
        if now != self._bucket[0]:
            self._bucket = (now, self.keys.history(self.agent, now))
        return self._bucket[1]

    def reply_op(
        self,
        entry_id: str,
        rollout: schema.Rollout,
        reply_to: str,
        fields: Optional[dict] = None,
        task_body: Optional[bytes] = None,
    ) -> SettleOp:
        """SETTLE with the rollout; `fields` is its entry when the caller has encoded it already.
        One group in `sample_every` is also kept, every rollout of it, in the agent's capped sample
        stream: chosen by a stable hash of the group id, so each worker keeps the same groups whole.
        A kept rollout carries its task's body (`t`, when given), so the dashboard shows its prompt."""
        fields = fields or schema.entry(rollout)
        appends: list[tuple] = [(reply_to, fields)]
        if self.rec.sample_every and zlib.crc32(rollout.group_id.encode()) % self.rec.sample_every == 0:
            sample = {**fields, b"t": task_body} if task_body else fields
            appends.append((self.keys.samples(self.agent), sample, self.rec.sample_keep, ""))
        bucket = history.increments(rollout, self.rec.pass_threshold)
        ids = (rollout.task_id, rollout.run_id)
        if rollout.ok:
            return self.settle_op(entry_id, "done", "", appends, reply_to=reply_to, bucket=bucket, ids=ids)
        if rollout.status is schema.Status.cancelled:
            return self.settle_op(
                entry_id, "cancelled", "cancelled", appends, reply_to=reply_to, bucket=bucket, ids=ids
            )
        if rollout.status is schema.Status.interrupted:
            return self.settle_op(
                entry_id, "interrupted", "interrupted", appends, reply_to=reply_to, bucket=bucket, ids=ids
            )
        kind = str(rollout.error.kind) if rollout.error is not None else "unknown"
        return self.settle_op(entry_id, "failed", kind, appends, reply_to=reply_to, bucket=bucket, ids=ids)

    def retry_op(self, entry_id: str, task: schema.Task, due: float, kind: str) -> SettleOp:
        """RETRY: the task (its next attempt) into the delayed set until `due`; `kind` is why the attempt failed."""
        call = scripts.retry(
            stream=self.stream,
            delayed=self.keys.delayed(self.agent),
            stats=self.stats,
            fair=self.fair,
            runs=self.runs,
            group=GROUP,
            entry_id=entry_id,
            due=due,
            body=schema.encode(task),
            flight=self.fed.get(entry_id, ""),
        )
        return SettleOp.of(
            call,
            entry_id=entry_id,
            agent=self.agent,
            outcome="retried",
            kind=str(kind),
        )

    def dead_op(
        self,
        entry_id: str,
        fields: dict,
        kind: str,
        reason: str,
        attempts: int,
        reply: Optional[tuple[str, schema.Rollout]] = None,
    ) -> SettleOp:
        """SETTLE as a dead letter (capped at dead_maxlen, what is trimmed counted as `dead_dropped`)."""
        letter = {
            "v": fields.get(b"v", b""),
            "d": fields.get(b"d", b""),
            "kind": kind,
            "reason": reason,
            "agent": self.agent,
            "attempts": attempts,
            "worker": self.consumer,
            "at": time.time(),
            "entry_id": entry_id,
        }
        appends: list[tuple] = [(self.keys.dead(self.agent), letter, self.rec.dead_maxlen, "dead_dropped")]
        if reply is None:
            info = schema.salvage(fields)  # a rare path: whatever still names the task stops being open
            ids = tuple(v if isinstance(v, str) else "" for v in (info.get("task_id"), info.get("run_id")))
            counts: dict[str, float] = {"failed": 1, f"fail:{kind}": 1}
            if ids[1]:
                counts[f"run:{ids[1]}:failed"] = 1
                counts[f"{history.RUN_FAIL}{ids[1]}:{kind}"] = 1
            return self.settle_op(entry_id, "dead", kind, appends, bucket=counts, ids=(ids[0], ids[1]))
        # The reply goes first: a bad reply_to is found before the dead letter is written.
        bucket = history.increments(reply[1], self.rec.pass_threshold)
        reply_append = (reply[0], schema.entry(reply[1]))
        ids = (reply[1].task_id, reply[1].run_id)
        return self.settle_op(
            entry_id, "dead", kind, [reply_append, *appends], reply_to=reply[0], bucket=bucket, ids=ids
        )
