"""What a delivered task becomes: the one settle operation (reply, retry, or dead letter) for it.

The worker hands each entry here once its agent loop may run: an unreadable entry or one whose
reply_to is not a result stream is dead-lettered with the reason; one delivered past
max_attempts, or whose deadline passed, ends without running; otherwise the agent runs under the
attempt's time limit, and its Rollout, or its failure, becomes a reply, a retry after a
jittered backoff, or a dead letter once the attempts are spent. A rollout too large for any
consumer becomes a failure that says so. Nothing here touches Redis or counts anything: the
Settler runs the op, and counts it by what the script answered, not by what was decided here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Optional

import msgspec

from farm import schema
from farm.cancel import Cancels
from farm.errors import RolloutFailure, SchemaError
from farm.schema import Attempt, ErrorKind, Rollout, Task
from farm.scripts import SettleOp
from farm.settings import Settings
from farm.streams import BAD_REPLY, AgentStream
from farm.tasks import cancelling
from farm.transport import backoff_delay
from workers.loops.context import Agent, AgentContext
from workers.policy.judges import serving

log = logging.getLogger("farm.worker")
ERROR_CHARS = 500  # of a failed attempt's message kept in the task's history (Task.history)


class Outcomes:
    """Settle operations for one worker's entries; the Settler counts them once Redis has answered."""

    def __init__(
        self,
        settings: Settings,
        stream: AgentStream,
        agent: Agent,
        ctx: AgentContext,
        cancels: Optional[Cancels] = None,
    ):
        self.settings = settings
        self.stream = stream
        self.agent = agent
        self.ctx = ctx
        self.worker_id = ctx.worker_id
        self.cancels = cancels
        # The agent runs in flight, by task id: (run id, the run's asyncio task, the task's created_at).
        self.running: dict[str, tuple[str, asyncio.Task, float]] = {}
        self.stopped = 0  # runs stopped in flight by a cancel

    @property
    def cancels(self) -> Optional[Cancels]:
        return self._cancels

    @cancels.setter
    def cancels(self, cancels: Optional[Cancels]) -> None:
        """The process's cancel mirror; its interrupts stop runs here too."""
        self._cancels = cancels
        if cancels is not None:
            cancels.on_interrupt = self.interrupt

    def stop(self, task_ids: set[str], run_ids: set[str]) -> None:
        """A cancel arrived (farm.cancel): stop the matching runs now; each then settles as `cancelled`."""
        hits = [tid for tid in task_ids if tid in self.running]
        if run_ids:
            hits += [tid for tid, (run, *_) in self.running.items() if run in run_ids and tid not in task_ids]
        for tid in hits:
            self.running[tid][1].cancel()

    def interrupt(self, task_ids: set[str], runs: dict[str, float]) -> None:
        """An interrupt arrived (farm.cancel): stop the matching runs now, marked so that the agent
        loop returns what it generated so far (workers/loops/partial.py) instead of being cancelled."""
        hits = [tid for tid in task_ids if tid in self.running]
        if runs:
            hits += [
                tid
                for tid, (run, _, created) in self.running.items()
                if run in runs and created <= runs[run] and tid not in task_ids
            ]
        for tid in hits:
            self.ctx.interrupts.add(tid)
            self.running[tid][1].cancel()

    def _cancelled(self, task: Task) -> bool:
        return self.cancels is not None and self.cancels.cancelled(task.task_id, task.run_id)

    def _interrupted(self, task: Task) -> bool:
        return self.cancels is not None and self.cancels.interrupted(task.task_id, task.run_id, task.created_at)

    def _interrupted_op(self, entry_id: str, task: Task, attempt: int, picked: float, message: str) -> SettleOp:
        """The `interrupted` rollout of a run that kept nothing (it had not started, or its agent keeps
        no partial): a continuation of one goes on from where the task itself started."""
        if task.resume is not None:
            partial = msgspec.structs.replace(task.resume, row=task.row, sampling=task.sampling)
        else:
            partial = schema.Partial.for_task(task, schema.TokenTrace())
        rollout = Rollout.for_task(
            task, status=schema.Status.interrupted, partial=partial, metrics={"generated_tokens": 0, "note": message}
        )
        return self.stream.reply_op(entry_id, self._stamp(rollout, task, attempt, picked), task.reply_to)

    def _cancelled_op(self, entry_id: str, task: Task, attempt: int, picked: float, message: str) -> SettleOp:
        """The one `cancelled` rollout of a task a client called off (farm.cancel)."""
        rollout = self._stamp(Rollout.cancelled(task, message), task, attempt, picked)
        return self.stream.reply_op(entry_id, rollout, task.reply_to)

    async def of(self, entry_id: str, fields: dict, deliveries: int, picked: float) -> SettleOp:
        s = self.settings
        st = self.stream
        try:
            task = schema.decode_task(fields, s.max_entry_bytes)
        except SchemaError as exc:
            log.error("dead-lettering unreadable entry", extra={"entry": entry_id, "reason": str(exc)})
            return st.dead_op(entry_id, fields, exc.kind, str(exc), deliveries, self._salvage_reply(fields, exc))
        if not s.keys.is_result_stream(task.reply_to):
            reason = f"reply_to {task.reply_to[:200]!r} {BAD_REPLY[-1]} ({s.keys.results_prefix()}RUN)"
            log.error("dead-lettering task", extra={"task_id": task.task_id, "kind": "bad_reply_to", "reason": reason})
            return st.dead_op(entry_id, fields, ErrorKind.bad_reply_to, reason, deliveries)

        attempt = task.attempt + deliveries - 1
        if self._cancelled(task):  # a set lookup: the cancel reached this process already (farm.cancel)
            return self._cancelled_op(entry_id, task, attempt, picked, "cancelled before it started")
        if self._interrupted(task):
            return self._interrupted_op(entry_id, task, attempt, picked, "interrupted before it started")
        if attempt > s.max_attempts:
            reason = (
                f"delivered {attempt} times without finishing (max_attempts={s.max_attempts}); "
                "the workers running it died or lost their lease"
            )
            return self._give_up(entry_id, fields, task, ErrorKind.max_attempts, reason, attempt, picked)
        if task.deadline is not None and picked > task.deadline:
            rollout = self._stamp(
                Rollout.failure(task, ErrorKind.deadline, "deadline passed before the task started"),
                task,
                attempt,
                picked,
            )
            return st.reply_op(entry_id, rollout, task.reply_to)

        limit = s.task_timeout_s
        if task.deadline is not None:
            limit = min(limit, task.deadline - picked)
        task_for_agent = msgspec.structs.replace(task, attempt=attempt) if attempt != task.attempt else task
        with serving(self.ctx.judges):  # `ctx.judge` in the run's verifier asks the process's pool
            run = asyncio.ensure_future(self.agent.run(task_for_agent, self.ctx))
        self.running[task.task_id] = (task.run_id, run, task.created_at)
        try:
            rollout = await asyncio.wait_for(run, timeout=max(limit, 0.001))
            if not isinstance(rollout, Rollout):
                raise TypeError(f"agent returned {type(rollout).__name__}, not a Rollout")
        except asyncio.CancelledError:
            if run.cancelled() and not cancelling() and self._interrupted(task) and not self._cancelled(task):
                took = time.time() - picked
                note = f"interrupted after {took:.2f}s in flight; its agent keeps no partial"
                return self._interrupted_op(entry_id, task, attempt, picked, note)
            if not run.cancelled() or cancelling() or not self._cancelled(task):
                raise  # the worker is stopping: the task is handed back, not settled
            self.stopped += 1
            took = time.time() - picked
            return self._cancelled_op(
                entry_id, task, attempt, picked, f"cancelled after {took:.2f}s in flight; its work was stopped"
            )
        except RolloutFailure as exc:
            if exc.retryable:
                return self._retry_or_give_up(entry_id, fields, task, attempt, str(exc.kind), exc.message, picked)
            rollout = Rollout.failure(task, exc.kind, exc.message)
        except asyncio.TimeoutError:
            if task.deadline is not None and time.time() >= task.deadline:
                rollout = Rollout.failure(task, ErrorKind.deadline, f"task deadline passed after {limit:.1f}s")
            else:
                return self._retry_or_give_up(
                    entry_id, fields, task, attempt, ErrorKind.timeout, f"attempt ran past {limit:.1f}s", picked
                )
        except Exception as exc:
            return self._retry_or_give_up(
                entry_id, fields, task, attempt, ErrorKind.agent_error, f"{type(exc).__name__}: {exc}", picked
            )
        finally:
            self.running.pop(task.task_id, None)
            self.ctx.interrupts.discard(task.task_id)
        task_body = fields.get(b"d")  # kept beside a sampled rollout: the dashboard shows its prompt
        rollout, out = self._fit(self._stamp(rollout, task, attempt, picked), task)
        return st.reply_op(entry_id, rollout, task.reply_to, out, task_body=task_body)

    def _fit(self, rollout: Rollout, task: Task) -> tuple[Rollout, dict]:
        """The rollout and its entry; one too big for any consumer to accept becomes a failure that says so."""
        fields = schema.entry(rollout)
        size = len(fields[b"d"])
        if size <= self.settings.max_entry_bytes:
            return rollout, fields
        reason = f"rollout is {size:,} bytes, over max_entry_bytes={self.settings.max_entry_bytes:,}"
        log.error("rollout too large", extra={"task_id": task.task_id, "reason": reason})
        failed = msgspec.structs.replace(
            Rollout.failure(task, ErrorKind.too_large, reason),
            worker_id=rollout.worker_id,
            attempt=rollout.attempt,
            timings=rollout.timings,
            finished_at=rollout.finished_at,
        )
        return failed, schema.entry(failed)

    def bad_reply_op(self, entry_id: str, fields: dict, deliveries: int, code: int) -> SettleOp:
        """SETTLE refused the reply stream: dead-letter the task with the reason instead (nothing lost)."""
        reply_to = schema.salvage(fields).get("reply_to", "?")
        reason = f"reply_to {str(reply_to)[:200]!r} {BAD_REPLY[code]}"
        log.error("dead-lettering task", extra={"entry": entry_id, "kind": "bad_reply_to", "reason": reason})
        return self.stream.dead_op(entry_id, fields, ErrorKind.bad_reply_to, reason, deliveries)

    def _retry_or_give_up(
        self, entry_id: str, fields: dict, task: Task, attempt: int, kind: str, message: str, picked: float
    ) -> SettleOp:
        s = self.settings
        if self._cancelled(task):  # cancelled while this attempt ran: never retried, never dead-lettered
            message = f"cancelled; its last attempt had failed: {message}"
            return self._cancelled_op(entry_id, task, attempt, picked, message)
        if attempt >= s.max_attempts:
            reason = f"failed {attempt} attempts; last: {message}"
            return self._give_up(entry_id, fields, task, kind, reason, attempt, picked, error=message)
        delay = backoff_delay(s.retry_backoff_s, s.retry_backoff_max_s, attempt - 1)
        log.info(
            "retrying task",
            extra={
                "task_id": task.task_id,
                "attempt": attempt,
                "kind": str(kind),
                "reason": message,
                "delay_s": round(delay, 3),
            },
        )
        retry = msgspec.structs.replace(self._remember(task, attempt, kind, message), attempt=attempt + 1)
        return self.stream.retry_op(entry_id, retry, time.time() + delay, kind)

    def _remember(self, task: Task, attempt: int, kind: str, message: str) -> Task:
        """The task with this failed attempt added to its history (the newest max_attempts kept)."""
        seen = Attempt(
            attempt=attempt, worker=self.worker_id, at=time.time(), kind=str(kind), error=message[:ERROR_CHARS]
        )
        return msgspec.structs.replace(task, history=[*task.history, seen][-self.settings.max_attempts :])

    def _give_up(
        self,
        entry_id: str,
        fields: dict,
        task: Task,
        kind: str,
        reason: str,
        attempt: int,
        picked: float,
        error: str = "",
    ) -> SettleOp:
        """A dead letter holding the task with every attempt in its history, the last one (`error`,
        else the reason) included; the failed rollout sent to the waiter carries the same history."""
        log.error("dead-lettering task", extra={"task_id": task.task_id, "kind": str(kind), "reason": reason})
        task = self._remember(task, attempt, kind, error or reason)
        rollout = self._stamp(Rollout.failure(task, kind, reason), task, attempt, picked)
        fields = {**fields, **schema.entry(task)}
        return self.stream.dead_op(entry_id, fields, str(kind), reason, attempt, (task.reply_to, rollout))

    def _salvage_reply(self, fields: dict, exc: SchemaError) -> Optional[tuple[str, Rollout]]:
        """Address a failed rollout to whoever waits for an unreadable task, when we can tell who."""
        info = schema.salvage(fields)
        if not self.settings.keys.is_result_stream(info.get("reply_to")):
            return None
        rollout = schema.salvaged_failure(info, exc.kind, str(exc), self.stream.agent, worker_id=self.worker_id)
        return None if rollout is None else (info["reply_to"], rollout)

    def _stamp(self, rollout: Rollout, task: Task, attempt: int, picked: float) -> Rollout:
        now = time.time()
        timings = msgspec.structs.replace(
            rollout.timings, queue_wait_s=max(0.0, picked - task.created_at), total_s=now - picked
        )
        return msgspec.structs.replace(
            rollout, worker_id=self.worker_id, attempt=attempt, timings=timings, finished_at=now
        )
