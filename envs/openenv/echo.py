"""OpenEnv's echo environment as a TRL `environment_factory` class: TRL's own
examples/scripts/openenv/echo.py class (`EchoToolEnv`: the `echo` tool steps the environment, the
reward is the one the environment's step returned), run unchanged by TRL 1.16 and by the farm:

    GRPOTrainer(model=..., train_dataset=..., environment_factory=EchoToolEnv)      # TRL
    agents: {echo: {environment_factory: "envs.openenv:EchoToolEnv"}}               # farm.yaml

The server is OpenEnv's (scripts/openenv_serve.py in .venv-openenv; envs/openenv/server.py starts
it); its URL is $OPENENV_ECHO_URL, default http://127.0.0.1:8000, read when an instance is made
(TRL makes instances with no arguments; its example captures its --env-host the same way). Each
instance holds one OpenEnv session, opened at its first reset and kept: TRL and the farm make one
instance per rollout in flight and reset it for each rollout, so the server needs as many
sessions (`--max-sessions`) as rollouts are ever in flight against it.

Where it differs from TRL's example, and why: `reset` starts a new OpenEnv episode (the example
only zeroes its reward, so every rollout of an instance shares one episode and its step count);
`get_reward` (TRL 1.16's reward owned by the environment) replaces the example's reward function
reading `env.reward`, so the agent needs no `reward_funcs`; the client is envs/openenv/client.py,
with the calls of openenv's (`reset()`, `step(action)` -> `.observation`, `.reward`), because
openenv-core cannot be installed beside the farm's transformers (see that module). And an episode
whose session was lost under a step (the server stopped, the connection dropped) has no reward:
the step's error goes to the model, as any tool's, and `get_reward` raises instead of reporting
the 0.0 the episode started with (the farm records a failed rollout; TRL stops).
"""

from __future__ import annotations

import os
from typing import Optional

from envs.openenv.client import OpenEnvClient, OpenEnvError

__all__ = ["DEFAULT_URL", "URL_VARIABLE", "EchoToolEnv"]

URL_VARIABLE = "OPENENV_ECHO_URL"
DEFAULT_URL = "http://127.0.0.1:8000"


class EchoToolEnv:
    """One rollout's echo environment: its OpenEnv session and the reward of its last step."""

    def __init__(self) -> None:
        self.env = OpenEnvClient(base_url=os.environ.get(URL_VARIABLE, DEFAULT_URL))
        self.reward: Optional[float] = 0.0
        self.lost: Optional[str] = None  # why the episode's session ended under a step

    def reset(self, **kwargs) -> Optional[str]:
        self.env.reset()
        self.reward = 0.0
        self.lost = None
        return None

    def echo(self, message: str) -> str:
        """
        Echo the message back from the environment.

        Args:
            message: The message to echo

        Returns:
            The echoed message.
        """
        try:
            result = self.env.step({"message": message})
        except OpenEnvError as exc:
            if not self.env.connected:
                self.lost = str(exc)
            raise  # TRL and the farm hand a tool's exception to the model
        self.reward = result.reward
        return result.observation["echoed_message"]

    def get_reward(self) -> Optional[float]:
        if self.lost is not None:
            raise OpenEnvError(f"the episode's OpenEnv session ended before its reward: {self.lost}")
        return self.reward  # None where the environment gave none: TRL and the farm leave it out
