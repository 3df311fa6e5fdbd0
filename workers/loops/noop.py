"""The built-in `noop` agent: no model call, the reward is read from the row.

It exists to exercise the transport (tests) and to measure the farm's own overhead
(bench/transport.py). A row may steer it through an optional `noop` mapping:

    reward: float          reward to report (default 1.0)
    sleep_s: float         simulate work before answering
    tokens: int            emit a synthetic token trace of this many completion tokens
    fail: "always"         raise on every attempt (ends dead-lettered)
    fail: N                raise on the first N attempts, then succeed
    fail: "fatal"          a non-retryable RolloutFailure (a failed rollout, no retry)
    kind: str              the failure kind of `fatal` (an ErrorKind; default verifier)

With both `sleep_s` and `tokens`, the tokens are generated one by one over the sleep, as a model
streams them: an interrupt (farm.cancel) returns the ones generated so far with their policy
versions (an `interrupted` rollout, workers/loops/partial.py), and a continuation task goes on
from there, taking only the rest of the time.
"""

from __future__ import annotations

import asyncio

from farm.errors import RolloutFailure
from farm.schema import ErrorKind, Partial, Rollout, Status, Task, TokenTrace, pack_i32
from workers.loops.context import AgentContext


class NoopAgent:
    async def run(self, task: Task, ctx: AgentContext) -> Rollout:
        spec = task.row.get("noop") or {}
        if not isinstance(spec, dict):
            raise RolloutFailure(ErrorKind.agent_error, "row field `noop` must be a mapping")
        sleep_s = float(spec.get("sleep_s", 0) or 0)
        n = int(spec.get("tokens", 0) or 0)
        versions: list[int] = []
        if sleep_s and n:
            versions = await self._generate(task, ctx, n, sleep_s)
            if len(versions) < n:
                return self._interrupted(task, ctx, versions)
        elif sleep_s:
            await asyncio.sleep(sleep_s)
        fail = spec.get("fail")
        if fail == "always" or (isinstance(fail, int) and task.attempt <= fail):
            raise RuntimeError(f"noop told to fail (attempt {task.attempt})")
        if fail == "fatal":
            raise RolloutFailure(spec.get("kind", ErrorKind.verifier), "noop told to fail without retry")
        trace = None
        if n:
            trace = _trace(n)
            if len(set(versions)) > 1:
                trace.versions = pack_i32(versions)
        text = _prompt_text(task.row)
        return Rollout.for_task(
            task,
            status=Status.ok,
            reward=float(spec.get("reward", 1.0)),
            trace=trace,
            output=[{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}],
            metrics={"prompt_chars": len(text), **({"completion_tokens": n} if n else {})},
        )

    async def _generate(self, task: Task, ctx: AgentContext, n: int, sleep_s: float) -> list[int]:
        """The versions of the tokens generated, one every sleep_s/n, after those a continuation
        carries; fewer than n when an interrupt stopped it."""
        versions = list(task.resume.trace.token_versions(task.policy_version)) if task.resume is not None else []
        try:
            while len(versions) < n:
                await asyncio.sleep(sleep_s / n)
                live = ctx.versions.live if ctx.versions is not None else None
                versions.append(task.policy_version if live is None else live)
        except asyncio.CancelledError:
            if task.task_id not in ctx.interrupts:
                raise
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
        return versions

    def _interrupted(self, task: Task, ctx: AgentContext, versions: list[int]) -> Rollout:
        ctx.interrupts.discard(task.task_id)
        trace = _trace(len(versions))
        trace.versions = pack_i32(versions)
        model = getattr(ctx.settings, "policy_model", "") or ""
        partial = Partial.for_task(task, trace, open_turn=len(versions), model=model)
        metrics = {"generated_tokens": len(versions)}
        return Rollout.for_task(task, status=Status.interrupted, partial=partial, metrics=metrics)

    async def aclose(self) -> None:
        return None


def _trace(n: int) -> TokenTrace:
    return TokenTrace.build(range(16), [i % 32000 for i in range(n)], [-0.5] * n, [1] * n, [(0, n)] if n else [])


def _prompt_text(row: dict) -> str:
    params = row.get("responses_create_params") or {}
    items = params.get("input") if isinstance(params, dict) else None
    if isinstance(items, str):
        return items
    if isinstance(items, list) and items and isinstance(items[-1], dict):
        content = items[-1].get("content", "")
        return content if isinstance(content, str) else str(content)
    return ""
