"""What an agent is to the worker: the Agent protocol and the context each run gets.

Apart from the registry (workers.agent) so the agents themselves (workers.loop, workers.noop,
workers.hosted) import only this, and the registry imports them: no import cycle.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from farm.schema import Rollout, Task
from farm.settings import Settings


@dataclass
class AgentContext:
    worker_id: str
    settings: Settings
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("farm.agent"))


@runtime_checkable
class Agent(Protocol):
    async def run(self, task: Task, ctx: AgentContext) -> Rollout: ...

    async def aclose(self) -> None: ...
