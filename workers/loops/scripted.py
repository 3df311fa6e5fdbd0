"""Agents without a model, for checking a task suite: `harbor_oracle` and `harbor_nop`.

A suite is only worth training on when its verifier tells a solved task from an untouched one:
the oracle runs each task's own reference solution (`Environment.oracle`, Harbor's
`solution/solve.sh`) in the rollout's sandbox and must score 1; the nop does nothing and must
score 0. Both run the whole rollout path a model-backed agent runs (the sandbox started and
removed, the verifier, the settle), so a collection with them also checks the farm around the suite.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from envs.sdk import Environment, Transcript
from farm.errors import ConfigError
from farm.schema import Rollout, Task, Timings
from workers.loops.context import AgentContext
from workers.loops.env_calls import EnvironmentAgent, read_row, scored

__all__ = ["ScriptedAgent"]

Mode = Literal["oracle", "nop"]


class ScriptedAgent(EnvironmentAgent):
    def __init__(self, env: Environment, mode: Mode):
        if mode == "oracle" and not callable(getattr(env, "oracle", None)):
            raise ConfigError(f"environment {env.name} has no reference solution (Environment.oracle)")
        self.env, self.mode, self.settings = env, mode, env.agent

    async def run(self, task: Task, ctx: AgentContext) -> Rollout:
        row, _, _, _ = read_row(self.env, task.row)
        state = await self.open_state(row, task, ctx)
        try:
            metrics: dict[str, Any] = {"turns": 0, "agent": self.mode}
            timings = Timings()
            if self.mode == "oracle":
                t0 = time.perf_counter()
                metrics.update(await getattr(self.env, "oracle")(row, state) or {})
                timings.tools_s = time.perf_counter() - t0
            transcript = Transcript(final_text="", output=[], tool_calls=[])
            limit = self.settings.verify_timeout_s
            return await scored(self.env, task, row, state, transcript, limit, metrics, timings)
        finally:
            await self.close_state(state)


def scripted_agent(name: str, settings: Any, mode: Mode) -> ScriptedAgent:
    """`harbor_oracle` / `harbor_nop` (or an agent configured with them): the harbor environment, or
    the one the agent's config names, with the process's sandbox backend."""
    from envs.sdk import load_env
    from workers.loops.sandboxes import make_backend

    cfg = settings.agents.get(name)
    env = load_env(cfg.env if cfg else "harbor", cfg.env_options if cfg else None)
    agent = ScriptedAgent(env, mode)
    if env.sandboxes:
        agent.sandboxes = make_backend(settings)
    return agent
