"""The farm as a rollout worker for TRL's AsyncGRPOTrainer (`trl.experimental.async_grpo`).

AsyncGRPOTrainer trains on whatever sits in `rollout_worker.rollout_buffer` while rollouts
keep being produced; its `rollout_worker=` accepts any object implementing
`RolloutWorkerProtocol` (rollout_buffer, metrics_queue, start, stop, update_model_version,
check_health). FarmRolloutWorker implements it over the farm: a thread with its own event
loop keeps `max_groups_in_flight` groups of Tasks submitted, and as each group's rollouts come
back it scores the group (GRPO advantage over the rollouts that succeeded) and pushes one
`RolloutSample` per successful rollout. Failed rollouts carry no gradient and are dropped
from the buffer, but counted per kind in metrics_queue, never scored 0. A rollout whose tokens
come in several segments (`Rollout.segments`: a harness that edited its history,
workers/gateway) gives one sample per segment, `trace` first, each with the rollout's advantage
(advantages are per rollout, one reward each), so it weighs as that many samples;
`farm/extra_segments` counts the samples beyond one per rollout. The synchronous rollout_func
path, which TRL gives one sample per prompt, masks and counts such rollouts (trainer/rollout.py).

Every Task carries the model version the trainer last announced through
update_model_version; each sample is tagged with the version its rollout's generation started
on (the oldest weights that produced any of its tokens; see farm/policy_version.py), which is
what the trainer's staleness filter compares against. `max_staleness` bounds it here already:
a group in which any rollout started more than `max_staleness` versions behind the current one
is re-queued at the current version (`on_stale="requeue"`, at most `max_requeues` times, then
dropped) or dropped (`on_stale="drop"`); both are counted in metrics_queue
(`farm/stale_requeued`, `farm/stale_dropped`), and nothing stale reaches rollout_buffer. A group
is known stale as soon as one rollout that came back is (versions only move forward): its
other tasks are cancelled on the farm then, not waited for (`farm/stale_cancelled` counts
those still queued or running), as prime-rl does.

`drop_zero_variance_groups` (DAPO's dynamic sampling) drops a group whose successful rollouts
all have one reward (every advantage 0), counted as `farm/groups/zero_variance_dropped`; the
row cycle simply goes on, so no refill bound is needed. `oversample` keeps
ceil(max_groups_in_flight * oversample) groups submitted: this path already takes each group as
it completes, so oversampling only adds groups in flight, and nothing is cancelled for being
slow (trainer/sampling.py is the synchronous path's choice). `stop()` (which TRL calls however
training ends, Ctrl-C included) cancels the whole run (`cancel_run`: every task still queued or
running), so workers stop generating for a trainer that is gone (`farm/cancelled_on_stop`).

Weight sync itself stays with the trainer's WeightTransferProtocol (NCCL to TRL's vLLM server
on a GPU, or a trainer.weights.VllmReload wrapped as one).

Samples follow AsyncRolloutWorker's layout: input_ids = prompt + completion,
completion_mask 0 on the prompt and on environment tokens, old_log_probs zero-filled there.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
import uuid
from collections import Counter
from typing import AsyncGenerator, AsyncIterator, Iterable, Optional, cast

import numpy as np

from farm.client import FarmClient
from farm.errors import TransportError
from farm.schema import Rollout, Sampling, Task
from farm.settings import Settings
from farm.tasks import cancel_and_wait
from trainer.batch import check_sampling
from trainer.sampling import client_deadline, extra_groups, usable, zero_variance

__all__ = [
    "FarmRolloutWorker",
    "group_samples",
]

log = logging.getLogger("farm.trainer.async")


def _sample_class():
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    return RolloutSample


def group_samples(tasks: list[Task], rollouts: list[Rollout], group_id: int) -> tuple[list, dict[str, float]]:
    """RolloutSamples for one group's successful rollouts (one per token segment), and the group's metrics."""
    RolloutSample = _sample_class()
    good = [
        (t, r)
        for t, r in zip(tasks, rollouts)
        if r.ok and r.reward is not None and r.trace is not None and r.trace.completion_ids
    ]
    failed = Counter(r.error.kind if r.error else "unscorable" for r in rollouts if not any(r is g for _, g in good))
    metrics: dict[str, float] = {"farm/rollouts": float(len(rollouts)), "farm/failed": float(sum(failed.values()))}
    metrics.update({f"farm/failed/{k}": float(n) for k, n in failed.items()})
    if not good:
        return [], metrics
    for task, r in good:
        check_sampling(task, r)
    rewards = np.array([r.reward for _, r in good], dtype=float)
    advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-8)
    metrics.update({"farm/reward": float(rewards.mean()), "farm/reward_std": float(rewards.std())})
    samples = []
    for (task, r), adv in zip(good, advantages):
        # A segment without completion tokens has nothing to train (the gateway sends none such).
        for trace in [r.trace, *(s for s in r.segments if s.completion_ids)]:
            prompt, completion = list(trace.prompt()), list(trace.completion())
            samples.append(
                RolloutSample(
                    prompt=task.row.get("responses_create_params", {}).get("input", []),
                    completion=r.output,
                    input_ids=np.asarray(prompt + completion, dtype=np.int64),
                    completion_mask=np.asarray([0] * len(prompt) + trace.mask(), dtype=np.int64),
                    old_log_probs=np.asarray([0.0] * len(prompt) + list(trace.completion_logprobs()), dtype=np.float32),
                    advantage=float(adv),
                    model_version=r.policy_version,
                    group_id=group_id,
                    metrics={"reward": float(r.reward), f"farm/reward/{task.agent_ref.name}": float(r.reward)},
                    enqueued_at=time.time(),
                )
            )
    metrics["farm/extra_segments"] = float(len(samples) - len(good))
    return samples, metrics


async def _next(stream: AsyncIterator[Rollout]) -> Rollout:
    return await stream.__anext__()


class FarmRolloutWorker:
    """RolloutWorkerProtocol over the farm (rows cycle forever, num_generations Tasks per row)."""

    def __init__(
        self,
        settings: Settings,
        rows: list[dict],
        *,
        num_generations: int = 8,
        max_groups_in_flight: int = 4,
        timeout_s: float = 600.0,
        sampling: Optional[Sampling] = None,
        queue_maxsize: int = 1024,
        run_id: Optional[str] = None,
        max_staleness: Optional[int] = None,
        on_stale: str = "requeue",
        max_requeues: int = 2,
        drop_zero_variance_groups: bool = False,
        oversample: float = 1.0,
        poll_s: float = 0.25,
        share: float = 1.0,
        max_in_flight: int = 0,
    ):
        if not rows:
            raise ValueError("FarmRolloutWorker needs at least one row")
        if on_stale not in ("requeue", "drop"):
            raise ValueError(f"on_stale must be 'requeue' or 'drop', got {on_stale!r}")
        if max_staleness is not None and max_staleness < 0:
            raise ValueError("max_staleness must be >= 0")
        self.max_staleness, self.on_stale, self.max_requeues = max_staleness, on_stale, max_requeues
        self.settings, self.rows = settings, rows
        self.num_generations, self.max_groups_in_flight = num_generations, max_groups_in_flight
        self.groups_in_flight = max_groups_in_flight + extra_groups(max_groups_in_flight, oversample)
        self.drop_zero_variance_groups = drop_zero_variance_groups
        self.share = share  # of the farm's workers, while other runs have a backlog (farm.fairness)
        self.max_in_flight = max_in_flight  # the run's cap per agent (0: none), whatever its share
        self.poll_s = poll_s  # how often a group in flight is checked for staleness between arrivals
        self.timeout_s, self.sampling = timeout_s, sampling or Sampling()
        self.run_id = run_id or f"async-{uuid.uuid4().hex[:8]}"
        self.rollout_buffer: queue.Queue = queue.Queue(maxsize=queue_maxsize)
        self.metrics_queue: queue.Queue = queue.Queue()
        self.model_version = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self._heartbeat = 0.0
        self._groups = itertools.count()
        self._open: dict[str, Task] = {}  # submitted, no rollout back yet: cancelled on stop

    # -- RolloutWorkerProtocol -----------------------------------------------------------------
    def start(self) -> None:
        self._heartbeat = time.time()
        self._thread = threading.Thread(target=self._run, name="farm-async-rollouts", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 10)

    def update_model_version(self, model_version: int) -> None:
        self.model_version = int(model_version)

    def check_health(self, stale_after_s: float) -> None:
        if self._error is not None:
            raise RuntimeError(
                f"farm rollout worker failed: {type(self._error).__name__}: {self._error}"
            ) from self._error
        if self._thread is None:
            raise RuntimeError("farm rollout worker was not started")
        if not self._thread.is_alive() and not self._stop.is_set():
            raise RuntimeError("farm rollout worker thread exited")
        age = time.time() - self._heartbeat
        if age > stale_after_s:
            raise RuntimeError(f"farm rollout worker heartbeat stale: {age:.0f}s > {stale_after_s:.0f}s")

    # -- the loop --------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # surfaced through check_health
            self._error = exc
            log.exception("farm rollout worker crashed")

    async def _main(self) -> None:
        client = FarmClient(self.settings)
        rows = itertools.cycle(self.rows)
        in_flight: set[asyncio.Task] = set()
        try:
            while not self._stop.is_set():
                while len(in_flight) < self.groups_in_flight:
                    in_flight.add(asyncio.create_task(self._group(client, next(rows))))
                done, in_flight = await asyncio.wait(in_flight, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
                self._heartbeat = time.time()
                for d in done:
                    d.result()
        finally:
            await cancel_and_wait(in_flight)
            stopped = await self._cancel_run(client)
            if stopped:
                self.metrics_queue.put({"farm/cancelled_on_stop": float(stopped)})
            await client.aclose()

    async def _cancel_run(self, client: FarmClient) -> int:
        """Cancel every task of the run still queued or running (those of a submit cut short by the stop
        too); how many there were."""
        reader = client.reader(self.run_id)
        for task_id in self._open:
            reader.drop(task_id)
        self._open.clear()
        try:
            return (await client.cancel_run(self.run_id)).open_count
        except TransportError as exc:
            log.warning("could not cancel run %s (%s); its late rollouts are dropped", self.run_id, exc)
            return 0

    def _staleness(self, rollouts: Iterable[Rollout]) -> int:
        """How many versions behind the current one the group's oldest generation started."""
        return max((self.model_version - r.policy_version for r in rollouts), default=0)

    async def _group(self, client: FarmClient, row: dict) -> None:
        group = next(self._groups)
        for requeues in itertools.count():
            tasks, rollouts, cancelled = await self._run_group(client, row, group)
            staleness = self._staleness(rollouts)
            if self.max_staleness is None or staleness <= self.max_staleness:
                break
            stale = {"farm/staleness": float(staleness), "farm/stale_cancelled": float(cancelled)}
            if self.on_stale == "drop" or requeues >= self.max_requeues:
                self.metrics_queue.put({"farm/stale_dropped": float(len(tasks)), **stale})
                return
            self.metrics_queue.put({"farm/stale_requeued": float(len(tasks)), **stale})
        samples, metrics = group_samples(tasks, rollouts, group)
        metrics["farm/staleness"] = float(staleness)
        if self.drop_zero_variance_groups and zero_variance(float(r.reward or 0.0) for r in rollouts if usable(r)):
            metrics["farm/groups/zero_variance_dropped"] = 1.0
            samples = []
        self.metrics_queue.put(metrics)
        for s in samples:
            while not self._stop.is_set():
                try:
                    self.rollout_buffer.put(s, timeout=0.5)
                    break
                except queue.Full:
                    self._heartbeat = time.time()  # backpressure is not a hang
                    await asyncio.sleep(0)

    async def _run_group(self, client: FarmClient, row: dict, group: int) -> tuple[list[Task], list[Rollout], int]:
        """One group's Tasks at the current version; the rollouts that came back, in task order (all
        of them unless the group was found stale first); how many open tasks were then cancelled."""
        ref = row["agent_ref"]
        tasks = [
            client.task(
                run_id=self.run_id,
                agent=ref["name"],
                row=row,
                group_id=f"{self.run_id}-{group}",
                sample_index=i,
                sampling=self.sampling,
                policy_version=self.model_version,
                timeout_s=self.timeout_s,
            )
            for i in range(self.num_generations)
        ]
        self._open.update((t.task_id, t) for t in tasks)
        await client.submit(tasks, share=self.share, max_in_flight=self.max_in_flight)
        got = await self._gather(client, tasks)
        left = [t for t in tasks if t.task_id not in got or client_deadline(got[t.task_id])]
        cancelled = await self._cancel(client, left) if left else 0
        return tasks, [got[t.task_id] for t in tasks if t.task_id in got], cancelled

    async def _gather(self, client: FarmClient, tasks: list[Task]) -> dict[str, Rollout]:
        """The group's rollouts as they arrive, until all are in (or the deadline's stand-ins) or,
        with max_staleness, one that came back is stale past it (checked every poll_s too, as the
        trainer's version moves on)."""
        got: dict[str, Rollout] = {}
        stream = cast(AsyncGenerator[Rollout, None], client.results(tasks, timeout_s=self.timeout_s))
        poll = self.poll_s if self.max_staleness is not None else None
        nxt: Optional[asyncio.Task] = None
        try:
            while len(got) < len(tasks):
                nxt = nxt or asyncio.create_task(_next(stream))
                done, _ = await asyncio.wait({nxt}, timeout=poll)
                if nxt in done:
                    rollout = nxt.result()
                    nxt = None
                    got[rollout.task_id] = rollout
                    self._open.pop(rollout.task_id, None)
                if self.max_staleness is not None and self._staleness(got.values()) > self.max_staleness:
                    break
        finally:
            if nxt is not None:
                await cancel_and_wait([nxt])
            await stream.aclose()
        return got

    async def _cancel(self, client: FarmClient, tasks: list[Task]) -> int:
        """Stop waiting for `tasks` and cancel them on the farm; how many were still queued or running."""
        reader = client.reader(self.run_id)
        for t in tasks:
            reader.drop(t.task_id)  # a late rollout of theirs is dropped as a duplicate
            self._open.pop(t.task_id, None)
        try:
            report = await client.cancel(tasks)
        except TransportError as exc:
            log.warning("could not cancel %d tasks (%s); their late rollouts are dropped", len(tasks), exc)
            return 0
        return len(report.open)
