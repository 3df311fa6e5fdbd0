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
    rollout, on the host or, with `command_in_sandbox`, inside the rollout's sandbox) makes it an agent
    the farm never saw: it talks to the worker's model gateway (workers/gateway), and `env` provides
    its tools and verifies its answer."""

    env: str
    loop: Optional[Literal["single_turn", "tool_use", "multi_turn"]] = None
    max_steps: Optional[int] = None
    sampling: dict[str, Any] = {}
    env_options: dict[str, Any] = {}
    harness: Optional[str] = None
    command: Optional[Union[str, list[str]]] = None
    max_rollout_tokens: Optional[int] = None  # sampled tokens across a harness rollout's calls
    # Run `command` inside the rollout's sandbox (workers/loops/sandbox_command.py): an env with
    # sandboxes only (checked at worker start); `command_upload`: a host directory copied to /opt/agent first.
    command_in_sandbox: bool = False
    command_upload: Optional[str] = None

    def __post_init__(self) -> None:
        if self.harness is not None and self.command is not None:
            raise ValueError("an agent takes `harness` or `command`, not both")
        if self.harness is not None and not re.fullmatch(r"[\w.]+:[\w.]+", self.harness):
            raise ValueError(f"harness must be 'module:function', got {self.harness!r}")
        if self.command is not None and not self.command:
            raise ValueError("command must name a program")
        if (self.command_in_sandbox or self.command_upload) and self.command is None:
            raise ValueError("command_in_sandbox and command_upload go with `command`")
        if self.command_upload is not None and not self.command_in_sandbox:
            raise ValueError("command_upload copies into the sandbox: set command_in_sandbox: true")
        for key in ("max_steps", "max_rollout_tokens"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ValueError(f"{key} must be >= 1, got {value}")
