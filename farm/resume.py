"""Continuations of interrupted rollouts: the task that goes on from where a rollout stopped.

An interrupt (FarmClient.interrupt / interrupt_run) ends a task in one `interrupted` rollout whose
`partial` holds every token generated so far with its logprob and policy version, the loop's
record, and the task's row and sampling (farm.schema.Partial). `continuation` turns that rollout
into a new task of the same run, group and sample index that carries the partial in `Task.resume`;
any worker goes on from it token-exactly (workers/loops/partial.py). The partial lives in the task
entry, so it survives worker death like any task, and its size is checked against
`max_entry_bytes` here, before it is submitted, with an error that says so.
"""

from __future__ import annotations

import time
import uuid
from typing import Iterable, Optional

import msgspec

from farm.errors import ConfigError
from farm.keys import Keys
from farm.schema import Rollout, Sampling, Status, Task, encode

__all__ = ["continuation", "continuations"]


def continuation(rollout: Rollout, keys: Keys, *, max_entry_bytes: int, model: Optional[str] = None) -> Task:
    """The task that resumes `rollout`; ConfigError (one line) for a rollout that was not
    interrupted, one sampled by another model than `model` (when given), or one too large to queue."""
    where = f"task {rollout.task_id}"
    if rollout.status is not Status.interrupted or rollout.partial is None:
        raise ConfigError(f"cannot resume {where}: it ended {rollout.status}, not interrupted (nothing to go on from)")
    partial = rollout.partial
    if model is not None and partial.model and partial.model != model:
        raise ConfigError(f"cannot resume {where}: it was sampled by {partial.model!r}, not {model!r}")
    started = bool(partial.trace.prompt_ids)
    carried = msgspec.structs.replace(partial, row={}, sampling=None, resumes=partial.resumes + 1)
    task = Task(
        task_id=uuid.uuid4().hex,
        run_id=rollout.run_id,
        agent_ref=rollout.agent_ref,
        group_id=rollout.group_id,
        sample_index=rollout.sample_index,
        row=partial.row,
        sampling=partial.sampling or Sampling(),
        policy_version=rollout.policy_version,
        reply_to=keys.results(rollout.run_id),
        created_at=time.time(),
        resume=carried if started else None,
    )
    size = len(encode(task))
    if size > max_entry_bytes:
        raise ConfigError(
            f"cannot resume {where}: its partial trace makes a {size:,}-byte task, over "
            f"max_entry_bytes={max_entry_bytes:,} (raise max_entry_bytes, or interrupt it earlier)"
        )
    return task


def continuations(
    rollouts: Iterable[Rollout], keys: Keys, *, max_entry_bytes: int, model: Optional[str] = None
) -> list[Task]:
    """One continuation per rollout, all checked before any is submitted."""
    return [continuation(r, keys, max_entry_bytes=max_entry_bytes, model=model) for r in rollouts]
