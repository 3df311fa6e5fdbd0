"""The bridge from TRL's GRPOTrainer to the farm: a `rollout_func` that submits Tasks and waits.

TRL 1.16 calls `rollout_func(prompts, trainer)` with the batch's prompts repeated `num_generations`
times (consecutive repeats form one group) and expects one entry per prompt in order: `prompt_ids`,
`completion_ids`, `logprobs`, plus optional list fields. `env_mask` becomes TRL's tool mask (1 =
sampled by the model, 0 = inserted by the environment); the other extra fields (`env_reward`,
`agent`, `farm_status`, `policy_version`) reach the reward functions as keyword arguments. As in
TRL's NeMo Gym example, each prompt is a whole NeMo Gym row as JSON, so `agent_ref` travels with it
and one batch can mix environments. A rollout without token ids (policy_kind chat/responses) stops
training with a ConfigError rather than being masked into a batch that trains on nothing.

A step may submit more groups than TRL asked for and take the first ones back (`oversample`), and
pass over groups whose rewards are all equal (`drop_zero_variance_groups`, `max_refills`):
trainer/sampling.py holds that choice and the bias it leaves. The batch is still one entry per
prompt TRL gave; a TRL group that lost the race has its place filled by another group, whose
`farm_prompt` (the row it answers) comes back aligned: a custom reward function must read it.
Tasks still open when a step ends are cancelled, their late rollouts dropped, so a `cancelled`
rollout never reaches TRL; with `partial_rollouts` they are interrupted instead and the next step
resumes their groups from their last token (trainer/partial.py).

A failed rollout (the worker's `failed` record, or no answer before the deadline) is masked, never
scored 0: one placeholder token with env_mask 0 and `env_reward=None`, which TRL excludes from the
group baseline. A training batch with fewer than `min_usable_groups` groups holding a trainable
rollout is never returned to TRL (no optimizer step, no weight sync): the prompts are submitted
again, up to `max_unusable_batches` batches, then the run stops (UnusableBatches); at once
(NoLiveWorker, exit 5) when an agent whose rollouts failed has no live worker. A rollout in several
token segments (a harness that edited its history) is masked here and counted as
`farm/multi_segment_masked`; the async adapter trains segments as samples. The client runs on
trainer/loop_thread.py's loop; `close()` sets the run's result stream to expire (`results_ttl_s`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from typing import Any, AsyncGenerator, Callable, Iterable, Optional, cast

import msgspec
from redis.exceptions import RedisError

from farm.client import FarmClient
from farm.errors import EXIT_UNKNOWN_AGENT, FarmError, TransportError
from farm.schema import Rollout, Sampling, Task
from farm.settings import Settings
from trainer.batch import Batch, Sample, batch_metrics, parse_row, sample_of, summary, trl_groups
from trainer.loop_thread import LoopThread
from trainer.partial import Carried, carry, interrupt_open, mask_stale, resumed_group, step_tokens
from trainer.sampling import Group, GroupSelection, SpareRows, extra_groups

__all__ = ["FarmRollout", "NoLiveWorker", "UnusableBatches", "env_reward", "parse_row"]

log = logging.getLogger("farm.trainer")
INTERRUPT_WAIT_S = 10.0  # how long a step waits for the rollouts of the tasks it interrupted


class UnusableBatches(FarmError):
    """Batch after batch had too few trainable rollouts: the run stops rather than train on nothing."""


class NoLiveWorker(FarmError):
    """An agent the data names has no live worker: its tasks would wait for nothing."""

    exit_code = EXIT_UNKNOWN_AGENT


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
        partial_rollouts: bool = False,
        mask_stale_tokens: Optional[int] = None,
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
        self.settings, self.tokenizer = settings, tokenizer
        self.run_id = run_id or f"train-{uuid.uuid4().hex[:8]}"
        self.timeout_s, self.num_generations = timeout_s, num_generations
        self.sampling, self.oversample, self.max_refills = sampling or Sampling(), oversample, max_refills
        self.drop_zero_variance_groups = drop_zero_variance_groups
        self.share = share  # of the farm's workers, while other runs have a backlog (farm.fairness)
        self.max_in_flight = max_in_flight  # the run's cap per agent (0: none), whatever its share
        self.spares = SpareRows([parse_row(r) for r in spare_rows], seed=spare_seed) if spare_rows else None
        self.min_usable_groups, self.max_unusable_batches = min_usable_groups, max_unusable_batches
        self.unusable_batches = 0  # batches not trained on, over the run
        # Over-sampling interrupts the groups it does not take, and the next step resumes them
        # (trainer/partial.py); tokens more than `mask_stale_tokens` versions old are masked.
        self.partial_rollouts, self.mask_stale_tokens = partial_rollouts, mask_stale_tokens
        self.carried: list[Carried] = []
        self._late: dict[str, Rollout] = {}
        self._offered_again: set[str] = set()  # a carried group's finished rollouts, received a step before
        self.step, self.version = 0, 0  # the step being generated for (TRL's global_step + 1), its policy
        self.batches: list[Batch] = []
        self.keep_batches, self._calls = keep_batches, 0
        self._loop = LoopThread()
        self.client: FarmClient = self._loop.run(self._make(client_factory or FarmClient))
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
        given = trl_groups(prompts, num_generations)
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
            extra = extra_groups(len(given), self.oversample)
            for c in self.carried if self.partial_rollouts else []:
                group, done = resumed_group(c, self.client.keys, self.settings.max_entry_bytes, self._fresh)
                sel.add(group)
                for rollout in done:
                    sel.offer(rollout)
                    self._offered_again.add(rollout.task_id)
            extra -= len(self.carried) if self.partial_rollouts else 0
            self.carried = []
            for _ in range(max(0, extra)):
                spawn(0)
        return sel, spawn

    def _fresh(self, task: Task) -> Task:
        """A sample that came back with nothing, submitted again as a new task."""
        return msgspec.structs.replace(task, task_id=uuid.uuid4().hex, created_at=time.time(), attempt=1, history=[])

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
        taken = {id(g) for g in chosen}
        lost = [g for g in sel.groups if id(g) not in taken and any(t.task_id in open_ids for t in g.tasks)]
        if select and self.partial_rollouts:  # the groups that lost the race go on next step
            self.carried = carry(lost, self._late)
            lost = [g for g in lost if not any(c.group_id == g.group_id for c in self.carried)]
        if select and self.spares is not None:  # the prompts that lost the race go first next time
            self.spares.carry(g.row for g in lost)
        if self.partial_rollouts or self.mask_stale_tokens is not None:
            metrics.update(self._token_figures(sel, pairs, samples))
        self._late = {}
        prompts_used = [json.dumps(g.row) if g.prompt is None else g.prompt for g in chosen for _ in g.tasks]
        batch = Batch(tasks, rollouts, samples, metrics, prompts_used, sel.groups)
        self.batches = (self.batches + [batch])[-self.keep_batches :]
        log.info("rollouts v%d: %s", self.version, summary(metrics))
        return batch

    async def _collect(self, sel: GroupSelection, spawn: Callable[[int], Group]) -> tuple[set[str], set[str], float]:
        """Submit, stream rollouts into the selection (submitting refills) until it is finished or
        the deadline passes, then cancel what is still open."""
        deadline = time.time() + self.timeout_s
        await self._submit(t for g in sel.groups for t in g.tasks if t.task_id not in g.rollouts)
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
        open_ids = {t.task_id for t in open_tasks}
        if self.partial_rollouts:
            return open_ids, await self._interrupt_open(open_tasks), now
        reader = self.client.reader(self.run_id)
        for t in open_tasks:
            reader.drop(t.task_id)  # a late rollout of theirs is dropped as a duplicate
        try:
            report = await self.client.cancel(open_tasks)
        except TransportError as exc:
            log.warning("could not cancel %d open tasks (%s); their late rollouts are dropped", len(open_tasks), exc)
            return open_ids, set(), now
        return open_ids, set(report.open), now

    async def _interrupt_open(self, open_tasks: list[Task]) -> set[str]:
        opened, self._late = await interrupt_open(self.client, self.run_id, open_tasks, INTERRUPT_WAIT_S)
        return opened

    def _token_figures(self, sel: GroupSelection, pairs: list, samples: list) -> dict[str, float]:
        seen, self._offered_again = self._offered_again, set()
        return step_tokens(sel, pairs, samples, self._late, self.carried, self.version, seen)

    def sample(self, task: Task, rollout: Rollout) -> Sample:
        sample = sample_of(task, rollout, self.tokenizer)
        if self.mask_stale_tokens is not None and sample.reward is not None:
            sample.stale_masked = mask_stale(sample.env_mask, rollout, self.version - self.mask_stale_tokens)
        return sample

    def cancel_run(self) -> str:
        """Cancel every task of this run still queued or running (an interrupted run); one line saying what."""
        try:
            return self._loop.run(self.client.cancel_run(self.run_id)).line()
        except TransportError as exc:
            return f"could not cancel run {self.run_id}: {exc}"

    def close(self, results_ttl_s: Optional[float] = 3600.0) -> None:
        """Close the client; the run's result stream (late rollouts) expires `results_ttl_s` later."""
        key = self.client.keys.results(self.run_id)
        try:
            if results_ttl_s is not None:
                self._loop.run(self.client.r.expire(key, max(1, int(results_ttl_s))))
        except (RedisError, OSError) as exc:
            log.warning("could not set the expiry of %s (%s): it stays until deleted", key, exc)
        try:
            self._loop.run(self.client.aclose())
        finally:
            self._loop.stop()


def env_reward(completions: list, env_reward: Optional[list] = None, **_: Any) -> list[Optional[float]]:
    """The reward function for GRPOTrainer: the environment's verdict; None for failed rollouts."""
    if env_reward is None:
        raise ValueError("no env_reward: the trainer must use trainer.rollout.FarmRollout as rollout_func")
    return [None if r is None else float(r) for r in env_reward]
