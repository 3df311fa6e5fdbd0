"""The bridge from TRL's GRPOTrainer to the farm: a `rollout_func` that submits Tasks and waits.

TRL 1.16 calls `rollout_func(prompts, trainer)` with the batch's prompts already repeated
`num_generations` times (consecutive repeats form one group) and expects one entry per prompt
in order: `prompt_ids`, `completion_ids`, `logprobs`, plus optional list fields. `env_mask`
becomes TRL's tool mask (multiplied into the loss mask: 1 = sampled by the model, 0 =
inserted by the environment); every other extra field (here `env_reward`, `agent`,
`farm_status`, `policy_version`) is forwarded to the reward functions as a keyword argument.

As in TRL's NeMo Gym example, each dataset prompt is a whole NeMo Gym row serialized as JSON,
so `agent_ref` travels with it and one batch can mix environments: each prompt becomes one
Task on its agent's stream, `group_id` shared by the group, `sample_index` its place in it.

A rollout without token ids (policy_kind chat/responses: `trainable` False, or ok without a
trace) stops training with a ConfigError: it cannot be trained on, and masking every one of
them would train on nothing while looking healthy.

A step may submit more groups than TRL asked for and take the first ones to come back
(`oversample`), and pass over groups whose rewards are all equal, submitting others in their
place (`drop_zero_variance_groups`, `max_refills`): trainer/sampling.py holds that choice, its
bounds and the bias it leaves. The batch is still one entry per prompt TRL gave, group by group;
a TRL group that lost the race keeps its place filled by another group, whose token ids (what
trains), reward, agent and `farm_prompt` (the row it answers, as JSON) come back aligned. What
TRL itself keeps of its `prompts` (the `prompts=` argument of reward functions, other dataset
columns, the completions table) still names the prompt it sampled: a custom reward function
must read `farm_prompt`. Tasks still open when a step ends are cancelled on the farm and their
late rollouts dropped, so a `cancelled` rollout never reaches TRL.

A failed rollout (the worker's `failed` record, or no answer before the deadline) is masked,
never scored 0: one placeholder token with env_mask 0 (nothing reaches the loss), and
`env_reward=None`, which TRL turns into NaN and excludes from the group baseline and the
advantages. Failures are counted per kind in the logged metrics.

A training batch with fewer than `min_usable_groups` groups holding a trainable rollout (all
failed, say) is never returned to TRL, so TRL takes no optimizer step and the trainer syncs no
weights on it: the step's prompts are submitted again, up to `max_unusable_batches` batches, and
then the run stops (UnusableBatches); it stops at once (NoLiveWorker, exit 5) when an agent whose
rollouts failed has no live worker, which no resubmission can mend. Evaluation batches are
returned as they come.

A rollout whose tokens come in several segments (`Rollout.segments`: a harness that edited its
history, workers/gateway) would be several samples, and TRL gives this path one sample per
prompt: it is masked as a failure is (reward None, never 0) and counted as
`farm/multi_segment_masked` (trainer/batch.py's sample_of); the async adapter
(trainer/async_adapter.py) trains segments as samples sharing the rollout's reward. The asyncio
client runs on trainer/loop_thread.py's loop, so its connection persists from step to step.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from typing import Any, AsyncGenerator, Callable, Iterable, Optional, cast

from farm.client import FarmClient
from farm.errors import EXIT_UNKNOWN_AGENT, FarmError, TransportError
from farm.schema import Rollout, Sampling, Task
from farm.settings import Settings
from trainer.batch import Batch, Sample, batch_metrics, sample_of, summary
from trainer.loop_thread import LoopThread
from trainer.sampling import Group, GroupSelection, SpareRows, extra_groups

__all__ = ["FarmRollout", "NoLiveWorker", "UnusableBatches", "env_reward", "parse_row"]

log = logging.getLogger("farm.trainer")


class UnusableBatches(FarmError):
    """Batch after batch had too few trainable rollouts: the run stops rather than train on nothing."""


class NoLiveWorker(FarmError):
    """An agent the data names has no live worker: its tasks would wait for nothing."""

    exit_code = EXIT_UNKNOWN_AGENT


def parse_row(prompt: Any) -> dict:
    """The NeMo Gym row behind one TRL prompt (a JSON string, or the row itself)."""
    try:
        row = json.loads(prompt) if isinstance(prompt, str) else prompt
    except json.JSONDecodeError:
        row = None
    if not isinstance(row, dict) or not isinstance(row.get("agent_ref"), dict) or "name" not in row["agent_ref"]:
        raise ValueError(
            "each prompt must be a NeMo Gym row (JSON) with agent_ref.name; "
            "load the dataset with trainer.train.load_rows and trainer.train.to_dataset"
        )
    return row


class FarmRollout:
    """`rollout_func` for GRPOTrainer: every call is one batch of Tasks through the farm.

    `version` is the policy version the trainer last published (weight sync bumps it);
    `batches` keeps every batch's tasks, rollouts and metrics for tests and benchmarks.
    `oversample`, `drop_zero_variance_groups` and `max_refills` choose the step's groups
    (trainer/sampling.py; training steps only, evaluation takes its prompts as they are);
    `spare_rows` are the rows extra and refill groups come from (the training rows).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        tokenizer,
        run_id: Optional[str] = None,
        timeout_s: float = 600.0,
        num_generations: int = 8,
        sampling: Optional[Sampling] = None,
        keep_batches: int = 100,
        client_factory: Optional[Callable[[Settings], FarmClient]] = None,
        oversample: float = 1.0,
        drop_zero_variance_groups: bool = False,
        max_refills: int = 4,
        spare_rows: Optional[list[dict]] = None,
        spare_seed: int = 0,
        share: float = 1.0,
        max_in_flight: int = 0,
        min_usable_groups: int = 1,
        max_unusable_batches: int = 3,
    ):
        extra_groups(1, oversample)  # checks it
        if min_usable_groups < 1 or max_unusable_batches < 1:
            raise ValueError("min_usable_groups and max_unusable_batches must be >= 1")
        if max_refills < 0:
            raise ValueError("max_refills must be >= 0")
        if (oversample > 1.0 or (drop_zero_variance_groups and max_refills > 0)) and not spare_rows:
            raise ValueError(
                "oversample > 1 and drop_zero_variance_groups submit groups beyond TRL's prompts: "
                "pass spare_rows (the training rows) to draw them from"
            )
        self.settings = settings
        self.tokenizer = tokenizer
        self.run_id = run_id or f"train-{uuid.uuid4().hex[:8]}"
        self.timeout_s = timeout_s
        self.num_generations = num_generations
        self.sampling = sampling or Sampling()
        self.oversample, self.drop_zero_variance_groups, self.max_refills = (
            oversample,
            drop_zero_variance_groups,
            max_refills,
        )
        self.share = share  # of the farm's workers, while other runs have a backlog (farm.fairness)
        self.max_in_flight = max_in_flight  # the run's cap per agent (0: none), whatever its share
        self.spares = SpareRows([parse_row(r) for r in spare_rows], seed=spare_seed) if spare_rows else None
        self.min_usable_groups, self.max_unusable_batches = min_usable_groups, max_unusable_batches
        self.unusable_batches = 0  # batches not trained on, over the run
        self.step = 0  # the optimizer step being generated for (TRL's global_step + 1)
        self.version = 0
        self.batches: list[Batch] = []
        self.keep_batches = keep_batches
        self._calls = 0
        self._loop = LoopThread()
        factory = client_factory or FarmClient
        self.client: FarmClient = self._loop.run(self._make(factory))
        self.__name__ = "farm_rollout"

    async def _make(self, factory):
        return factory(self.settings)

    # -- TRL entry point -------------------------------------------------------------------
    def __call__(self, prompts: list, trainer=None) -> dict[str, list]:
        num_generations, sampling, training = self.num_generations, self.sampling, True
        if trainer is not None:
            training = getattr(getattr(trainer, "model", None), "training", True)
            num_generations = trainer.num_generations if training else trainer.num_generations_eval
            state = getattr(trainer, "state", None)
            self.step = state.global_step + 1 if state is not None else self.step
            args = trainer.args
            sampling = Sampling(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_completion_length)
        batch = self.generate(prompts, num_generations, sampling, select=training)
        if trainer is not None and hasattr(trainer, "_log_metric"):
            for name, value in batch.metrics.items():
                trainer._log_metric(name, value)
        return {
            "prompt_ids": [s.prompt_ids for s in batch.samples],
            "completion_ids": [s.completion_ids for s in batch.samples],
            "logprobs": [s.logprobs for s in batch.samples],
            "env_mask": [s.env_mask for s in batch.samples],
            "env_reward": [s.reward for s in batch.samples],
            "agent": [s.agent for s in batch.samples],
            "farm_status": [s.status for s in batch.samples],
            "policy_version": [s.policy_version for s in batch.samples],
            "farm_prompt": batch.prompts,
        }

    # -- the farm side -----------------------------------------------------------------------
    def _groups_of(self, prompts: list, num_generations: int) -> list[tuple[Any, dict]]:
        """(prompt, row) of each group of TRL's prompts, checked to be whole groups of one prompt."""
        rows = [parse_row(p) for p in prompts]
        if len(rows) % num_generations:
            raise ValueError(f"{len(rows)} prompts is not a whole number of groups of {num_generations}")
        out = []
        for g in range(len(rows) // num_generations):
            group = rows[g * num_generations : (g + 1) * num_generations]
            if any(r != group[0] for r in group[1:]):
                raise ValueError(
                    f"group {g}: the {num_generations} consecutive prompts of a group differ; "
                    "TRL repeats each prompt num_generations times in a row"
                )
            out.append((prompts[g * num_generations], group[0]))
        return out

    def _group(self, row: dict, group_id: str, num_generations: int, sampling: Sampling, **kw: Any) -> Group:
        ref = row["agent_ref"]
        tasks = [
            self.client.task(
                run_id=self.run_id,
                agent=ref["name"],
                agent_type=ref.get("type", "responses_api_agents"),
                row=row,
                group_id=group_id,
                sample_index=i,
                sampling=sampling,
                policy_version=self.version,
                timeout_s=self.timeout_s,
            )
            for i in range(num_generations)
        ]
        return Group(group_id, row, tasks, submitted_at=time.monotonic(), **kw)

    def _selection(
        self, prompts: list, num_generations: int, sampling: Sampling, select: bool
    ) -> tuple[GroupSelection, Callable[[int], Group]]:
        """TRL's groups (each in its slot), plus the extra groups when over-sampling."""
        given = self._groups_of(prompts, num_generations)
        call = self._calls
        self._calls += 1
        sel = GroupSelection(
            len(given),
            drop_zero_variance=select and self.drop_zero_variance_groups,
            max_refills=self.max_refills,
        )
        for g, (prompt, row) in enumerate(given):
            sel.add(self._group(row, f"{self.run_id}-{call}-{g}", num_generations, sampling, slot=g, prompt=prompt))

        def spawn(round_: int) -> Group:
            """A group on the next spare row (an extra one at round 0, else a refill), added to `sel`."""
            assert self.spares is not None  # checked in __init__
            group_id = f"{self.run_id}-{call}-{len(sel.groups)}"
            group = self._group(self.spares.take(), group_id, num_generations, sampling, round=round_)
            sel.add(group)
            return group

        if select:
            for _ in range(extra_groups(len(given), self.oversample)):
                spawn(0)
        return sel, spawn

    def tasks_for(self, prompts: list, num_generations: int, sampling: Sampling) -> list[Task]:
        """The Tasks of TRL's groups, as one step submits them (without extra groups)."""
        sel, _ = self._selection(prompts, num_generations, sampling, False)
        return [t for g in sel.groups for t in g.tasks]

    def generate(
        self,
        prompts: list,
        num_generations: Optional[int] = None,
        sampling: Optional[Sampling] = None,
        *,
        select: bool = True,
    ) -> Batch:
        """One step's batch. `select` False (evaluation) takes TRL's groups only, as they come.

        A training batch with fewer than `min_usable_groups` groups holding a trainable rollout is
        never handed to TRL (no optimizer step, no weight sync on it): the prompts are submitted
        again, and the run stops after `max_unusable_batches` such batches in a row, or at once when
        an agent of the failed groups has no live worker left."""
        n, sampling = num_generations or self.num_generations, sampling or self.sampling
        for attempt in range(1, self.max_unusable_batches + 1):
            batch = self._generate_once(prompts, n, sampling, select)
            usable_groups = sum(
                any(s.reward is not None for s in batch.samples[i : i + n]) for i in range(0, len(batch.samples), n)
            )
            batch.metrics["farm/usable_groups"] = float(usable_groups)
            batch.metrics["farm/unusable_batches"] = float(attempt - 1)
            if not select or usable_groups >= self.min_usable_groups:
                return batch
            self.unusable_batches += 1
            why = (
                f"step {self.step}: {usable_groups} of {len(batch.samples) // n} groups have a trainable rollout "
                f"(min_usable_groups {self.min_usable_groups}; {summary(batch.metrics)})"
            )
            self._stop_without_workers(batch, why)
            if attempt < self.max_unusable_batches:
                log.warning(
                    "%s: not trained on; submitting the step's prompts again (%d of %d)",
                    why,
                    attempt,
                    self.max_unusable_batches,
                )
        raise UnusableBatches(
            f"{why}; {self.max_unusable_batches} batches in a row were unusable, none trained on: stopping "
            "(max_unusable_batches)"
        )

    def _stop_without_workers(self, batch: Batch, why: str) -> None:
        """An agent whose tasks failed has no live worker: no retry can help, stop now (exit 5)."""
        failed = {s.agent for s in batch.samples if s.reward is None}
        try:
            live = self._loop.run(self.client.live_agents())
        except TransportError:
            return
        missing = sorted(failed - live)
        if missing:
            raise NoLiveWorker(
                f"{why}: no live worker for agent {', '.join(missing)}: start `farm worker --agent {missing[0]}` "
                "(or run `farm train --embedded`)"
            )

    def _generate_once(self, prompts: list, num_generations: int, sampling: Sampling, select: bool) -> Batch:
        sel, spawn = self._selection(prompts, num_generations, sampling, select)
        t0 = time.perf_counter()
        open_ids, cancelled_ids, cancelled_at = self._loop.run(self._collect(sel, spawn))
        wall = time.perf_counter() - t0
        chosen = sel.batch()
        pairs = sel.pairs(chosen)
        tasks, rollouts = [t for t, _ in pairs], [r for _, r in pairs]
        samples = [self.sample(t, r) for t, r in pairs]
        metrics = batch_metrics(tasks, rollouts, samples, self.version, wall)
        metrics.update(sel.metrics(cancelled_ids, cancelled_at, chosen))
        if select and self.spares is not None:  # the prompts that lost the race go first next time
            taken = {id(g) for g in chosen}
            lost = [g for g in sel.groups if id(g) not in taken and any(t.task_id in open_ids for t in g.tasks)]
            self.spares.carry(g.row for g in lost)
        prompts_used = [json.dumps(g.row) if g.prompt is None else g.prompt for g in chosen for _ in g.tasks]
        batch = Batch(tasks, rollouts, samples, metrics, prompts_used, sel.groups)
        self.batches = (self.batches + [batch])[-self.keep_batches :]
        log.info("rollouts v%d: %s", self.version, summary(metrics))
        return batch

    async def _collect(self, sel: GroupSelection, spawn: Callable[[int], Group]) -> tuple[set[str], set[str], float]:
        """Submit, stream rollouts into the selection (submitting refills) until it is finished or
        the deadline passes, then cancel what is still open."""
        deadline = time.time() + self.timeout_s
        await self._submit(t for g in sel.groups for t in g.tasks)
        while not sel.finished():
            new = await self._stream(sel, spawn, deadline)
            if not new:
                break
            await self._submit(t for g in new for t in g.tasks)
        return await self._cancel_open(sel)

    async def _submit(self, tasks: Iterable[Task]) -> None:
        await self.client.submit(tasks, share=self.share, max_in_flight=self.max_in_flight)

    async def _stream(self, sel: GroupSelection, spawn: Callable[[int], Group], deadline: float) -> list[Group]:
        """Offer rollouts as they arrive; returns the refill groups as soon as some are due
        (the caller submits them and streams again), or [] once finished or at the deadline."""
        stream = cast(AsyncGenerator[Rollout, None], self.client.results(sel.pending_tasks(), deadline=deadline))
        async with contextlib.aclosing(stream):
            async for rollout in stream:
                if sel.offer(rollout) is None:
                    continue
                rounds = sel.refills() if time.time() < deadline else []
                if rounds:
                    return [spawn(r) for r in rounds]
                if sel.finished():
                    break
        return []

    async def _cancel_open(self, sel: GroupSelection) -> tuple[set[str], set[str], float]:
        """Stop waiting for the tasks still open and cancel them on the farm: (open, cancelled, when)."""
        now = time.monotonic()
        open_tasks = [t for g in sel.groups for t in g.open_tasks()]
        if not open_tasks:
            return set(), set(), now
        reader = self.client.reader(self.run_id)
        for t in open_tasks:
            reader.drop(t.task_id)  # a late rollout of theirs is dropped as a duplicate
        open_ids = {t.task_id for t in open_tasks}
        try:
            report = await self.client.cancel(open_tasks)
        except TransportError as exc:
            log.warning("could not cancel %d open tasks (%s); their late rollouts are dropped", len(open_tasks), exc)
            return open_ids, set(), now
        return open_ids, set(report.open), now

    def sample(self, task: Task, rollout: Rollout) -> Sample:
        return sample_of(task, rollout, self.tokenizer)

    def cancel_run(self) -> str:
        """Cancel every task of this run still queued or running (an interrupted run); one line saying what."""
        try:
            return self._loop.run(self.client.cancel_run(self.run_id)).line()
        except TransportError as exc:
            return f"could not cancel run {self.run_id}: {exc}"

    def close(self) -> None:
        try:
            self._loop.run(self.client.aclose())
        finally:
            self._loop.stop()


def env_reward(completions: list, env_reward: Optional[list] = None, **_: Any) -> list[Optional[float]]:
    """The reward function for GRPOTrainer: the environment's verdict; None for failed rollouts."""
    if env_reward is None:
        raise ValueError("no env_reward: the trainer must use trainer.rollout.FarmRollout as rollout_func")
    return [None if r is None else float(r) for r in env_reward]
