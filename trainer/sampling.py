"""Which groups make a training step: over-sampling and dynamic sampling (DAPO), with no I/O.

A synchronous GRPO step waits for its slowest group: one long agent rollout holds the whole
batch, and the trainer's clock is the tail of the rollout latency. With `oversample` > 1 the
step submits ceil(B * oversample) groups for the B it needs and takes the first B that come back
*clean* (every rollout answered, with a reward and sampled tokens, in one token segment:
`one_sample`); the rest are cancelled. With `drop_zero_variance_groups` (DAPO's dynamic
sampling) a group whose rewards are all equal (GRPO advantage 0: it teaches nothing) is passed
over, and when the groups still in flight can no longer fill the batch a new group is submitted
for it; the k-th replacement in a chain is refill round k, and a group of round `max_refills` is
not replaced, so a step submits at most (initial groups) x (max_refills + 1) groups. Only
zero-variance groups earn a replacement: a failed rollout stays a visible, masked failure, as
without selection. A rollout with further token segments (`Rollout.segments`) counts here as a
failure does: this is the synchronous path, which TRL gives one sample per prompt, so
trainer/rollout.py masks it.

When the step runs out of groups in flight (or reaches its deadline) short of B clean ones, it
fills the batch with the best of the rest, so TRL always gets its shape: zero-variance groups,
then groups with failed rollouts (fewest failures first; the failures masked as always), then
groups a client cancelled, their `cancelled` rollouts turned into masked failures: a
`cancelled` rollout never reaches the batch.

The bias, and what is done about it. Taking the fastest groups favours prompts whose rollouts
finish quickly (short answers, few tool calls, agents on idle workers). The rows of cancelled
groups go first in line for the next step's extra groups (`SpareRows.carry`), so no prompt is
skipped for good by one slow step. What remains: a prompt that is slow *every* time is still
submitted but rarely wins a race, so slow prompts stay under-represented in the gradient (and
with them the long answers that the length of a rollout correlates with); the batch mixes
prompts by how fast they are, not only by how TRL's sampler drew them; and dynamic sampling
moves the mix towards prompts of middling difficulty, which is its purpose. Use oversample
close to 1 (1.1-1.3) and watch `farm/groups/cancelled` and `farm/groups/cancelled_run_s/*`.
"""

from __future__ import annotations

import json
import math
import random
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from farm.errors import ErrorKind
from farm.schema import Rollout, Status, Task

CLEAN, ZERO_VARIANCE, FAILED, CANCELLED = "clean", "zero_variance", "failed", "cancelled"


def usable(rollout: Rollout) -> bool:
    """A rollout the loss can use: answered, scored, with sampled tokens."""
    trace = rollout.trace
    return rollout.ok and rollout.reward is not None and trace is not None and len(trace.completion_ids) > 0


def one_sample(rollout: Rollout) -> bool:
    """A rollout the synchronous path trains: usable, in one token segment (no `segments`)."""
    return usable(rollout) and not rollout.segments


def zero_variance(rewards: Iterable[float], tol: float = 1e-6) -> bool:
    """All rewards equal: every GRPO advantage of the group is 0 (one reward counts too)."""
    values = list(rewards)
    return bool(values) and max(values) - min(values) <= tol


def client_deadline(rollout: Rollout) -> bool:
    """The client's stand-in for a rollout that never came (farm.client.results at its deadline)."""
    return rollout.error is not None and rollout.error.kind is ErrorKind.deadline and not rollout.worker_id


@dataclass(eq=False)
class Group:
    """One GRPO group of a step: its row, its Tasks and the rollouts back so far."""

    group_id: str
    row: dict
    tasks: list[Task]
    slot: Optional[int] = None  # the TRL group it answers (its place in `prompts`); None: extra or refill
    round: int = 0  # 0: submitted with the step; k: the k-th replacement of a zero-variance group
    submitted_at: float = 0.0  # time.monotonic()
    prompt: Any = None  # the prompt as TRL gave it (slot groups), else None
    rollouts: dict[str, Rollout] = field(default_factory=dict)
    kind: Optional[str] = None  # set once complete: clean, zero_variance, failed or cancelled
    replaced: bool = False

    @property
    def complete(self) -> bool:
        return len(self.rollouts) == len(self.tasks)

    def open_tasks(self) -> list[Task]:
        """Tasks the farm may still be running: no rollout yet, or only the client's deadline stand-in."""
        return [t for t in self.tasks if t.task_id not in self.rollouts or client_deadline(self.rollouts[t.task_id])]

    def classify(self, drop_zero_variance: bool) -> str:
        """clean, zero_variance (only when those are dropped), failed or cancelled."""
        got = list(self.rollouts.values())
        if any(r.status is Status.cancelled for r in got):
            return CANCELLED
        if not all(one_sample(r) for r in got):
            return FAILED
        if drop_zero_variance and zero_variance(float(r.reward) for r in got if r.reward is not None):
            return ZERO_VARIANCE
        return CLEAN

    def failures(self) -> int:
        return sum(not one_sample(r) for r in self.rollouts.values())


class GroupSelection:
    """The first `needed` clean groups win; zero-variance groups are replaced, within bounds.

    Feed it every rollout (`offer`); ask `refills()` for the rounds of the groups to submit in
    place of dropped ones, `finished()` whether waiting longer can change the batch, and
    `batch()` for the groups chosen, in TRL's slot order.
    """

    def __init__(self, needed: int, *, drop_zero_variance: bool = False, max_refills: int = 4):
        if needed < 1:
            raise ValueError("a step needs at least one group")
        if max_refills < 0:
            raise ValueError("max_refills must be >= 0")
        self.needed, self.drop_zero_variance, self.max_refills = needed, drop_zero_variance, max_refills
        self.groups: list[Group] = []
        self.completed: list[Group] = []  # in the order they completed
        self.refilled = 0
        self._by_task: dict[str, Group] = {}

    def add(self, group: Group) -> None:
        if group.round > 0:
            self.refilled += 1
        self.groups.append(group)
        for t in group.tasks:
            self._by_task[t.task_id] = group

    def offer(self, rollout: Rollout) -> Optional[Group]:
        """Record a rollout; the group it completed, if it did. Unknown or repeated ones are ignored."""
        group = self._by_task.get(rollout.task_id)
        if group is None or rollout.task_id in group.rollouts:
            return None
        group.rollouts[rollout.task_id] = rollout
        if not group.complete:
            return None
        group.kind = group.classify(self.drop_zero_variance)
        self.completed.append(group)
        return group

    def task(self, task_id: str) -> Task:
        """A task of the selection, by id."""
        return next(t for t in self._by_task[task_id].tasks if t.task_id == task_id)

    def of_kind(self, kind: str) -> list[Group]:
        return [g for g in self.completed if g.kind == kind]

    def live(self) -> list[Group]:
        return [g for g in self.groups if not g.complete]

    def pending_tasks(self) -> list[Task]:
        return [t for g in self.live() for t in g.tasks if t.task_id not in g.rollouts]

    def finished(self) -> bool:
        """Enough clean groups, or none left in flight."""
        return len(self.of_kind(CLEAN)) >= self.needed or not self.live()

    def refills(self) -> list[int]:
        """Rounds of the groups to submit now: one per zero-variance group (oldest first, each
        replaced once, below round max_refills) while the groups in flight cannot fill the batch."""
        if not self.drop_zero_variance:
            return []
        deficit = self.needed - len(self.of_kind(CLEAN)) - len(self.live())
        rounds = []
        for g in self.of_kind(ZERO_VARIANCE):
            if deficit <= 0:
                break
            if not g.replaced and g.round < self.max_refills:
                g.replaced = True
                rounds.append(g.round + 1)
                deficit -= 1
        return rounds

    def chosen(self) -> list[Group]:
        """The groups of the batch, best first: clean in completion order, then the fallbacks."""
        order = self.of_kind(CLEAN) + self.of_kind(ZERO_VARIANCE)
        order += sorted(self.of_kind(FAILED), key=Group.failures)
        order += self.of_kind(CANCELLED) + self.live()
        return order[: self.needed]

    def batch(self) -> list[Group]:
        """`needed` groups in slot order: a chosen TRL group keeps its place, the others fill the gaps."""
        chosen = self.chosen()
        slots: list[Optional[Group]] = [None] * self.needed
        rest = []
        for g in chosen:
            if g.slot is not None and g.slot < self.needed and slots[g.slot] is None:
                slots[g.slot] = g
            else:
                rest.append(g)
        fill = iter(rest)
        return [g if g is not None else next(fill) for g in slots]

    def pairs(self, batch: Optional[list[Group]] = None) -> list[tuple[Task, Rollout]]:
        """The batch's (task, rollout) pairs, group-contiguous. A missing rollout becomes a deadline
        failure and a `cancelled` one a masked failure of kind cancelled: neither is trained on."""
        out = []
        for g in self.batch() if batch is None else batch:
            for t in g.tasks:
                r = g.rollouts.get(t.task_id)
                if r is None:
                    r = Rollout.failure(t, ErrorKind.deadline, "no rollout when the step ended")
                elif r.status is Status.cancelled:
                    message = r.error.message if r.error else "cancelled"
                    r = Rollout.failure(t, ErrorKind.cancelled, message, policy_version=r.policy_version)
                out.append((t, r))
        return out

    def metrics(self, cancelled_ids: set[str], now: float, batch: Optional[list[Group]] = None) -> dict[str, float]:
        """farm/groups/* for one step; `cancelled_ids`: the tasks the farm reported open when cancelled."""
        batch = self.batch() if batch is None else batch
        taken = {id(g) for g in batch}
        cancelled = [g for g in self.groups if any(t.task_id in cancelled_ids for t in g.tasks)]
        run_s = [now - g.submitted_at for g in cancelled]
        zero = self.of_kind(ZERO_VARIANCE)
        in_batch = [r for _, r in self.pairs(batch)]  # what TRL gets
        return {
            "farm/groups/needed": float(self.needed),
            "farm/groups/submitted": float(len(self.groups)),
            "farm/groups/cancelled": float(len(cancelled)),
            "farm/groups/cancelled_run_s/mean": sum(run_s) / len(run_s) if run_s else 0.0,
            "farm/groups/cancelled_run_s/max": max(run_s, default=0.0),
            "farm/groups/zero_variance_dropped": float(sum(id(g) not in taken for g in zero)),
            "farm/groups/zero_variance_in_batch": float(sum(id(g) in taken for g in zero)),
            "farm/groups/refills": float(self.refilled),
            "farm/rollouts/cancelled_in_batch": float(sum(r.status is Status.cancelled for r in in_batch)),
        }


class SpareRows:
    """Where extra and refill groups get their rows: first the rows of groups cancelled in earlier
    steps (oldest first, each once), then the training rows in a seeded shuffled cycle."""

    def __init__(self, rows: list[dict], seed: int = 0, max_carry: Optional[int] = None):
        if not rows:
            raise ValueError("SpareRows needs at least one row")
        self.rows = list(rows)
        self.rng = random.Random(seed)
        self.max_carry = max_carry or max(64, len(self.rows))
        self._order: list[dict] = []
        self._carry: OrderedDict[str, dict] = OrderedDict()

    def take(self) -> dict:
        if self._carry:
            return self._carry.popitem(last=False)[1]
        if not self._order:
            self._order = list(self.rows)
            self.rng.shuffle(self._order)
            self._order.reverse()  # popped from the end: the shuffled order, front first
        return self._order.pop()

    def carry(self, rows: Iterable[dict]) -> None:
        """Put rows first in line (after those already waiting); bounded, the oldest overflow dropped."""
        for row in rows:
            key = json.dumps(row, sort_keys=True, default=str)
            self._carry.setdefault(key, row)
        while len(self._carry) > self.max_carry:
            self._carry.popitem(last=False)

    @property
    def waiting(self) -> list[dict]:
        return list(self._carry.values())


def extra_groups(needed: int, oversample: float) -> int:
    """How many groups beyond `needed` a step submits: ceil(needed * oversample) - needed."""
    if oversample < 1.0 or math.isnan(oversample):
        raise ValueError(f"oversample must be >= 1.0, got {oversample}")
    return math.ceil(needed * oversample - 1e-9) - needed
