"""Judges for verifiers: `await ctx.judge(name, messages)` asks a model that is never trained.

A judge is a model endpoint configured apart from the policy (`judges:` in the settings, see
farm.settings.JudgeConfig). A verifier asks it through the rollout's context:

    from envs.sdk import ctx

    async def verify(self, row, state, transcript):
        reply = await ctx.judge("grader", [{"role": "user", "content": ...}])
        ...  # reply.text, reply.latency_s, reply.cached

The worker (workers/loops/env_calls.py) opens a context around every verifier call, backed by
the process's judge pool (workers/policy/judges.py: the judge's own replicas, its concurrency
limit shared by every rollout of the process, its deadline, a cache of identical requests). An
environment may name judges of its own in `Environment.judges` (name -> JudgeConfig), used when
the settings do not configure that name (math's `judge_url` option is one).

Errors. A judge that cannot answer (past its deadline, refused, an unreadable reply, no such
judge) raises JudgeFailure, a RolloutFailure of kind `verifier`: the rollout is recorded as failed
with that message, never scored 0. Every call made in a rollout is recorded in the rollout's
metrics (`judge_calls`: judge, latency, cached, the raw text).
"""

from __future__ import annotations

import contextvars
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Protocol

from farm.errors import RolloutFailure
from farm.schema import ErrorKind
from farm.settings import JudgeConfig

__all__ = ["JudgeBackend", "JudgeConfig", "JudgeFailure", "JudgeReply", "RolloutContext", "ctx", "judging"]

RAW_CHARS = 2000  # of a judge's text kept per call in the rollout's metrics


@dataclass
class JudgeReply:
    judge: str
    text: str
    latency_s: float  # of the call (0 when answered from the cache)
    cached: bool = False


class JudgeFailure(RolloutFailure):
    """A judge could not answer: the rollout fails as `verifier` with this message."""

    def __init__(self, judge: str, message: str):
        super().__init__(ErrorKind.verifier, f"judge {judge}: {message}")
        self.judge = judge


class JudgeBackend(Protocol):
    """What asks the judges (the worker's pool; a test's stand-in)."""

    async def ask(
        self, name: str, messages: list[dict], sampling: dict[str, Any], default: Optional[JudgeConfig] = None
    ) -> JudgeReply: ...


class RolloutContext:
    """What a verifier may ask of the farm while it scores one rollout; records its judge calls."""

    def __init__(self, backend: Optional[JudgeBackend], defaults: Optional[dict[str, JudgeConfig]] = None):
        self.backend = backend
        self.defaults = defaults or {}
        self.calls: list[dict[str, Any]] = []

    async def judge(self, name: str, messages: list[dict], **sampling: Any) -> JudgeReply:
        """The judge's answer to `messages` (chat messages); `sampling` overrides the judge's own."""
        if self.backend is None:
            raise JudgeFailure(name, "no judge pool here (judges are asked inside a worker, or under judging())")
        start = time.perf_counter()
        try:
            reply = await self.backend.ask(name, messages, sampling, self.defaults.get(name))
        except JudgeFailure as exc:
            self.calls.append({"judge": name, "error": exc.message, "latency_s": _s(start)})
            raise
        call = {"judge": name, "latency_s": round(reply.latency_s, 4), "cached": reply.cached}
        self.calls.append({**call, "text": reply.text[:RAW_CHARS]})
        return reply


def _s(start: float) -> float:
    return round(time.perf_counter() - start, 4)


_current: contextvars.ContextVar[Optional[RolloutContext]] = contextvars.ContextVar("farm_rollout", default=None)


class _Current:
    """`ctx`: the context of the rollout being verified (a context variable, so concurrent rollouts
    of one process each see their own)."""

    async def judge(self, name: str, messages: list[dict], **sampling: Any) -> JudgeReply:
        context = _current.get()
        if context is None:
            context = RolloutContext(None)
        return await context.judge(name, messages, **sampling)


ctx = _Current()


@contextmanager
def judging(
    backend: Optional[JudgeBackend], defaults: Optional[dict[str, JudgeConfig]] = None
) -> Iterator[RolloutContext]:
    """Verifier calls inside see `backend` through `ctx`; yields the context (its `calls`)."""
    context = RolloutContext(backend, defaults)
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)
