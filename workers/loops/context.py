"""What an agent is to the worker: the Agent protocol and the context each run gets.

Apart from the registry (workers.loops.agent) so the agents themselves (workers.loops.loop,
workers.loops.noop) import only this, and the registry imports them: no import cycle.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from typing import Optional, Protocol, runtime_checkable

from farm.policy_version import PolicyVersions
from farm.schema import Rollout, Task
from farm.settings import Settings


@dataclass
class AgentContext:
    worker_id: str
    settings: Settings
    versions: Optional[PolicyVersions] = None  # the served policy version, watched once per process
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("farm.agent"))
    # Tasks a client interrupted (farm.cancel): an agent whose run is cancelled while its task id is
    # here returns an `interrupted` rollout with what it generated so far instead of being cancelled.
    interrupts: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        """The worker makes one context per process: its judges (`judges:` in the settings) are the
        ones `ctx.judge` asks in every verifier of the process. Imported only when there are some:
        the pool needs the policy extra's HTTP clients, which a core install (noop workers) has not."""
        settings = self.settings if isinstance(self.settings, Settings) else None
        if settings is not None and settings.judges:
            from workers.policy.judges import install

            install(settings)
        elif "workers.policy.judges" in sys.modules:  # an earlier context's judges are not this one's
            sys.modules["workers.policy.judges"].install(settings)


@runtime_checkable
class Agent(Protocol):
    """Turns a Task into a Rollout. The worker also calls `async setup()` once before its first
    task when the agent has one (the environment agents start their environment's pools there),
    and `aclose()` when it stops."""

    async def run(self, task: Task, ctx: AgentContext) -> Rollout: ...

    async def aclose(self) -> None: ...
