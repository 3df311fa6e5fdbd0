"""Partial rollouts in the trainer (FarmRollout, partial_rollouts): over-sampling interrupts the
groups a step does not take, and the next step resumes them from their last token instead of
starting over; the tokens sampled before a weight update keep their version and can be masked.

Through Redis and a real `farm worker --agent noop` process: the noop agent generates its
`tokens` one by one over `sleep_s` and keeps them when interrupted (workers/loops/noop.py)."""

from __future__ import annotations

import json
import time

import pytest
import redis
from helpers.data import trainer_row
from helpers.processes import stop
from helpers.trainer import CharTokenizer
from helpers.waiting import wait_for
from helpers.workers import spawn_worker

from farm.policy_version import announce_live
from farm.schema import Status
from farm.state import live_workers

pytestmark = pytest.mark.slow


@pytest.fixture
def noop_worker(settings):
    proc = spawn_worker(settings, "--agent", "noop", "--concurrency", "16")
    r = redis.Redis.from_url(settings.redis_url)
    try:
        wait_for(lambda: "noop" in live_workers(r, settings.keys).agents(), timeout=30, what="a live noop worker")
        yield r
    finally:
        r.close()
        stop(proc)


def test_interrupted_groups_resume_next_step_and_keep_every_token(settings, noop_worker):
    from trainer.rollout import FarmRollout

    slow = [trainer_row(i, sleep_s=3.0, tokens=30, reward=float(i)) for i in range(2)]
    fast = [trainer_row(10 + i, sleep_s=0.6, tokens=4, reward=float(10 + i)) for i in range(2)]
    slower = [trainer_row(20 + i, sleep_s=30.0, tokens=30, reward=0.0) for i in range(2)]
    rollout = FarmRollout(
        settings,
        tokenizer=CharTokenizer(),
        run_id="part",
        num_generations=2,
        oversample=2.0,
        spare_rows=slow,
        timeout_s=60,
        partial_rollouts=True,
        mask_stale_tokens=0,
    )
    try:
        # Step 1: TRL's groups are fast; the two slow extra groups are interrupted mid-generation.
        t0 = time.perf_counter()
        rollout([json.dumps(r) for r in fast for _ in range(2)])
        one = rollout.batches[-1].metrics
        assert time.perf_counter() - t0 < 2.5
        assert [c.row for c in rollout.carried] == slow
        cut = [r for c in rollout.carried for _, r in c.samples]
        assert {r.status for r in cut} == {Status.interrupted}
        kept = {r.task_id: len(r.partial.trace.completion()) for r in cut}
        assert all(0 < n < 30 for n in kept.values()), kept
        assert one["farm/tokens/carried"] == sum(kept.values()) and one["farm/tokens/discarded"] == 0
        assert one["farm/tokens/trained"] == 16 and one["farm/tokens/generated"] == 16 + sum(kept.values())

        # A weight update, then step 2: TRL's groups are slower; the resumed groups finish first.
        rollout.version = 1
        announce_live(noop_worker, settings.keys, 1)
        t0 = time.perf_counter()
        out = rollout([json.dumps(r) for r in slower for _ in range(2)])
        two = rollout.batches[-1]
        assert time.perf_counter() - t0 < 3.5, "the resumed groups only had the rest of their time to run"
        assert [json.loads(p) for p in out["farm_prompt"]] == [slow[0]] * 2 + [slow[1]] * 2
        assert out["farm_status"] == ["ok"] * 4 and all(len(c) == 30 for c in out["completion_ids"])
        for rollout_, mask in zip(two.rollouts, out["env_mask"]):
            versions = list(rollout_.trace.token_versions(rollout_.policy_version))
            before = versions.count(0)
            assert before >= 1 and versions == [0] * before + [1] * (30 - before)
            assert mask == [0] * before + [1] * (30 - before), "tokens of the old version are masked"
        m = two.metrics
        assert m["farm/partial/resumed_in_batch"] == 4 and m["farm/partial/resumed_age/max"] == 1
        assert m["farm/tokens/stale_masked"] == sum(kept.values())
        assert m["farm/tokens/generated"] == 4 * 30 - sum(kept.values()) + m["farm/tokens/carried"]
    finally:
        rollout.cancel_run()
        rollout.close()
