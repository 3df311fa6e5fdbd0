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
"""

from __future__ import annotations

import asyncio

from farm.errors import RolloutFailure
from farm.schema import ErrorKind, Rollout, Status, Task, TokenTrace
from workers.loops.context import AgentContext


class NoopAgent:
    async def run(self, task: Task, ctx: AgentContext) -> Rollout:
        spec = task.row.get("noop") or {}
        if not isinstance(spec, dict):
            raise RolloutFailure(ErrorKind.agent_error, "row field `noop` must be a mapping")
        sleep_s = float(spec.get("sleep_s", 0) or 0)
        if sleep_s:
            await asyncio.sleep(sleep_s)
        fail = spec.get("fail")
        if fail == "always" or (isinstance(fail, int) and task.attempt <= fail):
            raise RuntimeError(f"noop told to fail (attempt {task.attempt})")
        if fail == "fatal":
            raise RolloutFailure(spec.get("kind", ErrorKind.verifier), "noop told to fail without retry")
        trace = None
        n = int(spec.get("tokens", 0) or 0)
        if n:
            trace = TokenTrace.build(range(16), [i % 32000 for i in range(n)], [-0.5] * n, [1] * n, [(0, n)])
        text = _prompt_text(task.row)
        return Rollout.for_task(
            task,
            status=Status.ok,
            reward=float(spec.get("reward", 1.0)),
            trace=trace,
            output=[{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}],
            metrics={"prompt_chars": len(text), **({"completion_tokens": n} if n else {})},
        )

    async def aclose(self) -> None:
        return None


def _prompt_text(row: dict) -> str:
    params = row.get("responses_create_params") or {}
    items = params.get("input") if isinstance(params, dict) else None
    if isinstance(items, str):
        return items
    if isinstance(items, list) and items and isinstance(items[-1], dict):
        content = items[-1].get("content", "")
        return content if isinstance(content, str) else str(content)
    return ""
