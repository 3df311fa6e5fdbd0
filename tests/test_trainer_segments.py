"""Rollouts in several token segments (`Rollout.segments`, from workers/gateway) in the trainer.

The rule: the async adapter trains each segment as a sample of its own, all with the rollout's
advantage (one reward per rollout); the synchronous rollout_func, which TRL gives one sample per
prompt, masks such a rollout as it masks a failure (reward None, never 0) and counts it as
`farm/multi_segment_masked`. The rollouts are built by hand (no harness produces them without a
model); the sync test sends them over a real Redis result stream to the real FarmRollout.
"""

from __future__ import annotations

import json
import os

import msgspec
import pytest
from helpers.data import trainer_row
from helpers.trainer import CharTokenizer

from farm import schema
from farm.client import FarmClient
from farm.errors import MalformedEntry
from farm.schema import Rollout, Sampling, Status, Task, TokenTrace
from trainer.sampling import CLEAN, FAILED, GroupSelection

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

# Segment 1: prompt, two sampled tokens, one tool-result token the environment inserted, one more
# sampled token. Segment 2: the harness edited its history (the tool result became 40), so the
# gateway started over: earlier tokens reappear in its prompt, only 13 and 14 are new samples.
FIRST = ([1, 2, 3], [10, 11, 20, 12], [-0.1, -0.2, 0.0, -0.3], [1, 1, 0, 1])
SECOND = ([1, 2, 3, 10, 11, 40], [13, 14], [-0.4, -0.5], [1, 1])
SINGLE = ([1, 2, 3], [50, 51], [-0.6, -0.7], [1, 1])


def trace(part) -> TokenTrace:
    return TokenTrace.build(*part)


def two_segments(task: Task, reward: float) -> Rollout:
    return Rollout.for_task(
        task, status=Status.ok, reward=reward, trace=trace(FIRST), segments=[trace(SECOND)], worker_id="w"
    )


def one_segment(task: Task, reward: float) -> Rollout:
    return Rollout.for_task(task, status=Status.ok, reward=reward, trace=trace(SINGLE), worker_id="w")


def tasks_of(n: int) -> list[Task]:
    row = trainer_row(0)
    return [Task.new(run_id="r", agent="noop", row=row, reply_to="x", group_id="g", sample_index=i) for i in range(n)]


def test_a_rollout_with_segments_round_trips_through_a_stream_entry():
    task = tasks_of(1)[0]
    rollout = two_segments(task, 1.0)
    back = schema.decode_rollout(schema.entry(rollout))
    assert back == rollout
    assert [list(s.completion()) for s in back.segments] == [SECOND[1]]
    assert list(back.segments[0].prompt()) == SECOND[0] and back.segments[0].mask() == SECOND[3]
    assert schema.decode_rollout(schema.entry(one_segment(task, 1.0))).segments == []
    # A segment is checked like `trace`: logprobs short of its completion make the entry malformed.
    fields = schema.entry(rollout)
    loose = msgspec.msgpack.decode(fields[b"d"])
    loose["segments"][0]["logprobs"] = loose["segments"][0]["logprobs"][:4]
    with pytest.raises(MalformedEntry, match="logprobs"):
        schema.decode_rollout({**fields, b"d": msgspec.msgpack.encode(loose)})


def test_the_async_adapter_trains_each_segment_with_the_rollouts_advantage():
    pytest.importorskip("trl")
    from trainer.async_adapter import group_samples

    tasks = tasks_of(2)
    samples, metrics = group_samples(tasks, [two_segments(tasks[0], 1.0), one_segment(tasks[1], 0.0)], group_id=7)
    assert len(samples) == 3 and metrics["farm/extra_segments"] == 1.0
    first, second, single = samples
    for s, (prompt, completion, logprobs, mask) in zip(samples, [FIRST, SECOND, SINGLE]):
        assert s.input_ids.tolist() == prompt + completion
        assert s.completion_mask.tolist() == [0] * len(prompt) + mask
        assert s.old_log_probs.tolist() == pytest.approx([0.0] * len(prompt) + logprobs)
        assert s.group_id == 7
    # Advantages over the group's two rollouts (rewards 1 and 0), not its three samples.
    assert first.advantage == second.advantage == pytest.approx(1.0, abs=1e-6)
    assert single.advantage == pytest.approx(-1.0, abs=1e-6)
    assert first.metrics["reward"] == second.metrics["reward"] == 1.0
    assert metrics["farm/reward"] == 0.5


class AnsweredFarm(FarmClient):
    """A farm whose worker answers at once: submit writes each task's rollout (sample 0 in two
    segments, the others in one) to the task's real result stream, where the real client reads it.
    It stands in for a gateway worker, which would need a harness and a model to make these."""

    async def submit(self, tasks, *, share: float = 1.0, max_in_flight: int = 0) -> list[str]:
        tasks = list(tasks)
        for t in tasks:
            rollout = two_segments(t, 1.0) if t.sample_index == 0 else one_segment(t, 0.5)
            await self.r.xadd(t.reply_to, schema.entry(rollout))
        return [t.task_id for t in tasks]


def test_the_sync_path_masks_and_counts_a_multi_segment_rollout_beside_one_that_trains(settings):
    from trainer.batch import summary
    from trainer.rollout import FarmRollout, env_reward

    rollout = FarmRollout(
        settings,
        tokenizer=CharTokenizer(),
        run_id="segments",
        timeout_s=10,
        num_generations=2,
        sampling=Sampling(max_tokens=8),
        client_factory=AnsweredFarm,
    )
    try:
        out = rollout([json.dumps(trainer_row(0))] * 2)
    finally:
        rollout.close()
    # The two-segment rollout: one placeholder token, masked out of the loss, reward None (no
    # advantage, never 0), as a failed rollout's.
    assert out["completion_ids"][0] == [CharTokenizer.eos_token_id]
    assert out["env_mask"][0] == [0] and out["logprobs"][0] == [0.0]
    assert out["env_reward"] == [None, 0.5]
    assert env_reward(out["completion_ids"], env_reward=out["env_reward"]) == [None, 0.5]
    assert out["farm_status"] == ["multi_segment", "ok"]
    # The single-segment rollout beside it trains as before.
    assert out["prompt_ids"][1] == SINGLE[0] and out["completion_ids"][1] == SINGLE[1]
    assert out["logprobs"][1] == pytest.approx(SINGLE[2]) and out["env_mask"][1] == SINGLE[3]
    m = rollout.batches[-1].metrics
    assert m["farm/multi_segment_masked"] == 1.0
    assert m["farm/failed"] == 0.0 and not any(k.startswith("farm/failed/") for k in m)
    assert m["farm/reward/noop/mean"] == 0.5 and m["farm/tokens/sampled"] == 2.0
    assert "1 multi-segment masked" in summary(m)


def test_a_group_with_a_multi_segment_rollout_is_not_clean_in_the_sync_selection():
    """The step's group selection sees what the sync path will mask: a clean group that finishes
    later wins over one holding a multi-segment rollout."""
    from trainer.sampling import Group

    def group(name: str) -> Group:
        row = {"agent_ref": {"name": "noop"}, "name": name}
        tasks = [
            Task.new(run_id="r", agent="noop", row=row, reply_to="x", group_id=name, sample_index=i) for i in range(2)
        ]
        return Group(name, row, tasks)

    sel = GroupSelection(1)
    segmented, clean = group("segmented"), group("clean")
    sel.add(segmented)
    sel.add(clean)
    sel.offer(two_segments(segmented.tasks[0], 1.0))
    assert sel.offer(one_segment(segmented.tasks[1], 0.0)).kind == FAILED
    assert segmented.failures() == 1 and not sel.finished()
    sel.offer(one_segment(clean.tasks[0], 1.0))
    assert sel.offer(one_segment(clean.tasks[1], 0.0)).kind == CLEAN
    assert sel.batch() == [clean]
