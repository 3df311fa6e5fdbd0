"""One agent of a workers config (`agents:` in farm.yaml): the environment that serves a task stream,
its loop overrides, and, for an agent the farm never saw, its harness or command."""

from __future__ import annotations

import re
from typing import Any, Literal, Optional, Union

import msgspec

__all__ = ["AgentConfig"]


class AgentConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One agent (a task stream) served by an environment, with optional loop overrides.

    `harness` ("module:function", an `async def run(client, task)`) or `command` (a program, run per
    rollout) makes it an agent the farm never saw: it talks to the worker's model gateway
    (workers/gateway), and `env` provides its tools and verifies its answer."""

    env: str
    loop: Optional[Literal["single_turn", "tool_use", "multi_turn"]] = None
    max_steps: Optional[int] = None
    sampling: dict[str, Any] = {}
    env_options: dict[str, Any] = {}
    harness: Optional[str] = None
    command: Optional[Union[str, list[str]]] = None
    max_rollout_tokens: Optional[int] = None  # sampled tokens across a harness rollout's calls

    def __post_init__(self) -> None:
        if self.harness is not None and self.command is not None:
            raise ValueError("an agent takes `harness` or `command`, not both")
        if self.harness is not None and not re.fullmatch(r"[\w.]+:[\w.]+", self.harness):
            raise ValueError(f"harness must be 'module:function', got {self.harness!r}")
        if self.command is not None and not self.command:
            raise ValueError("command must name a program")
        for key in ("max_steps", "max_rollout_tokens"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ValueError(f"{key} must be >= 1, got {value}")
