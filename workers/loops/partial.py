"""Partial rollouts: what an interrupted rollout keeps, and how its continuation goes on.

An interrupt (farm.cancel, mode interrupt) stops a rollout mid-generation. The agent loop then
returns one `interrupted` rollout whose `partial` (farm.schema.Partial) holds every token so far
(the open turn's streamed ids included, each with its logprob and policy version), the messages the
chat template renders, the output items and tool calls, and the turns done. A continuation task
(`FarmClient.resume`) carries that partial in `Task.resume`; any worker goes on from it
token-exactly: the recorded prompt and ids are the next request, never re-tokenized, and the open
turn's ids are continued, not sampled again. The environment's state is rebuilt by running the
recorded tool calls again; a tool that answers differently the second time fails the continuation
(`invariant`) rather than going on from a state the tokens do not describe.

The partial lives in the task entry, not in a worker, so it survives worker death like any task;
its size counts toward `max_entry_bytes` like every entry's.
"""

from __future__ import annotations

import time
from typing import Any

from farm.errors import RolloutFailure
from farm.schema import ErrorKind, Partial, Rollout, Status, Task
from workers.loops.env_calls import call_tool

__all__ = ["interrupted_rollout", "resume_episode"]

# `ep` is workers.loops.loop's Episode and `loop` its AgentLoop, typed Any: that module imports this one.


def interrupted_rollout(ep: Any, task: Task, model: str) -> Rollout:
    """The one rollout of an interrupted run: `interrupted`, with its partial when the backend keeps
    token ids (the tokens backend; a chat or Responses conversation has no ids to go on from)."""
    partial = None
    snapshot = getattr(ep.convo, "snapshot", None)
    if snapshot is not None:
        trace, open_turn, messages = snapshot()
        partial = Partial.for_task(
            task,
            trace,
            open_turn=open_turn,
            steps=ep.metrics["turns"],
            messages=messages,
            output=list(ep.output),
            tool_calls=list(ep.calls_made),
            followups_left=len(ep.followups),
            metrics={k: v for k, v in ep.metrics.items() if isinstance(v, (int, float, str, bool, dict))},
            model=model,
        )
    generated = sum(partial.trace.env_mask) if partial is not None else 0
    metrics = {**ep.metrics, "generated_tokens": generated}
    return Rollout.for_task(
        task,
        status=Status.interrupted,
        partial=partial,
        metrics=metrics,
        output=list(ep.output),
        timings=ep.timings,
        finished_at=time.time(),
    )


async def resume_episode(loop: Any, ep: Any, partial: Partial, model: str) -> None:
    """Put the episode where `partial` stopped: its tokens, output, turns done and follow-ups left,
    and the environment's state rebuilt by running its tool calls again."""
    restore = getattr(ep.convo, "restore", None)
    if restore is None:
        raise RolloutFailure(
            ErrorKind.malformed,
            "a resumed rollout needs the tokens backend (policy_kind: tokens): it goes on from token ids",
        )
    if partial.model and partial.model != model:
        raise RolloutFailure(
            ErrorKind.malformed,
            f"this rollout was sampled by {partial.model!r} and this worker serves {model!r}: "
            "resume it where that model is served",
        )
    restore(partial.trace, partial.open_turn, partial.messages)
    ep.output = list(partial.output)
    ep.metrics.update(partial.metrics)
    ep.metrics["turns"] = partial.steps
    ep.followups = ep.followups[len(ep.followups) - partial.followups_left :] if partial.followups_left else []
    await _replay_tools(loop, ep, partial)


async def _replay_tools(loop: Any, ep: Any, partial: Partial) -> None:
    """Run the recorded tool calls again on the fresh state; each must answer as it did."""
    answers = _recorded_answers(partial.output)
    scratch: dict[str, Any] = {"tool_calls": 0, "tool_errors": 0}
    for i, call in enumerate(partial.tool_calls):
        result = await call_tool(
            loop.tools, call["name"], call.get("arguments", {}), ep.state, loop.settings.tool_timeout_s, scratch
        )
        if i < len(answers) and result != answers[i]:
            raise RolloutFailure(
                ErrorKind.invariant,
                f"resuming: tool {call['name']!r} answered differently when run again "
                "(its environment's state cannot be rebuilt from the recorded calls)",
            )
    ep.calls_made = list(partial.tool_calls)


def _recorded_answers(output: list[dict]) -> list[str]:
    """The recorded results of the well-formed tool calls, in call order."""
    good = {item.get("call_id") for item in output if item.get("type") == "function_call" and item.get("name")}
    return [
        item.get("output", "")
        for item in output
        if item.get("type") == "function_call_output" and item.get("call_id") in good
    ]
