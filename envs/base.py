"""The environment interface: data, tools, verifier and agent settings of one task family.

An environment is one module under envs/ (or a third-party package) registered under the
`farm.envs` entry point group. The worker's agent loop renders the row's prompt, calls the
policy, runs the environment's tools on a fresh per-rollout state, and finally asks the
verifier for a reward. A verifier that raises or runs past its limit makes the rollout
`failed` with kind `verifier`; it is never scored 0 silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Awaitable, Callable, Literal, Optional

from farm.errors import UnknownAgent

ENTRY_POINT_GROUP = "farm.envs"

LoopKind = Literal["single_turn", "tool_use", "multi_turn"]


@dataclass
class Tool:
    """A function the model may call: JSON schema plus an async body over the rollout's state."""

    name: str
    description: str
    parameters: dict
    fn: Callable[..., Awaitable[Any]]      # async fn(state, **arguments) -> str | dict | list

    def schema(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass
class AgentSettings:
    """How the agent loop runs for this environment (overridable per agent in the config)."""

    loop: LoopKind = "single_turn"
    max_steps: int = 8                      # policy calls per rollout
    sampling: dict[str, Any] = field(default_factory=dict)   # overrides of the task's sampling
    tool_timeout_s: float = 30.0
    verify_timeout_s: float = 60.0


@dataclass
class Transcript:
    """What the verifier sees: the final answer, every tool call made, the output items."""

    final_text: str
    output: list[dict]
    tool_calls: list[dict]
    truncated: bool = False


@dataclass
class Verdict:
    reward: float
    components: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)


class Environment:
    name: str = "base"
    agent: AgentSettings = AgentSettings()

    def tools(self) -> list[Tool]:
        return []

    def new_state(self, row: dict) -> Any:
        return None

    async def verify(self, row: dict, state: Any, transcript: Transcript) -> Verdict:
        raise NotImplementedError

    def generate(self, size: int, seed: int = 0) -> list[dict]:
        """`size` NeMo Gym-style rows, deterministic by seed, made offline."""
        raise NotImplementedError(f"environment {self.name} has no data generator")


def available_envs() -> dict[str, Any]:
    """Registered environment names -> entry points (loaded only when used)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def load_env(name: str, options: Optional[dict] = None) -> Environment:
    envs = available_envs()
    if name not in envs:
        raise UnknownAgent(f"unknown environment {name!r}; available: {', '.join(sorted(envs)) or 'none'}")
    try:
        return envs[name].load()(**(options or {}))
    except TypeError as exc:   # an option the environment does not take, or of the wrong kind
        from farm.errors import ConfigError

        raise ConfigError(f"environment {name}: bad option(s) {sorted(options or {})}: {exc}") from None
