"""Partial rollouts in the synchronous trainer: over-sampling that keeps the work it stops.

Over-sampling submits more groups than a step needs and stops the slowest when the step has its
batch. With `partial_rollouts` those are *interrupted* instead of cancelled (FarmClient.interrupt):
each running rollout comes back with every token it generated (farm.schema.Partial), and the next
step submits the group again as one of its extra groups: finished samples keep their rollouts, an
interrupted one gets a continuation task that goes on from its last token (FarmClient.resume's
task, farm.resume), and a sample that came back with nothing runs again. Nothing generated is
thrown away unless the group is never taken.

Tokens sampled under older weights are corrected per token by TRL's truncated importance sampling
(each token keeps the logprob it was sampled with); `mask_stale_tokens` also masks, from the loss,
the tokens sampled more than `max_staleness` versions before the step's (slime's
--mask-offpolicy-in-partial-rollout).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from farm.client import FarmClient
from farm.errors import TransportError
from farm.keys import Keys
from farm.resume import continuation
from farm.schema import Rollout, Status, Task
from trainer.sampling import Group, GroupSelection

__all__ = ["Carried", "carry", "interrupt_open", "mask_stale", "resumed_group", "step_tokens", "token_figures"]

log = logging.getLogger("farm.trainer")


@dataclass
class Carried:
    """A group stopped at a step's end, to be taken up by the next: each sample's task and what came back."""

    group_id: str
    row: dict
    samples: list[tuple[Task, Optional[Rollout]]]


def carry(groups: Iterable[Group], late: dict[str, Rollout]) -> list[Carried]:
    """The groups not taken that still had work in flight, with the rollouts that came back for them
    (`late`: what the interrupted tasks answered)."""
    out = []
    for g in groups:
        samples = [(t, late.get(t.task_id) or g.rollouts.get(t.task_id)) for t in g.tasks]
        if any(r is not None and r.status is Status.interrupted for _, r in samples):
            out.append(Carried(g.group_id, g.row, samples))
    return out


def resumed_group(
    c: Carried, keys: Keys, max_entry_bytes: int, fresh: Callable[[Task], Task]
) -> tuple[Group, list[Rollout]]:
    """The group again, for this step: the finished samples' rollouts (offered once it is added),
    continuations of the interrupted ones, and fresh tasks for the samples that kept nothing."""
    tasks, done = [], []
    for task, rollout in c.samples:
        if rollout is not None and rollout.ok:
            tasks.append(task)
            done.append(rollout)
        elif rollout is not None and rollout.status is Status.interrupted and rollout.partial is not None:
            tasks.append(continuation(rollout, keys, max_entry_bytes=max_entry_bytes))
        else:
            tasks.append(fresh(task))
    return Group(c.group_id, c.row, tasks, submitted_at=time.monotonic()), done


def sampled(rollout: Optional[Rollout]) -> int:
    """Tokens the policy sampled in a rollout (or in an interrupted one's partial)."""
    if rollout is None:
        return 0
    trace = rollout.partial.trace if rollout.partial is not None else rollout.trace
    return sum(trace.env_mask) if trace is not None else 0


def carried_in(task: Task) -> int:
    """Tokens a continuation task already holds (counted when they were generated)."""
    return sum(task.resume.trace.env_mask) if task.resume is not None else 0


def mask_stale(mask: list[int], rollout: Rollout, oldest: int) -> int:
    """Mask (in place) the sampled tokens of versions before `oldest`; how many were masked."""
    trace = rollout.trace
    if trace is None or not trace.versions:
        if rollout.policy_version >= oldest:
            return 0
        n = sum(mask)
        mask[:] = [0] * len(mask)
        return n
    n = 0
    for i, v in enumerate(trace.token_versions(rollout.policy_version)):
        if v < oldest and i < len(mask) and mask[i]:
            mask[i] = 0
            n += 1
    return n


def token_figures(
    received: dict[str, tuple[Task, Rollout]],
    batch: set[str],
    carried: list[Carried],
    trained: int,
    masked: int,
    version: int,
    seen_before: set[str],
) -> dict[str, float]:
    """Per step: tokens generated (first seen this step), trained, carried to the next step and
    discarded (received, neither in the batch nor carried: never to be trained, stale-masked ones
    included); the batch's resumed rollouts and their age in versions (from their oldest token).
    `seen_before`: rollouts received in an earlier step and offered again (a carried group's)."""
    kept = {t.task_id for c in carried for t, r in c.samples if r is not None}
    generated = sum(max(0, sampled(r) - carried_in(t)) for tid, (t, r) in received.items() if tid not in seen_before)
    dropped = sum(sampled(r) for tid, (_, r) in received.items() if tid not in batch and tid not in kept)
    resumed = [r for tid, (t, r) in received.items() if tid in batch and t.resume is not None and r.trace is not None]
    ages = [version - min(r.trace.token_versions(r.policy_version)) for r in resumed if r.trace is not None]
    return {
        "farm/tokens/generated": float(generated),
        "farm/tokens/trained": float(trained),
        "farm/tokens/carried": float(sum(sampled(r) for c in carried for _, r in c.samples)),
        "farm/tokens/discarded": float(dropped + masked),
        "farm/tokens/stale_masked": float(masked),
        "farm/partial/resumed_in_batch": float(len(resumed)),
        "farm/partial/resumed_age/max": float(max(ages, default=0)),
        "farm/partial/resumed_age/mean": sum(ages) / len(ages) if ages else 0.0,
    }


async def interrupt_open(
    client: FarmClient, run_id: str, open_tasks: list[Task], wait_s: float
) -> tuple[set[str], dict[str, Rollout]]:
    """Interrupt the open tasks and take what they answer (their partials, or the rollout they were
    finishing), briefly: one that does not answer within `wait_s` is dropped when it comes.
    (the ids the farm reported open, the rollouts by task id)."""
    try:
        report = await client.interrupt(open_tasks)
        late = await client.collect(open_tasks, timeout_s=wait_s)
    except TransportError as exc:
        log.warning("could not interrupt %d open tasks (%s); their late rollouts are dropped", len(open_tasks), exc)
        return set(), {}
    reader = client.reader(run_id)
    for t in open_tasks:
        if t.task_id not in late or not late[t.task_id].worker_id:  # the client's deadline stand-in
            late.pop(t.task_id, None)
            reader.drop(t.task_id)
    return set(report.open), late


def step_tokens(
    sel: GroupSelection,
    pairs: list[tuple[Task, Rollout]],
    samples: list[Any],
    late: dict[str, Rollout],
    carried: list[Carried],
    version: int,
    seen_before: set[str],
) -> dict[str, float]:
    """token_figures for one step of FarmRollout: every rollout its groups received, late ones included."""
    received = {t.task_id: (t, r) for g in sel.groups for t in g.tasks if (r := g.rollouts.get(t.task_id))}
    received.update({tid: (sel.task(tid), r) for tid, r in late.items()})
    batch = {t.task_id for t, _ in pairs}
    trained = sum(sum(s.env_mask) for s in samples if s.reward is not None)
    masked = sum(s.stale_masked for s in samples)
    return token_figures(received, batch, carried, trained, masked, version, seen_before)
