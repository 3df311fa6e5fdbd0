"""Steps that cannot move the weights: every group scored alike.

GRPO's advantage is a sample's reward minus its group's mean, so a step whose groups each have one
reward (all 0 when the model never finds the answer format, all 1 once it has mastered the rows)
has every advantage 0: loss 0, gradient 0, the weights unchanged, while the run looks healthy.
`FlatSteps` counts such steps in a row from the batches FarmRollout keeps and, at `after` of them
(3 by default), warns once, naming the rewards they had; a step with signal starts the count over.
A group whose rollouts all failed carries no signal either and counts as flat.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any, Optional

from trainer.batch import Batch
from trainer.sampling import zero_variance

__all__ = ["FlatSteps", "has_signal"]

log = logging.getLogger("farm.trainer")


def has_signal(batch: Batch) -> bool:
    """Whether some group of the batch has two different rewards (a nonzero GRPO advantage)."""
    groups: dict[str, list[float]] = defaultdict(list)
    for task, sample in zip(batch.tasks, batch.samples):
        if sample.reward is not None:
            groups[task.group_id].append(sample.reward)
    return any(not zero_variance(rewards) for rewards in groups.values())


def _callback_base():
    from transformers import TrainerCallback

    return TrainerCallback


class FlatSteps(_callback_base()):
    """Warn when `after` optimizer steps in a row trained on batches without reward variance."""

    def __init__(self, rollout: Any, after: int = 3):
        self.rollout, self.after = rollout, after
        self.run = 0  # flat steps in a row
        self.first = 0  # the first step of the run of flat ones
        self.rewards: set[float] = set()
        self._seen: Optional[Batch] = None

    def on_step_end(self, args, state, control, **kwargs):
        batch = self.rollout.batches[-1] if self.rollout.batches else None
        if batch is None or batch is self._seen:
            return
        self._seen = batch
        if has_signal(batch):
            self.run, self.rewards = 0, set()
            return
        self.run += 1
        self.first = state.global_step if self.run == 1 else self.first
        self.rewards.update(round(s.reward, 4) for s in batch.samples if s.reward is not None)
        if self.run == self.after:
            seen = ", ".join(f"{r:g}" for r in sorted(self.rewards)) or "none (every rollout failed)"
            log.warning(
                "steps %d-%d: every group's rollouts had the same reward (rewards seen: %s), so every GRPO "
                "advantage was 0 and the weights did not change; the rows are too hard or too easy for the "
                "model, or the reward is broken (drop_zero_variance_groups: true resubmits such groups)",
                self.first,
                state.global_step,
                seen,
            )
