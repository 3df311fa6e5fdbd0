"""Over-sampling and dynamic sampling: which groups make a step (trainer/sampling.py).

The first tests drive GroupSelection and SpareRows by hand (the choice is pure: rollouts in,
groups out). The rest run through the real farm (Redis, a `farm worker` process of the `noop`
agent, whose rows say how long a rollout sleeps and what it scores): the slow groups of an
over-sampled step are cancelled on the farm, their `cancelled` rollouts come back on the
result stream and are dropped, never handed to TRL; the async adapter cancels what it has in
flight when stopped, and a group's remaining tasks as soon as it is known to be stale.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import redis
from helpers.data import trainer_row
from helpers.processes import stop
from helpers.trainer import CharTokenizer, one_step_config, tiny_model
from helpers.waiting import wait_for
from helpers.workers import spawn_worker

from farm import schema
from farm.errors import ErrorKind
from farm.schema import Rollout, Status, Task, TokenTrace
from farm.state import live_workers
from trainer.sampling import Group, GroupSelection, SpareRows, extra_groups

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


# -- the choice, by hand ----------------------------------------------------------------------


def group(name: str, n: int = 2, *, slot=None, round_: int = 0, submitted_at: float = 0.0) -> Group:
    row = {"agent_ref": {"name": "noop"}, "name": name}
    tasks = [
        Task.new(run_id="r", agent="noop", row=row, reply_to="farm:results:r", group_id=name, sample_index=i)
        for i in range(n)
    ]
    return Group(name, row, tasks, slot=slot, round=round_, submitted_at=submitted_at)


def ok(task: Task, reward: float) -> Rollout:
    trace = TokenTrace.build([1, 2], [3, 4], [-0.5, -0.5], [1, 1])
    return Rollout.for_task(task, status=Status.ok, reward=reward, trace=trace, worker_id="w")


def answer(sel: GroupSelection, g: Group, *rewards) -> list:
    """Offer one rollout per task of g: a float is an ok rollout's reward, 'fail' a verifier
    failure, 'cancel' a cancelled rollout; returns what each offer returned."""
    out = []
    for t, how in zip(g.tasks, rewards):
        if how == "fail":
            r = Rollout.failure(t, ErrorKind.verifier, "boom", worker_id="w")
        elif how == "cancel":
            r = Rollout.cancelled(t, "called off", worker_id="w")
        else:
            r = ok(t, how)
        out.append(sel.offer(r))
    return out


def test_the_first_complete_groups_win_and_keep_trl_slots():
    sel = GroupSelection(2)
    a, b = group("a", slot=0, submitted_at=1.0), group("b", slot=1, submitted_at=1.0)
    x, y = group("x", submitted_at=2.0), group("y", submitted_at=2.0)
    for g in (a, b, x, y):
        sel.add(g)
    answer(sel, a, 1.0)  # half of a: not complete, not taken
    assert answer(sel, y, 0.0, 1.0) == [None, y] and not sel.finished()
    answer(sel, b, 1.0, 0.0)
    assert sel.finished()  # two clean groups: a and x are not waited for
    assert sel.batch() == [y, b]  # b keeps TRL's slot 1; y fills slot 0, a's
    pairs = sel.pairs()
    assert [t.group_id for t, _ in pairs] == ["y", "y", "b", "b"]
    assert [t.sample_index for t, _ in pairs] == [0, 1, 0, 1] and all(r.ok for _, r in pairs)
    assert [t.task_id for t in a.open_tasks()] == [a.tasks[1].task_id] and len(x.open_tasks()) == 2
    cancelled = {a.tasks[1].task_id, *(t.task_id for t in x.tasks)}
    m = sel.metrics(cancelled, now=5.0)
    assert m["farm/groups/needed"] == 2 and m["farm/groups/submitted"] == 4 and m["farm/groups/cancelled"] == 2
    assert m["farm/groups/cancelled_run_s/mean"] == 3.5 and m["farm/groups/cancelled_run_s/max"] == 4.0
    assert m["farm/groups/refills"] == 0 and m["farm/rollouts/cancelled_in_batch"] == 0


def test_without_selection_a_failed_group_waits_for_the_rest_and_keeps_its_slot():
    """oversample 1, nothing dropped: the batch is TRL's groups in order, failures masked (today's behaviour)."""
    sel = GroupSelection(2)
    a, b = group("a", slot=0), group("b", slot=1)
    sel.add(a)
    sel.add(b)
    answer(sel, a, 1.0, "fail")
    assert not sel.finished()
    answer(sel, b, 1.0, 1.0)  # zero variance, but kept: nothing is dropped
    assert sel.finished() and sel.batch() == [a, b] and sel.refills() == []


def test_a_zero_variance_group_is_dropped_and_refilled_when_the_batch_needs_it():
    sel = GroupSelection(2, drop_zero_variance=True, max_refills=4)
    a, b, x = group("a", slot=0), group("b", slot=1), group("x")
    for g in (a, b, x):
        sel.add(g)
    answer(sel, a, 1.0, 1.0)  # zero variance; b and x in flight can still fill the batch
    assert sel.refills() == [] and not sel.finished()
    answer(sel, b, 0.0, 0.0)  # zero variance too: clean 0 + live 1 < 2
    assert sel.refills() == [1]  # one replacement, for the oldest (a), at round 1
    r1 = group("r1", round_=1)
    sel.add(r1)
    assert sel.refills() == [] and a.replaced and not b.replaced  # x and r1 in flight suffice
    answer(sel, x, 0.0, 1.0)
    answer(sel, r1, 0.5, 0.0)
    assert sel.finished() and sel.batch() == [x, r1]
    m = sel.metrics(set(), now=0.0)
    assert m["farm/groups/zero_variance_dropped"] == 2 and m["farm/groups/refills"] == 1
    assert m["farm/groups/zero_variance_in_batch"] == 0 and m["farm/groups/submitted"] == 4


def test_refills_are_bounded_then_the_batch_falls_back_to_zero_variance_groups():
    sel = GroupSelection(1, drop_zero_variance=True, max_refills=2)
    chain = [group("g0", slot=0)]
    sel.add(chain[0])
    for k in (1, 2):
        answer(sel, chain[-1], 1.0, 1.0)
        assert sel.refills() == [k]
        chain.append(group(f"g{k}", round_=k))
        sel.add(chain[-1])
    answer(sel, chain[-1], 1.0, 1.0)
    assert sel.refills() == [] and sel.finished()  # round max_refills is not replaced
    assert sel.batch() == [chain[0]]  # the best left: a zero-variance group, in TRL's slot
    m = sel.metrics(set(), now=0.0)
    assert m["farm/groups/refills"] == 2 and m["farm/groups/submitted"] == 3
    assert m["farm/groups/zero_variance_dropped"] == 2 and m["farm/groups/zero_variance_in_batch"] == 1


def test_fallback_prefers_zero_variance_then_fewest_failures_and_never_a_cancelled_rollout():
    sel = GroupSelection(3, drop_zero_variance=True, max_refills=0)
    two, one, zero, gone = group("two", slot=0), group("one", slot=1), group("zero", slot=2), group("gone")
    for g in (two, one, zero, gone):
        sel.add(g)
    answer(sel, gone, 1.0, "cancel")
    answer(sel, two, "fail", "fail")
    answer(sel, one, 0.0, "fail")
    answer(sel, zero, 1.0, 1.0)
    assert sel.finished() and sel.chosen() == [zero, one, two]
    assert sel.batch() == [two, one, zero]
    sel = GroupSelection(1)
    only = group("only", slot=0)
    sel.add(only)
    answer(sel, only, 1.0, "cancel")
    assert sel.finished() and sel.batch() == [only]
    (_, kept), (_, masked) = sel.pairs()
    assert kept.ok and masked.status is Status.failed and masked.error.kind is ErrorKind.cancelled
    assert sel.metrics(set(), now=0.0)["farm/rollouts/cancelled_in_batch"] == 0


def test_a_clean_group_beats_a_failed_one_that_finished_first():
    sel = GroupSelection(1)
    a, x = group("a", slot=0), group("x")
    sel.add(a)
    sel.add(x)
    answer(sel, a, 1.0, "fail")
    assert not sel.finished()  # x may still come back clean
    answer(sel, x, 0.0, 1.0)
    assert sel.batch() == [x]


def test_spare_rows_cycle_in_a_seeded_order_and_cancelled_rows_go_first():
    rows = [{"i": i} for i in range(5)]
    first = [SpareRows(rows, seed=3).take()["i"] for _ in range(1)]
    spares = SpareRows(rows, seed=3)
    epoch = [spares.take()["i"] for _ in range(5)]
    assert sorted(epoch) == list(range(5)) and epoch[:1] == first and epoch != list(range(5))
    assert [SpareRows(rows, seed=3).take()["i"] for _ in range(1)] == first  # seeded: reproducible
    spares.carry([{"i": 9}, {"i": 7}, {"i": 9}])  # the rows of cancelled groups, once each
    assert [spares.take()["i"] for _ in range(2)] == [9, 7]
    nxt = [spares.take()["i"] for _ in range(5)]
    assert sorted(nxt) == list(range(5))  # then the cycle goes on: every row comes round again
    assert extra_groups(8, 1.0) == 0 and extra_groups(8, 1.25) == 2 and extra_groups(3, 1.1) == 1
    with pytest.raises(ValueError):
        extra_groups(8, 0.5)


# -- through the farm ---------------------------------------------------------------------------


def start_worker(settings, concurrency: int = 16):
    proc = spawn_worker(settings, "--agent", "noop", "--concurrency", str(concurrency))
    r = redis.Redis.from_url(settings.redis_url)
    try:
        wait_for(lambda: "noop" in live_workers(r, settings.keys).agents(), timeout=30, what="a live noop worker")
    finally:
        r.close()
    return proc


@pytest.fixture
def noop_worker(settings):
    proc = start_worker(settings)
    yield proc
    stop(proc)


def results_on_stream(settings, run_id: str) -> list[Rollout]:
    r = redis.Redis.from_url(settings.redis_url)
    try:
        return [schema.decode_rollout(f) for _, f in r.xrange(settings.keys.results(run_id))]
    finally:
        r.close()


@pytest.mark.slow
def test_oversampled_step_takes_the_fast_groups_and_cancels_the_slow_ones(settings, noop_worker):
    """TRL's two prompts are slow (5 s a rollout); over-sampled x2, the two fast spare groups win.
    The slow groups are cancelled at once: their `cancelled` rollouts reach the result stream and
    are dropped at the next step; their prompts go first in line for that step's extra groups."""
    from trainer.rollout import FarmRollout

    slow = [trainer_row(i, sleep_s=5, tokens=3, reward=0.0) for i in range(2)]
    fast = [trainer_row(10 + i, tokens=4, reward=float(10 + i)) for i in range(4)]
    rollout = FarmRollout(
        settings,
        tokenizer=CharTokenizer(),
        run_id="over",
        num_generations=2,
        oversample=2.0,
        spare_rows=fast,
        timeout_s=30,
    )
    try:
        t0 = time.perf_counter()
        out = rollout([json.dumps(r) for r in slow for _ in range(2)])
        wall = time.perf_counter() - t0
        batch1 = rollout.batches[-1]
        m = batch1.metrics
        assert wall < 4.0, wall
        assert {k: len(v) for k, v in out.items()} == {k: 4 for k in out}
        taken = [json.loads(p) for p in out["farm_prompt"]]
        assert all(row in fast for row in taken) and taken[0] == taken[1] and taken[2] == taken[3]
        assert out["env_reward"] == [row["noop"]["reward"] for row in taken]  # aligned: the row's own reward
        assert all(len(c) == 4 for c in out["completion_ids"]) and out["farm_status"] == ["ok"] * 4
        assert m["farm/groups/needed"] == 2 and m["farm/groups/submitted"] == 4 and m["farm/groups/cancelled"] == 2
        assert 0.0 < m["farm/groups/cancelled_run_s/max"] < 5.0
        assert m["farm/rollouts/cancelled_in_batch"] == 0 and m["farm/failed"] == 0
        slow_tasks = {t.task_id for g in batch1.groups if g.row in slow for t in g.tasks}
        assert len(slow_tasks) == 4

        def cancelled_back():
            got = [r for r in results_on_stream(settings, "over") if r.task_id in slow_tasks]
            return len(got) == 4 and got

        arrived = wait_for(cancelled_back, timeout=10, what="the slow tasks' cancelled rollouts")
        assert {r.status for r in arrived} == {Status.cancelled}  # stopped mid-sleep, not finished

        # Step 2: TRL's prompts are fast; its extra groups are the slow prompts that lost (first in line).
        out2 = rollout([json.dumps(r) for r in fast[:2] for _ in range(2)])
        batch2 = rollout.batches[-1]
        assert [g.row for g in batch2.groups[2:]] == slow
        reader = rollout.client.reader("over")
        assert slow_tasks <= reader.seen and reader.duplicates >= 4  # the late cancelled rollouts: dropped
        assert all(r.status is Status.ok for r in batch2.rollouts) and out2["farm_status"] == ["ok"] * 4
        assert not {r.task_id for r in batch2.rollouts} & slow_tasks
        assert batch2.metrics["farm/groups/cancelled"] == 2 and batch2.metrics["farm/rollouts/cancelled_in_batch"] == 0
    finally:
        rollout.close()


@pytest.mark.slow
def test_dynamic_sampling_refills_zero_variance_groups_within_the_bound(settings, noop_worker):
    """Every noop group is zero-variance (one reward per row): the step refills max_refills times
    in a chain, then hands TRL a zero-variance group rather than nothing."""
    from trainer.rollout import FarmRollout

    rollout = FarmRollout(
        settings,
        tokenizer=CharTokenizer(),
        run_id="dapo",
        num_generations=2,
        drop_zero_variance_groups=True,
        max_refills=2,
        spare_rows=[trainer_row(20 + i, tokens=2, reward=0.5) for i in range(3)],
        timeout_s=30,
    )
    try:
        given = trainer_row(0, tokens=3, reward=1.0)
        out = rollout([json.dumps(given)] * 2)
        m = rollout.batches[-1].metrics
    finally:
        rollout.close()
    assert m["farm/groups/submitted"] == 3 and m["farm/groups/refills"] == 2
    assert m["farm/groups/zero_variance_dropped"] == 2 and m["farm/groups/zero_variance_in_batch"] == 1
    assert m["farm/groups/cancelled"] == 0
    assert out["env_reward"] == [1.0, 1.0] and out["farm_prompt"] == [json.dumps(given)] * 2  # TRL's own, first


@pytest.mark.slow
def test_eval_steps_take_trl_prompts_as_they_are(settings, noop_worker):
    """A trainer in eval mode gets no oversampling: nothing beyond its prompts is submitted."""
    from types import SimpleNamespace

    from trainer.rollout import FarmRollout

    rollout = FarmRollout(
        settings,
        tokenizer=CharTokenizer(),
        num_generations=2,
        oversample=3.0,
        spare_rows=[trainer_row(9)],
        timeout_s=30,
    )
    trainer = SimpleNamespace(
        model=SimpleNamespace(training=False),
        num_generations=2,
        num_generations_eval=2,
        args=SimpleNamespace(temperature=1.0, top_p=1.0, max_completion_length=8),
    )
    try:
        rollout([json.dumps(trainer_row(0, tokens=2))] * 2, trainer)
        m = rollout.batches[-1].metrics
    finally:
        rollout.close()
    assert m["farm/groups/submitted"] == 1 and m["farm/groups/cancelled"] == 0


@pytest.mark.slow
def test_async_worker_cancels_its_in_flight_tasks_when_stopped(settings, noop_worker):
    """oversample 1.5 on 2 groups keeps 3 in flight; stop() cancels all 6 tasks, mid-rollout."""
    from trainer.async_adapter import FarmRolloutWorker

    worker = FarmRolloutWorker(
        settings,
        [trainer_row(0, tokens=2, sleep_s=20)],
        num_generations=2,
        max_groups_in_flight=2,
        oversample=1.5,
        timeout_s=60,
        run_id="async-stop",
    )
    worker.start()
    time.sleep(1.0)  # submitted and running
    t0 = time.perf_counter()
    worker.stop()
    assert time.perf_counter() - t0 < 5.0
    metrics = []
    while not worker.metrics_queue.empty():
        metrics.append(worker.metrics_queue.get())
    assert {"farm/cancelled_on_stop": 6.0} in metrics
    got = wait_for(
        lambda: len(r := results_on_stream(settings, "async-stop")) == 6 and r, timeout=10, what="6 cancelled"
    )
    assert {r.status for r in got} == {Status.cancelled} and worker.rollout_buffer.empty()


@pytest.mark.slow
def test_async_worker_cancels_a_stale_groups_remaining_tasks_at_once(settings):
    """One slot on the worker: the group's two 1.5 s rollouts run one after the other. The first
    comes back 3 versions behind (max_staleness 1): the second is cancelled then, not waited for,
    and the group is requeued at the current version."""
    from trainer.async_adapter import FarmRolloutWorker

    proc = start_worker(settings, concurrency=1)
    worker = FarmRolloutWorker(
        settings,
        [trainer_row(0, tokens=2, sleep_s=1.5, reward=1.0)],
        num_generations=2,
        max_groups_in_flight=1,
        timeout_s=30,
        max_staleness=1,
        poll_s=0.1,
    )
    try:
        worker.start()
        t0 = time.perf_counter()
        time.sleep(0.5)
        worker.update_model_version(3)
        stale = worker.metrics_queue.get(timeout=10)
        found_after = time.perf_counter() - t0
        samples = [worker.rollout_buffer.get(timeout=20) for _ in range(2)]
    finally:
        worker.stop()
        stop(proc)
    assert stale["farm/stale_requeued"] == 2.0 and stale["farm/staleness"] == 3.0
    assert stale["farm/stale_cancelled"] == 1.0  # the second rollout, queued behind the first
    assert found_after < 2.7, found_after  # at the first rollout (~1.5 s), not after both (~3 s)
    assert all(s.model_version == 3 for s in samples)


@pytest.mark.slow
def test_one_grpo_step_trains_on_the_groups_that_won(settings, noop_worker, model_dir, tmp_path):
    """A real TRL step (a tiny random Llama, one step): TRL's two prompts are slow, the two spare
    groups that win carry rewards 3 and 5 (zero-variance each, so advantages 0; the step still
    runs): TRL's logged reward is theirs, and the farm/groups metrics reach its logs."""
    from transformers import AutoTokenizer

    from trainer.rollout import FarmRollout
    from trainer.train import build_trainer

    slow = [trainer_row(i, sleep_s=5, tokens=3, reward=0.0) for i in range(2)]
    fast = [trainer_row(10 + i, tokens=4, reward=float(r)) for i, r in enumerate((3, 5))]
    cfg = one_step_config(tmp_path, model_dir, slow)
    tok = AutoTokenizer.from_pretrained(model_dir)
    trainer, plain, _ = build_trainer(settings, cfg, model=tiny_model(model_dir), tokenizer=tok)
    plain.close()
    rollout = FarmRollout(
        settings, tokenizer=tok, run_id="grpo-over", num_generations=2, oversample=2.0, spare_rows=fast, timeout_s=30
    )
    trainer.rollout_func = rollout
    try:
        trainer.train()
    finally:
        rollout.close()
    logs = {k: v for entry in trainer.state.log_history for k, v in entry.items()}
    batch = rollout.batches[0]
    assert sorted(json.loads(p)["noop"]["reward"] for p in batch.prompts) == [3.0, 3.0, 5.0, 5.0]
    assert logs["reward"] == pytest.approx(4.0)  # TRL scored the groups that won, not its slow prompts
    assert logs["farm/groups/cancelled"] == 2 and logs["farm/rollouts/cancelled_in_batch"] == 0
