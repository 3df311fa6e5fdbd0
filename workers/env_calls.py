"""The environment's side of an agent loop: one tool call and the verifier, with their limits.

Every loop kind (token-in/token-out in workers/loop.py, the openai client in
workers/hosted.py) must treat tools and verifiers the same way, or rollouts of one
environment would be scored differently depending on the policy kind:

- a tool's problems (unknown name, bad arguments, an exception, running past
  `tool_timeout_s`) go back to the model as the tool's result and are counted in the
  rollout's metrics (`bad_tool_calls`, `tool_errors`); they never fail the rollout;
- a verifier that raises or runs past `verify_timeout_s` fails the rollout (kind
  `verifier`); it is never scored 0.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from envs.base import Environment, Tool, Transcript, Verdict
from farm.errors import RolloutFailure
from farm.schema import ErrorKind


async def call_tool(tools: dict[str, Tool], name: str, arguments: dict, state: Any, timeout_s: float,
                    metrics: dict) -> str:
    """The tool's result as text, or an `Error: ...` text the model can read and react to."""
    tool = tools.get(name)
    if tool is None:
        metrics["bad_tool_calls"] += 1
        return f"Error: unknown tool {name!r}; available: {', '.join(sorted(tools)) or 'none'}"
    try:
        value = await asyncio.wait_for(tool.fn(state, **arguments), timeout_s)
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


async def verify(env: Environment, row: dict, state: Any, transcript: Transcript, timeout_s: float) -> Verdict:
    """The environment's verdict, or RolloutFailure(verifier) when it raises or runs too long."""
    try:
        return await asyncio.wait_for(env.verify(row, state, transcript), timeout_s)
    except asyncio.TimeoutError:
        raise RolloutFailure(ErrorKind.verifier, f"verifier ran past {timeout_s}s") from None
    except RolloutFailure:
        raise
    except Exception as exc:
        raise RolloutFailure(ErrorKind.verifier, f"verifier raised {type(exc).__name__}: {exc}") from None
