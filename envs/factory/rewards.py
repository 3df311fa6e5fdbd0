"""A rollout's reward as TRL's GRPOTrainer computes it for the same completion.

TRL 1.16 (`_calculate_rewards`) calls each reward function once per batch with keyword arguments:
`prompts`, `completions`, `completion_ids`, every column of the rows but `prompt` (as lists),
`trainer_state`, `log_extra`, `log_metric` and `environments` (the rollouts' instances); a class
with `get_reward` adds a reward source named after the class, weight 1; the reward is the sum of
the sources' values times their weights (`reward_weights`, one per reward function, default 1).
Here each rollout is its own batch of one: every list has one entry.

What the farm passes:

- `prompts`: the row's prompt with the reset observation appended (TRL's tool loop works on a
  copy, so the reward functions see the prompt as it was first rendered);
- `completions`: the completion as TRL's messages, `{"role": "assistant", "content", "tool_calls"}`
  and `{"role": "tool", "name", "content"}`, from the rollout's output items (an assistant turn
  that calls tools has its text before the first `<tool_call>`, as TRL's response parser keeps
  it); for a text prompt, the final text;
- `completion_ids`: the rollout's ids after its first prompt (sampled and inserted), [] for a
  policy backend without ids;
- `trainer_state`: None (the workers never see the trainer); `log_extra(column, values)` and
  `log_metric(name, value)` write into the rollout's metrics (`extra/<column>`, `metric/<name>`).

Where TRL turns a None (or NaN) into a NaN that its `nansum` skips, a source that returns None for
this rollout is left out of the sum, as in TRL; a rollout no source scored, a source that raises,
returns something other than a number, or a list that is not one entry long, fails the rollout
with kind `verifier`: never a reward of 0. Each source's value is a reward component.
"""

from __future__ import annotations

import inspect
import json
import math
import numbers
from typing import Any, Callable, Optional

from envs.factory.loading import RewardFunc, located, one_line
from envs.sdk import ErrorKind, RolloutFailure, Transcript, Verdict, where

__all__ = ["Source", "completion_messages", "score"]


class Source:
    """One reward source of a rollout: a reward function (called with TRL's keyword arguments) or
    the environment's own `get_reward` (called with none)."""

    def __init__(self, name: str, label: str, weight: float, call: Callable[[dict], Any], per_rollout: bool):
        self.name, self.label, self.weight, self.call = name, label, weight, call
        self.per_rollout = per_rollout  # get_reward: returns one value, not a list of one

    @classmethod
    def function(cls, reward: RewardFunc, name: str) -> "Source":
        return cls(name, reward.label, reward.weight, lambda kwargs: reward.fn(**kwargs), False)

    @classmethod
    def get_reward(cls, instance: Any) -> "Source":
        kind = type(instance)
        label = f"{kind.__qualname__}.get_reward ({located(getattr(kind, 'get_reward'))})"
        return cls(kind.__name__, label, 1.0, lambda _kwargs: instance.get_reward(), True)


def completion_messages(output: list[dict]) -> list[dict]:
    """The rollout's output items (Responses-style) as TRL's completion messages. A tool call joins
    the assistant turn before it; a turn that said nothing but calls (a text policy backend) gets an
    empty assistant message (two such turns in a row read as one: their items do not say where the
    first ended)."""
    messages: list[dict] = []
    names: dict[Any, str] = {}
    # A call the loop could not parse (status incomplete) never ran in TRL: its text stays the turn's.
    bad = {i.get("call_id") for i in output if i.get("type") == "function_call" and i.get("status") == "incomplete"}
    for item in output:
        kind = item.get("type")
        if kind in ("function_call", "function_call_output") and item.get("call_id") in bad:
            continue
        if kind == "message":
            parts = item.get("content")
            text = parts if isinstance(parts, str) else "".join(p.get("text", "") for p in parts or [])
            messages.append({"role": item.get("role", "assistant"), "content": text})
        elif kind == "function_call":
            names[item.get("call_id")] = item.get("name", "")
            if not messages or messages[-1]["role"] not in ("assistant", "tool"):
                messages.append({"role": "assistant", "content": ""})
            turn = next(m for m in reversed(messages) if m["role"] == "assistant")
            call = {"name": item.get("name", ""), "arguments": _arguments(item.get("arguments"))}
            turn.setdefault("tool_calls", []).append({"type": "function", "function": call})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "name": names.get(item.get("call_id"), ""), "content": item["output"]})
    for m in messages:
        if m.get("tool_calls"):
            m["content"] = m["content"].split("<tool_call>", 1)[0].strip()
    return messages


def _arguments(raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def trl_arguments(prompt: Any, transcript: Transcript, columns: dict, instance: Any, metrics: dict) -> dict:
    """The keyword arguments TRL gives every reward function, for this one rollout."""
    if isinstance(prompt, str):
        prompts, completions = [prompt], [transcript.final_text]
    else:
        prompts, completions = [list(prompt)], [completion_messages(transcript.output)]
    ids = list(transcript.trace.completion()) if transcript.trace is not None else []

    def log_extra(column: str, values: list) -> None:
        metrics[f"extra/{column}"] = _plain(values[0] if len(values) == 1 else values)

    def log_metric(name: str, value: float) -> None:
        metrics[f"metric/{name}"] = _plain(value)

    kwargs = {key: [value] for key, value in columns.items()}
    kwargs.update(
        prompts=prompts,
        completions=completions,
        completion_ids=[ids],
        trainer_state=None,
        log_extra=log_extra,
        log_metric=log_metric,
        environments=[instance],
    )
    return kwargs


def _plain(value: Any) -> Any:
    """A value the wire can carry (a numpy scalar as a float, anything else unknown as text)."""
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


async def value_of(source: Source, kwargs: dict) -> Optional[float]:
    """The source's reward for this rollout (None: it does not score it); RolloutFailure(verifier)
    when it raises or answers with something that is not one number."""
    try:
        out = source.call(kwargs)
        if inspect.isawaitable(out):
            out = await out
    except Exception as exc:
        raise RolloutFailure(
            ErrorKind.verifier, f"{source.label} raised {type(exc).__name__}: {one_line(exc)}{where(exc)}"
        ) from None
    if not source.per_rollout:
        if not isinstance(out, (list, tuple)) or len(out) != 1:
            got = f"{len(out)} values" if isinstance(out, (list, tuple)) else type(out).__name__
            raise RolloutFailure(ErrorKind.verifier, f"{source.label} returned {got}, not a list of one reward")
        out = out[0]
    if out is None or (isinstance(out, float) and math.isnan(out)):
        return None
    if isinstance(out, numbers.Real):
        return float(out)
    raise RolloutFailure(
        ErrorKind.verifier, f"{source.label} returned a {type(out).__name__}, not a number: {out!r:.80}"
    )


async def score(sources: list[Source], kwargs: dict, metrics: dict) -> Verdict:
    """The weighted sum of the sources' rewards, each one a component."""
    components: dict[str, float] = {}
    unscored = []
    reward = 0.0
    for source in sources:
        value = await value_of(source, kwargs)
        if value is None:
            unscored.append(source.label)
            continue
        components[source.name] = value
        reward += source.weight * value
    if not components:
        raise RolloutFailure(
            ErrorKind.verifier, f"no reward source scored this rollout (None from {', '.join(unscored)})"
        )
    weights = {s.name: s.weight for s in sources if s.weight != 1.0}
    if weights:
        metrics["reward_weights"] = weights
    return Verdict(reward=reward, components=components, metrics=metrics)
