"""One step's batch as handed to TRL, and the numbers logged for it.

`Sample` is one prompt's answer in TRL's layout; `Batch` a step's tasks, rollouts and samples with
its metrics (reward per agent, failures per kind, latency, tokens, staleness, and the over-sampling
counts of trainer.sampling); `summary` the one log line per step.

A sample's status is MULTI_SEGMENT when its rollout answered in several token segments: TRL gives
this path one sample per prompt, so it is masked like a failure (reward None) but counted on its
own, as `farm/multi_segment_masked`, not in `farm/failed` (trainer/rollout.py).
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Optional

from farm.errors import ConfigError
from farm.schema import Rollout, Task
from trainer.sampling import Group, one_sample, usable

log = logging.getLogger("farm.trainer")

MULTI_SEGMENT = "multi_segment"  # the status of a masked sample whose rollout has `segments`


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
    stale_masked: int = 0  # sampled tokens masked for their age (FarmRollout's mask_stale_tokens)


@dataclass
class Batch:
    tasks: list[Task]
    rollouts: list[Rollout]
    samples: list[Sample]
    metrics: dict[str, float] = field(default_factory=dict)
    prompts: list = field(default_factory=list)  # the prompt each sample answers (TRL's, or a spare row's JSON)
    groups: list[Group] = field(default_factory=list)  # every group the step submitted, taken or not


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
    failed: Counter[str] = Counter()
    multi_segment = 0
    for r, s in zip(rollouts, samples):
        if s.status == MULTI_SEGMENT:
            multi_segment += 1
        elif s.reward is None:
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
    m["farm/multi_segment_masked"] = float(multi_segment)
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


def summary(m: dict[str, float]) -> str:
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
    if m.get("farm/multi_segment_masked"):
        parts.append(f"{int(m['farm/multi_segment_masked'])} multi-segment masked")
    if "farm/latency_s/mean" in m:
        parts.append(f"latency {m['farm/latency_s/mean']:.2f}s, queue {m['farm/queue_wait_s/mean']:.2f}s")
    parts.append(f"tokens {int(m['farm/tokens/sampled'])} sampled/{int(m['farm/tokens/env'])} env")
    if "farm/staleness/max" in m:
        parts.append(f"staleness {m['farm/staleness/mean']:.1f} (max {int(m['farm/staleness/max'])})")
    needed, submitted = int(m.get("farm/groups/needed", 0)), int(m.get("farm/groups/submitted", 0))
    if submitted > needed or m.get("farm/groups/cancelled"):
        groups = f"groups {needed}/{submitted} taken, {int(m['farm/groups/cancelled'])} cancelled"
        if m["farm/groups/cancelled"]:
            groups += f" after {m['farm/groups/cancelled_run_s/max']:.1f}s max"
        if m["farm/groups/zero_variance_dropped"] or m["farm/groups/refills"]:
            groups += (
                f", {int(m['farm/groups/zero_variance_dropped'])} zero-variance dropped,"
                f" {int(m['farm/groups/refills'])} refills"
            )
        parts.append(groups)
    return "; ".join(parts)


def check_sampling(task: Task, rollout: Rollout) -> None:
    """Refuse a rollout sampled at another temperature or top_p than its task asked for, the
    trainer's (an agent's `sampling` override, in its settings or its environment's): the learner
    computes its logprobs at the trainer's, so the truncated importance-sampling ratio against the
    sampler's logprobs would be biased without a word. The worker records what it sampled with in
    `metrics["sampling"]`; a rollout that does not say (the noop agent) is taken as it is."""
    used = (rollout.metrics or {}).get("sampling")
    if not rollout.ok or not isinstance(used, dict):
        return
    asked = {"temperature": task.sampling.temperature, "top_p": task.sampling.top_p}
    off = {}
    for key, want in asked.items():
        got = used.get(key)
        if got is None:  # not set: the server's default, which the task's value is sent as
            continue
        if isinstance(got, bool) or not isinstance(got, (int, float)) or not math.isclose(got, want, rel_tol=1e-6):
            off[key] = got
    if off:
        agent = task.agent_ref.name
        said = ", ".join(f"{k} {v!r}" for k, v in off.items())
        wanted = ", ".join(f"{k} {asked[k]!r}" for k in off)
        raise ConfigError(
            f"agent {agent!r} sampled at {said} (a `sampling` override) but the trainer trains at {wanted}: "
            f"the importance-sampling ratio would be biased; remove {' and '.join(off)} from "
            f"agents.{agent}.sampling (and its environment's agent sampling) for an agent you train"
        )


def sample_of(task: Task, rollout: Rollout, tokenizer: Any) -> Sample:
    """One rollout as TRL's sample: its token trace, or a masked placeholder (reward None) for a failed
    rollout, one with more token segments than TRL takes, or one with nothing to learn from."""
    agent = task.agent_ref.name
    trace = rollout.trace
    check_sampling(task, rollout)
    if rollout.ok and (not rollout.trainable or trace is None):
        raise ConfigError(
            f"agent {agent!r} sent a rollout without token ids (task {task.task_id}): rollouts "
            "from policy_kind chat/responses carry no token ids; train with policy_kind tokens "
            "against vLLM"
        )
    if one_sample(rollout) and trace is not None and rollout.reward is not None:
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
    multi = usable(rollout)  # usable, yet not one sample: more token segments than TRL takes
    if rollout.ok and not multi:  # answered, but nothing to learn from: no tokens or no reward
        log.warning(
            "rollout %s (%s) is ok but has %s; masked",
            task.task_id,
            agent,
            "no reward" if rollout.reward is None else "no sampled tokens",
        )
    eos = tokenizer.eos_token_id
    prompt = list(trace.prompt()) if trace is not None and trace.prompt_ids else placeholder_prompt(task.row, tokenizer)
    # One placeholder token, masked: TRL needs a non-empty completion; the loss never sees it.
    return Sample(
        prompt,
        [eos],
        [0.0],
        [0],
        None,
        MULTI_SEGMENT if multi else rollout.error.kind if rollout.error else "empty_completion",
        agent,
        rollout.policy_version,
    )


def placeholder_prompt(row: dict, tokenizer: Any) -> list[int]:
    params = row.get("responses_create_params") or {}
    items = params.get("input") if isinstance(params, dict) else None
    text = (
        items
        if isinstance(items, str)
        else " ".join(str(m.get("content", "")) for m in items or [] if isinstance(m, dict))
    )
    ids = tokenizer(text or " ", add_special_tokens=False)["input_ids"][:64]
    return ids or [tokenizer.eos_token_id]


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


def trl_groups(prompts: list, num_generations: int) -> list[tuple[Any, dict]]:
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
