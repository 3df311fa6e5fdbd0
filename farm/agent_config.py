"""One agent of a workers config (`agents:` in farm.yaml): the environment that serves a task stream,
its loop overrides, and, for an agent the farm never saw, its harness or command.

`environment_factory` names TRL `environment_factory` classes ("module:Class", or {name:
"module:Class"} selected by the row's `environment` column) with `reward_funcs` and
`reward_weights` as GRPOTrainer takes them; the agent is then served by the environment of that
name (envs/factory), whose env_options they become, and `env` may be left out."""

from __future__ import annotations

import re
from typing import Any, Literal, Optional, Union

import msgspec

__all__ = ["FACTORY_ENV", "AgentConfig"]

FACTORY_ENV = "environment_factory"  # the environment (envs/factory) that serves TRL classes


class AgentConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One agent (a task stream) served by an environment, with optional loop overrides.

    `harness` ("module:function", an `async def run(client, task)`) or `command` (a program, run per
    rollout, on the host or, with `command_in_sandbox`, inside the rollout's sandbox) makes it an agent
    the farm never saw: it talks to the worker's model gateway (workers/gateway), and `env` provides
    its tools and verifies its answer."""

    env: str = ""  # required, unless environment_factory names the classes (then: FACTORY_ENV)
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
    # TRL classes and reward functions (docs/trl-environments.md): import paths, as GRPOTrainer takes them.
    environment_factory: Optional[Union[str, dict[str, str]]] = None
    reward_funcs: list[str] = []
    reward_weights: Optional[list[float]] = None

    def __post_init__(self) -> None:
        self._factory()
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

    def _factory(self) -> None:
        """`environment_factory` and its reward settings as the factory environment's env_options."""
        if self.environment_factory is None:
            if not self.env:
                raise ValueError("an agent needs `env` (an environment) or `environment_factory` (TRL classes)")
            if self.reward_funcs or self.reward_weights is not None:
                raise ValueError("reward_funcs and reward_weights go with environment_factory")
            return
        if self.env not in ("", FACTORY_ENV):
            raise ValueError(f"environment_factory is served by env {FACTORY_ENV}: leave out `env: {self.env}`")
        if not self.environment_factory:
            raise ValueError("environment_factory must name a class: 'module:Class' or {name: 'module:Class'}")
        self.env = FACTORY_ENV
        self.env_options = {
            **self.env_options,
            "factory": self.environment_factory,
            "reward_funcs": list(self.reward_funcs),
            "reward_weights": self.reward_weights,
        }
