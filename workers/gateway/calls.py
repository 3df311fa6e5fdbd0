"""One rollout at the gateway (its secrets, limits and what its calls produced) and one model call.

A call goes through the token path every native loop uses (the policy client's rotation, group
placement, probes and retries; workers/policy/tokens.py) with the rollout's session, so a
harness's calls stay on one replica's prefix cache; its prompt comes from the bridge
(workers/gateway/bridge.py). The rollout's limits are enforced here: past `max_steps` calls, past
the rollout's token budget or past the model's context, the call is answered with a 400 (code
`rollout_limit` or `context_length_exceeded`) and the rollout is stopped, `truncated`, whatever
the harness does next; a policy failure is answered 503 (or 502) and fails the rollout (kind
`policy`). A rollout that ends cancels its open model calls (`upstream`), which closes their
connections to the model server, so it stops generating.

A rollout's record is made and registered by the gateway (`Gateway.open_rollout`), from the task and
what the harness gets; the tool calls a harness runs through it (`RolloutCalls.call_tool`) are
recorded against the call ids the gateway gave the model's calls.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional

from farm.errors import RolloutFailure
from farm.schema import ErrorKind, Task
from farm.tasks import cancelling
from workers.gateway.answers import Reply, new_id
from workers.gateway.bridge import BadHistory, Bridge, Message
from workers.gateway.shapes import GatewayError, Request, bad
from workers.policy.chat import ChatTokenizer, ToolCall, parse_tool_calls
from workers.policy.protocol import ContextOverflow, PolicyUnavailable
from workers.policy.replicas import Session
from workers.policy.token_policy import CompletionClient

GRADER_ERROR_CHARS = 2000  # of a harness's grader error kept in the failure

_CALL_BLOCK = re.compile(r"\s*<tool_call>.*?</tool_call>\s*", re.DOTALL)

ToolRunner = Callable[[str, dict], Awaitable[str]]


@dataclass
class Limits:
    """What one rollout may spend (task.limits): model calls, tokens per call, sampled tokens in all."""

    max_steps: int
    max_tokens: Optional[int] = None
    max_rollout_tokens: Optional[int] = None

    def as_dict(self) -> dict[str, Optional[int]]:
        return {
            "max_steps": self.max_steps,
            "max_tokens": self.max_tokens,
            "max_rollout_tokens": self.max_rollout_tokens,
        }


@dataclass
class RolloutCalls:
    """One rollout at the gateway: its secrets, bridge, limits, and what its calls produced."""

    model: str
    sampling: dict[str, Any]
    limits: Limits
    session: Session
    bridge: Bridge
    run_tool: ToolRunner  # the environment's tool on the rollout's state; call_tool records what it answers
    task_json: dict = field(default_factory=dict)  # the task as a command harness gets it
    secret: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    task_secret: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    calls: int = 0
    sampled_tokens: int = 0
    model_s: float = 0.0
    bad_tool_calls: int = 0
    truncated: bool = False  # the newest reply was cut at max_tokens
    last_text: str = ""
    output: list[dict] = field(default_factory=list)  # Responses-style items, in the order of the replies
    reported: Optional[tuple[float, dict[str, float]]] = None
    stop_reason: str = ""  # a limit the harness passed: the rollout ends truncated
    failure: Optional[RolloutFailure] = None  # the model failed: the rollout fails with it
    refused: Optional[Any] = (
        None  # the newest request the gateway refused (a GatewayError 400): named if the harness gives up
    )
    stopped: asyncio.Event = field(default_factory=asyncio.Event)
    upstream: set[asyncio.Task] = field(default_factory=set)
    responses: dict[str, list[Message]] = field(default_factory=dict)
    ended: bool = False
    unanswered: dict[str, deque[str]] = field(default_factory=dict)  # tool name -> its calls' ids, oldest first

    @classmethod
    def for_task(
        cls,
        task: Task,
        model: str,
        messages: list[dict],
        tools: list[dict],
        sampling: dict[str, Any],
        limits: Limits,
        run_tool: ToolRunner,
        bridge: Bridge,
    ) -> RolloutCalls:
        """The record of `task`'s rollout: its session (the task's group placement) and the task as JSON."""
        task_json = {
            "task_id": task.task_id,
            "messages": messages,
            "tools": tools,
            "model": model,
            "row": task.row,
            "sampling": dict(sampling),
            "limits": limits.as_dict(),
        }
        session = Session(group=task.group_id, key=task.task_id)
        return cls(model, sampling, limits, session, bridge, run_tool, task_json)

    async def call_tool(self, name: str, arguments: Any) -> str:
        """The harness runs a tool: its result, recorded as the output of the oldest call of that name
        the model made and no tool answered yet (a harness's tool call carries no call id)."""
        result = await self.run_tool(name, arguments)
        waiting = self.unanswered.get(name)
        call_id = waiting.popleft() if waiting else ""
        self.output.append({"type": "function_call_output", "call_id": call_id, "name": name, "output": result})
        return result

    def stop(self, reason: str) -> None:
        if not self.stop_reason and self.failure is None:
            self.stop_reason = reason
        self.stopped.set()

    def fail(self, failure: RolloutFailure) -> None:
        if self.failure is None and not self.stop_reason:
            self.failure = failure
        self.stopped.set()

    def report_failure(self, error: Any) -> None:
        """A harness whose own grader failed (POST /report {"error": ...}): the rollout ends now as a
        `verifier` failure with that message, not retried (a grader that raises on this answer would
        raise again) and never scored, whatever the harness does next (it may exit non-zero)."""
        message = " ".join(str(error).split())[:GRADER_ERROR_CHARS] or "(no message)"
        self.fail(RolloutFailure(ErrorKind.verifier, f"the harness's own grader failed: {message}", retryable=False))

    def report(self, reward: Any, components: Any = None) -> None:
        """A harness's own grade; a bad value is refused with the reason (ValueError)."""
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise ValueError(f"reward must be a finite number, got {str(reward)[:40]!r}")
        components = components or {}
        if not isinstance(components, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
            for k, v in components.items()
        ):
            raise ValueError("components must map names to numbers")
        self.reported = (float(reward), {k: float(v) for k, v in components.items()})


async def model_call(client: CompletionClient, tok: ChatTokenizer, rollout: RolloutCalls, req: Request) -> Reply:
    """One model call of a rollout through the token path; GatewayError for what the harness is told."""
    if req.model != rollout.model:
        raise GatewayError(
            404,
            f"the model {req.model[:80]!r} does not exist here; this rollout's model is {rollout.model!r} (task.model)",
            "model_not_found",
            param="model",
        )
    if rollout.ended or rollout.stopped.is_set():
        raise GatewayError(400, f"the rollout has ended ({rollout.stop_reason or 'stopped'})", "rollout_limit")
    limits = rollout.limits
    if rollout.calls >= limits.max_steps:
        rollout.stop(f"the harness passed max_steps ({limits.max_steps} model calls)")
        raise GatewayError(
            400, f"max_steps ({limits.max_steps} model calls) reached: the rollout ends", "rollout_limit"
        )
    left = None if limits.max_rollout_tokens is None else limits.max_rollout_tokens - rollout.sampled_tokens
    if left is not None and left <= 0:
        rollout.stop(f"the harness passed the rollout's token budget ({limits.max_rollout_tokens})")
        raise GatewayError(400, "the rollout's token budget is spent: the rollout ends", "rollout_limit")
    rollout.calls += 1
    try:
        plan = rollout.bridge.plan(req.messages, req.tools)
    except BadHistory as exc:
        raise bad(str(exc), "messages") from None
    caps = [c for c in (req.max_tokens, rollout.sampling.get("max_tokens"), left) if c is not None]
    room = await client.max_model_len(rollout.session)
    if room is not None:
        room -= len(plan.prompt)
        if room <= 0:
            return _overflow(rollout, f"a {len(plan.prompt)}-token prompt leaves no room in the context")
        caps.append(room)
    sampling = {**rollout.sampling, "max_tokens": min(caps) if caps else None}
    started = time.perf_counter()
    upstream = asyncio.ensure_future(client.complete(plan.prompt, sampling, rollout.session))
    rollout.upstream.add(upstream)
    try:
        c = await upstream
    except asyncio.CancelledError:
        if upstream.cancelled() and not cancelling():
            raise GatewayError(503, "the rollout ended; this call was stopped", "rollout_ended") from None
        raise
    except ContextOverflow as exc:
        return _overflow(rollout, str(exc))
    except RolloutFailure as exc:
        rollout.fail(exc)
        status = 503 if isinstance(exc, PolicyUnavailable) else 502
        raise GatewayError(status, f"the policy failed: {exc.message}", "policy_error", "server_error") from None
    finally:
        rollout.upstream.discard(upstream)
        rollout.model_s += time.perf_counter() - started
    if len(c.ids) != len(c.logprobs):
        rollout.fail(RolloutFailure(ErrorKind.invariant, f"{len(c.ids)} ids but {len(c.logprobs)} logprobs"))
        raise GatewayError(502, "the policy answered ids and logprobs of different lengths", "policy_error")
    return _reply(tok, rollout, req, plan, c)


def _overflow(rollout: RolloutCalls, detail: str) -> Reply:
    rollout.stop(f"the conversation outgrew the model's context ({detail[:200]})")
    raise GatewayError(
        400, f"the conversation no longer fits the model's context: {detail[:300]}", "context_length_exceeded"
    )


def _reply(tok: ChatTokenizer, rollout: RolloutCalls, req: Request, plan: Any, c: Any) -> Reply:
    ended = bool(c.ids) and c.ids[-1] == tok.eos_id
    text = tok.decode(c.ids[:-1] if ended else c.ids)
    parsed = parse_tool_calls(text, rollout.calls) if (ended and req.parse_calls and req.tools) else []
    good = [p for p in parsed if isinstance(p, ToolCall)]
    rollout.bad_tool_calls += len(parsed) - len(good)
    calls = [(new_id("call_"), p.name, json.dumps(p.arguments)) for p in good]
    content: Optional[str] = text
    if calls:
        content = _CALL_BLOCK.sub("\n", text).strip() or None
    finish = "tool_calls" if calls else ("length" if c.finish_reason == "length" else "stop")
    reply = Reply(content, calls, finish, len(plan.prompt), len(c.ids))
    rollout.bridge.record(plan, c.ids, c.logprobs, text, reply.message())
    rollout.sampled_tokens += len(c.ids)
    rollout.truncated = c.finish_reason == "length"
    rollout.last_text = content or ""
    if content:
        rollout.output.append(
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": content}]}
        )
    for cid, name, args in calls:
        rollout.output.append({"type": "function_call", "call_id": cid, "name": name, "arguments": args})
        rollout.unanswered.setdefault(name, deque()).append(cid)
    return reply
