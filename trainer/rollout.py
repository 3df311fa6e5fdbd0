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

A failed rollout (the worker's `failed` record, or no answer before the deadline) is masked,
never scored 0: one placeholder token with env_mask 0 (nothing reaches the loss), and
`env_reward=None`, which TRL turns into NaN and excludes from the group baseline and the
advantages. Failures are counted per kind in the logged metrics.

The farm client is asyncio; TRL is not. The client lives on one event loop in a daemon
thread for the life of the trainer, so its Redis connection and result reader persist from
step to step.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from farm.client import FarmClient
from farm.errors import ConfigError
from farm.schema import Rollout, Sampling, Task
from farm.settings import Settings

log = logging.getLogger("farm.trainer")


class _LoopThread:
    """One asyncio loop in a daemon thread; `run(coro)` blocks until the coroutine finishes."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="farm-rollout-loop", daemon=True)
        self.thread.start()

    def run(self, coro) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


def parse_row(prompt: Any) -> dict:
    """The NeMo Gym row behind one TRL prompt (a JSON string, or the row itself)."""
    try:
        row = json.loads(prompt) if isinstance(prompt, str) else prompt
    except json.JSONDecodeError:
        row = None
    if not isinstance(row, dict) or not isinstance(row.get("agent_ref"), dict) or "name" not in row["agent_ref"]:
        raise ValueError(
            "each prompt must be a NeMo Gym row (JSON) with agent_ref.name; "
            "load the dataset with trainer.data.load_rows / to_dataset"
        )
    return row


@dataclass
class Sample:
    """One prompt's answer, as handed to TRL."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    env_mask: list[int]
    reward: Optional[float]
    status: str
    agent: str
    policy_version: int


@dataclass
class Batch:
    tasks: list[Task]
    rollouts: list[Rollout]
    samples: list[Sample]
    metrics: dict[str, float] = field(default_factory=dict)


def batch_metrics(
    tasks: list[Task], rollouts: list[Rollout], samples: list[Sample], version: int, wall_s: float
) -> dict[str, float]:
    """Per-step numbers: reward per agent, failures per kind, latency, queue wait, tokens, staleness."""
    m: dict[str, float] = {
        "farm/rollouts": float(len(rollouts)),
        "farm/batch_wall_s": wall_s,
        "farm/policy_version": float(version),
    }
    by_agent: dict[str, list[float]] = defaultdict(list)
    failed = Counter()
    for r, s in zip(rollouts, samples):
        if s.reward is None:
            failed[r.error.kind if r.error else "empty_completion"] += 1
        else:
            by_agent[r.agent_ref.name].append(s.reward)
    for agent, rewards in sorted(by_agent.items()):
        mean = sum(rewards) / len(rewards)
        m[f"farm/reward/{agent}/mean"] = mean
        m[f"farm/reward/{agent}/std"] = math.sqrt(sum((x - mean) ** 2 for x in rewards) / len(rewards))
    m["farm/failed"] = float(sum(failed.values()))
    m["farm/failed_frac"] = m["farm/failed"] / max(1, len(rollouts))
    for kind, n in sorted(failed.items()):
        m[f"farm/failed/{kind}"] = float(n)
    done = [r for r in rollouts if r.timings.total_s > 0]
    if done:
        m["farm/latency_s/mean"] = sum(r.timings.total_s for r in done) / len(done)
        m["farm/latency_s/max"] = max(r.timings.total_s for r in done)
        m["farm/queue_wait_s/mean"] = sum(r.timings.queue_wait_s for r in done) / len(done)
        m["farm/model_s/mean"] = sum(r.timings.model_s for r in done) / len(done)
    m["farm/tokens/prompt"] = float(sum(len(s.prompt_ids) for s in samples if s.reward is not None))
    m["farm/tokens/sampled"] = float(sum(sum(s.env_mask) for s in samples))
    m["farm/tokens/env"] = float(sum(len(s.env_mask) - sum(s.env_mask) for s in samples if s.reward is not None))
    answered = [r for r in rollouts if r.ok]
    if answered:
        stale = [version - r.policy_version for r in answered]
        m["farm/staleness/mean"] = sum(stale) / len(stale)
        m["farm/staleness/max"] = float(max(stale))
    return m


class FarmRollout:
    """`rollout_func` for GRPOTrainer: every call is one batch of Tasks through the farm.

    `version` is the policy version the trainer last published (weight sync bumps it);
    `batches` keeps every batch's tasks, rollouts and metrics for tests and benchmarks.
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
    ):
        self.settings = settings
        self.tokenizer = tokenizer
        self.run_id = run_id or f"train-{uuid.uuid4().hex[:8]}"
        self.timeout_s = timeout_s
        self.num_generations = num_generations
        self.sampling = sampling or Sampling()
        self.version = 0
        self.batches: list[Batch] = []
        self.keep_batches = keep_batches
        self._calls = 0
        self._loop = _LoopThread()
        factory = client_factory or FarmClient
        self.client: FarmClient = self._loop.run(self._make(factory))
        self.__name__ = "farm_rollout"

    async def _make(self, factory):
        return factory(self.settings)

    # -- TRL entry point -------------------------------------------------------------------
    def __call__(self, prompts: list, trainer=None) -> dict[str, list]:
        num_generations, sampling = self.num_generations, self.sampling
        if trainer is not None:
            training = getattr(getattr(trainer, "model", None), "training", True)
            num_generations = trainer.num_generations if training else trainer.num_generations_eval
            args = trainer.args
            sampling = Sampling(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_completion_length)
        batch = self.generate(prompts, num_generations, sampling)
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
        }

    # -- the farm side -----------------------------------------------------------------------
    def tasks_for(self, prompts: list, num_generations: int, sampling: Sampling) -> list[Task]:
        rows = [parse_row(p) for p in prompts]
        if len(rows) % num_generations:
            raise ValueError(f"{len(rows)} prompts is not a whole number of groups of {num_generations}")
        call = self._calls
        self._calls += 1
        tasks = []
        for g in range(len(rows) // num_generations):
            group = rows[g * num_generations : (g + 1) * num_generations]
            if any(r != group[0] for r in group[1:]):
                raise ValueError(
                    f"group {g}: the {num_generations} consecutive prompts of a group differ; "
                    "TRL repeats each prompt num_generations times in a row"
                )
            group_id = f"{self.run_id}-{call}-{g}"
            for i, row in enumerate(group):
                ref = row["agent_ref"]
                tasks.append(
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
                )
        return tasks

    def generate(
        self, prompts: list, num_generations: Optional[int] = None, sampling: Optional[Sampling] = None
    ) -> Batch:
        tasks = self.tasks_for(prompts, num_generations or self.num_generations, sampling or self.sampling)
        t0 = time.perf_counter()
        got = self._loop.run(self.client.run_batch(tasks, timeout_s=self.timeout_s))
        wall = time.perf_counter() - t0
        rollouts = [got[t.task_id] for t in tasks]
        samples = [self.sample(t, r) for t, r in zip(tasks, rollouts)]
        metrics = batch_metrics(tasks, rollouts, samples, self.version, wall)
        batch = Batch(tasks, rollouts, samples, metrics)
        self.batches = (self.batches + [batch])[-self.keep_batches :]
        log.info("rollouts v%d: %s", self.version, _summary(metrics))
        return batch

    def sample(self, task: Task, rollout: Rollout) -> Sample:
        agent = task.agent_ref.name
        trace = rollout.trace
        if rollout.ok and (not rollout.trainable or trace is None):
            raise ConfigError(
                f"agent {agent!r} sent a rollout without token ids (task {task.task_id}): rollouts "
                "from policy_kind chat/responses carry no token ids; train with policy_kind tokens "
                "against vLLM"
            )
        usable = rollout.ok and rollout.reward is not None and trace is not None and len(trace.completion_ids) > 0
        if usable:
            return Sample(
                list(trace.prompt()),
                list(trace.completion()),
                list(trace.completion_logprobs()),
                trace.mask(),
                float(rollout.reward),
                rollout.status.value,
                agent,
                rollout.policy_version,
            )
        if rollout.ok:  # answered, but nothing to learn from: no tokens or no reward
            log.warning(
                "rollout %s (%s) is ok but has %s; masked",
                task.task_id,
                agent,
                "no reward" if rollout.reward is None else "no sampled tokens",
            )
        eos = self.tokenizer.eos_token_id
        prompt = list(trace.prompt()) if trace is not None and trace.prompt_ids else self._placeholder_prompt(task.row)
        # One placeholder token, masked: TRL needs a non-empty completion; the loss never sees it.
        return Sample(
            prompt,
            [eos],
            [0.0],
            [0],
            None,
            rollout.error.kind if rollout.error else "empty_completion",
            agent,
            rollout.policy_version,
        )

    def _placeholder_prompt(self, row: dict) -> list[int]:
        params = row.get("responses_create_params") or {}
        items = params.get("input") if isinstance(params, dict) else None
        text = (
            items
            if isinstance(items, str)
            else " ".join(str(m.get("content", "")) for m in items or [] if isinstance(m, dict))
        )
        ids = self.tokenizer(text or " ", add_special_tokens=False)["input_ids"][:64]
        return ids or [self.tokenizer.eos_token_id]

    def close(self) -> None:
        try:
            self._loop.run(self.client.aclose())
        finally:
            self._loop.stop()


def _summary(m: dict[str, float]) -> str:
    parts = [f"{int(m['farm/rollouts'])} rollouts in {m['farm/batch_wall_s']:.1f}s"]
    parts += [
        f"{k.split('/')[2]} reward {v:.2f}±{m[k[:-4] + 'std']:.2f}"
        for k, v in m.items()
        if k.startswith("farm/reward/") and k.endswith("/mean")
    ]
    if m["farm/failed"]:
        parts.append(
            "failed " + ", ".join(f"{k.split('/')[-1]}={int(v)}" for k, v in m.items() if k.startswith("farm/failed/"))
        )
    if "farm/latency_s/mean" in m:
        parts.append(f"latency {m['farm/latency_s/mean']:.2f}s, queue {m['farm/queue_wait_s/mean']:.2f}s")
    parts.append(f"tokens {int(m['farm/tokens/sampled'])} sampled/{int(m['farm/tokens/env'])} env")
    if "farm/staleness/max" in m:
        parts.append(f"staleness {m['farm/staleness/mean']:.1f} (max {int(m['farm/staleness/max'])})")
    return "; ".join(parts)


def env_reward(completions: list, env_reward: Optional[list] = None, **_: Any) -> list[Optional[float]]:
    """The reward function for GRPOTrainer: the environment's verdict; None for failed rollouts."""
    if env_reward is None:
        raise ValueError("no env_reward: the trainer must use trainer.rollout.FarmRollout as rollout_func")
    return [None if r is None else float(r) for r in env_reward]
