"""A run whose groups all score alike for several steps says so: GRPO's advantages are all 0 there,
so loss and gradient are 0 and the weights never change (SmolLM2 on the multi-environment config
scored 0 on every rollout, silently). Synthetic batches for the rule; a real run on the noop agent
(real Redis, a `farm worker` process, TRL) for the warning."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from helpers.data import trainer_row
from helpers.trainer import one_step_config, tiny_model

pytest.importorskip("transformers")


def _batch(*groups: list):
    from trainer.batch import Batch, Sample

    tasks, samples = [], []
    for g, rewards in enumerate(groups):
        for r in rewards:
            tasks.append(SimpleNamespace(group_id=f"g{g}"))  # the one field the rule reads
            samples.append(Sample([1], [2], [0.0], [1], r, "ok" if r is not None else "failed", "a", 0))
    return Batch(tasks, [], samples)


def test_a_batch_has_signal_when_some_group_has_two_rewards():
    from trainer.flat import has_signal

    assert has_signal(_batch([0.0, 0.0], [0.0, 1.0]))
    assert not has_signal(_batch([0.0, 0.0], [1.0, 1.0]))
    assert not has_signal(_batch([None, None], [1.0, None]))  # failures carry no signal


def test_three_flat_steps_in_a_row_warn_once_and_a_step_with_signal_starts_over(caplog):
    from trainer.flat import FlatSteps

    rollout = SimpleNamespace(batches=[])
    cb = FlatSteps(rollout)
    flat, mixed = [[0.0, 0.0], [0.0, 0.0]], [[0.0, 1.0], [0.0, 0.0]]
    with caplog.at_level(logging.WARNING, logger="farm.trainer"):
        for step, groups in enumerate([flat, flat, mixed, flat, flat, flat, flat, flat], 1):
            rollout.batches.append(_batch(*groups))
            cb.on_step_end(None, SimpleNamespace(global_step=step), None)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("steps 4-6: every group's rollouts had the same reward (rewards seen: 0)")
    assert "weights did not change" in warnings[0]


@pytest.mark.slow
def test_a_run_on_rows_that_all_score_1_warns_after_3_steps(settings, model_dir, tmp_path, caplog):
    """Before, nothing said so: the run trained 3 steps on nothing."""
    import redis
    from helpers.processes import stop
    from helpers.waiting import wait_for
    from helpers.workers import spawn_worker

    from farm.state import live_workers
    from trainer.train import build_trainer
    from trainer.weights import NoSync

    proc = spawn_worker(settings, "--agent", "noop", "--concurrency", "4")
    r = redis.Redis.from_url(settings.redis_url)
    try:
        wait_for(lambda: "noop" in live_workers(r, settings.keys).agents(), timeout=30, what="the noop worker")
        rows = [trainer_row(i, tokens=3, reward=1.0) for i in range(2)]
        cfg = one_step_config(tmp_path, model_dir, rows, max_steps=3)
        trainer, rollout, _ = build_trainer(settings, cfg, model=tiny_model(model_dir), weight_sync=NoSync())
        try:
            with caplog.at_level(logging.WARNING, logger="farm.trainer"):
                trainer.train()
        finally:
            rollout.close()
    finally:
        r.close()
        stop(proc, timeout=30)
    assert trainer.state.global_step == 3
    warnings = [x.getMessage() for x in caplog.records if "same reward" in x.getMessage()]
    assert warnings and warnings[0].startswith(
        "steps 1-3: every group's rollouts had the same reward (rewards seen: 1)"
    )
