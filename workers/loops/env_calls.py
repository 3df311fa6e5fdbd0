"""What every agent loop shares: reading the row and the sampling, one tool call, the verdict.

The agent loop (workers/loops/loop.py) runs them for every policy backend (token ids in and
out, or the openai client), and they must treat tools and verifiers the same way, or rollouts
of one environment would be scored differently depending on the policy kind:

- a tool's problems (unknown name, bad arguments, an exception, running past
  `tool_timeout_s`) go back to the model as the tool's result and are counted in the
  rollout's metrics (`bad_tool_calls`, `tool_errors`); they never fail the rollout;
- a verifier that raises or runs past `verify_timeout_s` fails the rollout (kind
  `verifier`); it is never scored 0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Optional

from envs.sdk import Environment, RolloutScope, Tool, Transcript, Verdict
from envs.sdk.judge import JudgeConfig, JudgeReply, judging
from farm.errors import ConfigError, RolloutFailure, where
from farm.schema import ErrorKind, Rollout, Status, Task, Timings
from farm.settings import Settings
from workers.loops.sandboxes import Tracked, check_backend, close_quietly
from workers.policy.chat import BadToolCall, ToolCall, input_messages
from workers.policy.judges import ask_serving

log = logging.getLogger("farm.env")


class EnvironmentAgent:
    """What the agents that run an environment share: the environment's setup before the first
    task, and on close the policy's connections, then the environment's pools and sandboxes."""

    env: Environment
    sandboxes: Optional[Tracked] = None  # the process's sandbox backend, when the environment runs in sandboxes

    async def setup(self) -> None:
        if self.env.sandboxes:
            if self.sandboxes is None:
                raise ConfigError(f"environment {self.env.name} runs in sandboxes, and this agent has no backend")
            await check_backend(self.sandboxes)
        await self.env.setup()

    async def open_state(self, row: Any, task: Task, ctx: Any) -> Any:
        """The rollout's state (Environment.open_state), in a sandbox of its own when the environment asks."""
        s = ctx.settings if isinstance(ctx.settings, Settings) else Settings()  # tests' contexts may carry none
        scope = RolloutScope(task.task_id, ctx.worker_id, s.namespace, self.sandboxes, s.sandbox_slack_s)
        return await self.env.open_state(row, scope)

    async def close_state(self, state: Any) -> None:
        """Release the rollout's state to the end, even from a cancelled task (workers/loops/sandboxes.py)."""
        await close_quietly(lambda: self.env.close_state(state), f"a {self.env.name} rollout's state")

    def sandbox_stats(self) -> Optional[dict]:
        return self.sandboxes.stats.snapshot() if self.sandboxes is not None else None

    async def close_policy(self) -> None:
        """Close the agent's own connections to the policy (each agent kind has its own)."""

    async def aclose(self) -> None:
        try:
            await self.close_policy()
        finally:
            try:
                await self.env.aclose()
            finally:
                if self.sandboxes is not None:
                    await self.sandboxes.aclose()


def read_row(env: Environment, row: dict) -> tuple[Any, dict, list[dict], list[str]]:
    """The row as the environment's typed Row, its `responses_create_params`, its input as chat
    messages, and its follow-up user texts. A row that does not fit is `malformed`, before any model call.
    A row in TRL's shape is read as a farm row first (Environment.normalize_row)."""
    row = env.normalize_row(row)
    params = row.get("responses_create_params")
    if not isinstance(params, dict):
        raise RolloutFailure(ErrorKind.malformed, "row lacks `responses_create_params`")
    try:
        typed = env.check_row(row)
        messages = input_messages(params)
    except ValueError as exc:  # RowError included
        raise RolloutFailure(ErrorKind.malformed, str(exc)) from None
    followups = [m if isinstance(m, str) else m.get("content", "") for m in row.get("follow_up_messages", [])]
    return typed, params, messages, followups


def sampling_for(task: Task, overrides: dict[str, Any]) -> dict[str, Any]:
    """The task's sampling with the environment's overrides; the task's max_tokens (the trainer's
    max_completion_length) caps theirs, and theirs caps the task's (`max_tokens_capped_by`)."""
    s = task.sampling
    out = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "max_tokens": s.max_tokens,
        "seed": s.seed,
        "stop": s.stop,
        **overrides,
    }
    if s.max_tokens is not None and out.get("max_tokens") is not None:
        out["max_tokens"] = min(int(out["max_tokens"]), s.max_tokens)
    return out


def max_tokens_capped_by(task: Task, sampling: dict[str, Any]) -> Optional[str]:
    """`environment` when the environment's sampling (AgentSettings.sampling, an agent's `sampling:`
    included) set a lower max_tokens than the task asked for (or one where it asked none): a rollout
    records it, so a `--max-tokens 128` that became 96 is not a silent change."""
    used = sampling.get("max_tokens")
    if used is None or (task.sampling.max_tokens is not None and used >= task.sampling.max_tokens):
        return None
    return "environment"


async def call_tool(
    tools: dict[str, Tool], name: str, arguments: dict, state: Any, timeout_s: float, metrics: dict
) -> str:
    """The tool's result as text, or an `Error: ...` text the model can read and react to."""
    tool = tools.get(name)
    if tool is None:
        metrics["bad_tool_calls"] += 1
        return f"Error: unknown tool {name!r}; available: {', '.join(sorted(tools)) or 'none'}"
    try:
        value = await asyncio.wait_for(tool(state, arguments), timeout_s)
    except asyncio.TimeoutError:
        metrics["tool_errors"] += 1
        return f"Error: tool {name} ran past {timeout_s}s"
    except TypeError as exc:
        metrics["tool_errors"] += 1
        return f"Error: bad arguments for {name}: {exc}"
    except Exception as exc:
        metrics["tool_errors"] += 1
        return f"Error: tool {name} failed: {type(exc).__name__}: {exc}"
    return value if isinstance(value, str) else json.dumps(value)


async def run_call(
    call: ToolCall | BadToolCall,
    tools: dict[str, Tool],
    state: Any,
    timeout_s: float,
    output: list,
    calls_made: list,
    metrics: dict,
) -> str:
    """One parsed call: recorded as output items (call and result) and in the metrics; the result text."""
    if isinstance(call, BadToolCall):
        metrics["bad_tool_calls"] += 1
        result = f"Error: {call.error}"
        output.append(
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": "",
                "arguments": call.raw,
                "status": "incomplete",
            }
        )
    else:
        metrics["tool_calls"] += 1
        output.append(
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": json.dumps(call.arguments),
            }
        )
        calls_made.append({"name": call.name, "arguments": call.arguments})
        result = await call_tool(tools, call.name, call.arguments, state, timeout_s, metrics)
    output.append({"type": "function_call_output", "call_id": call.call_id, "output": result})
    return result


class ProcessJudges:
    """`ctx.judge` inside a verifier: the judge pool the worker (or `farm reverify`) serves to the
    run (workers/policy/judges.py `serving`)."""

    async def ask(
        self, name: str, messages: list[dict], sampling: dict[str, Any], default: Optional[JudgeConfig] = None
    ) -> JudgeReply:
        return await ask_serving(name, messages, sampling, default)


async def verify(env: Environment, row: Any, state: Any, transcript: Transcript, timeout_s: float) -> Verdict:
    """The environment's verdict, or RolloutFailure(verifier) when it raises or runs too long.
    The verifier may ask judges (`ctx.judge`); each call is recorded in the metrics (`judge_calls`)."""
    try:
        with judging(ProcessJudges(), getattr(env, "judges", None)) as context:
            verdict = await asyncio.wait_for(env.verify(row, state, transcript), timeout_s)
        if context.calls:
            verdict.metrics.setdefault("judge_calls", context.calls)
        return verdict
    except asyncio.TimeoutError:
        raise RolloutFailure(ErrorKind.verifier, f"verifier ran past {timeout_s}s") from None
    except RolloutFailure:
        raise
    except Exception as exc:
        message = f"verifier raised {type(exc).__name__}: {exc}{where(exc)}"
        log.warning("environment %s: %s", env.name, message)
        log.debug("the verifier's traceback", exc_info=True)
        raise RolloutFailure(ErrorKind.verifier, message) from None


async def scored(
    env: Environment,
    task: Task,
    row: Any,
    state: Any,
    transcript: Transcript,
    timeout_s: float,
    metrics: dict,
    timings: Timings,
    **fields: Any,
) -> Rollout:
    """The verifier's verdict on the transcript (`row`: the typed row), as the task's rollout
    (`fields`: the trace and such)."""
    start = time.perf_counter()
    verdict = await verify(env, row, state, transcript, timeout_s)
    timings.verify_s = time.perf_counter() - start
    metrics.update(verdict.metrics)
    return Rollout.for_task(
        task,
        status=Status.truncated if transcript.truncated else Status.ok,
        reward=verdict.reward,
        reward_components=verdict.components,
        metrics=metrics,
        output=transcript.output,
        timings=timings,
        verifier_version=env.verifier_version,
        **fields,
    )
