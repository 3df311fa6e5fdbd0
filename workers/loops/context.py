"""What an agent is to the worker: the Agent protocol and the context each run gets.

Apart from the registry (workers.loops.agent) so the agents themselves (workers.loops.loop,
workers.loops.noop) import only this, and the registry imports them: no import cycle.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Optional, Protocol, runtime_checkable

from farm.policy_version import PolicyVersions
from farm.schema import Rollout, Task
from farm.settings import Settings
from workers.policy.judges import JudgePool


@dataclass
class AgentContext:
    worker_id: str
    settings: Settings
    versions: Optional[PolicyVersions] = None  # the served policy version, watched once per process
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("farm.agent"))
    # Tasks a client interrupted (farm.cancel): an agent whose run is cancelled while its task id is
    # here returns an `interrupted` rollout with what it generated so far instead of being cancelled.
    interrupts: set[str] = field(default_factory=set)

    # The process's judge pool (`judges:` in the settings): what `ctx.judge` asks in every verifier of
    # the process while the worker serves it; the worker closes it when it stops.
    judges: JudgePool = field(init=False)

    def __post_init__(self) -> None:
        self.judges = JudgePool.from_settings(self.settings if isinstance(self.settings, Settings) else None)


@runtime_checkable
class Agent(Protocol):
    """Turns a Task into a Rollout. The worker also calls `async setup()` once before its first
    task when the agent has one (the environment agents start their environment's pools there),
    and `aclose()` when it stops."""

    async def run(self, task: Task, ctx: AgentContext) -> Rollout: ...

    async def aclose(self) -> None: ...
