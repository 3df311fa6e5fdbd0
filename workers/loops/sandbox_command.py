"""A command agent run inside its rollout's sandbox, its one way out the worker's gateway.

    agents:
      my_terminal_agent:
        env: harbor
        command: ["python3", "/opt/agent/agent.py"]
        command_in_sandbox: true
        command_upload: examples/harnesses/terminal_agent   # copied to /opt/agent (optional)

Why: a black-box agent (a CLI, mini-swe-agent baked into an image) works on the task's files
with its own tools, so it must run where they are; and what it samples must still reach the
trainer with exact token ids, so every model call must go through the gateway, which records
them. The sandbox keeps its network off: the gateway's Unix socket (Gateway.listen_unix), bound
read-only into every sandbox of the agent (SOCKET_INSIDE), is the only path out, and a forwarder
(workers/loops/sandbox_forward.py, uploaded to FORWARDER) turns it into an HTTP port on the
sandbox's own loopback for the command it starts.

Per rollout: the forwarder, the task JSON and `command_upload` go into the sandbox; then one exec
runs `python3 FORWARDER SOCKET TASK -- COMMAND...` in the task's working directory, with the
rollout's secrets in the exec's environment (never an argv), within what is left of the agent's
time (Environment.agent_time_limit, counted from the sandbox's start where the state knows it:
a Harbor `Box`). As for a host command: stdout is the answer; a non-zero exit is a crash with the
end of its stderr; a command that runs past its time is killed with all it started (the exec's
timeout) and the verifier grades what it did (metric `agent_timeout`, as in the farm's own loop).
The image needs python3 (the forwarder's; the agent may be anything).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Optional

from envs.sdk import Environment
from envs.sdk.sandbox import Sandbox, SandboxSpec
from farm.agent_config import AgentConfig
from farm.errors import ConfigError, RolloutFailure
from farm.schema import ErrorKind
from workers.gateway.calls import RolloutCalls
from workers.gateway.server import SOCKET_NAME, Gateway
from workers.loops.sandboxes import Tracked

__all__ = ["SandboxCommand", "AGENT_DIR", "FORWARDER", "SOCKET_INSIDE"]

SOCKET_INSIDE = "/run/farm-gateway"  # where the gateway's socket directory is bound
FORWARDER = "/opt/farm/forward.py"
TASK_FILE = "/opt/farm/task.json"
AGENT_DIR = "/opt/agent"  # where `command_upload` goes
DEFAULT_LIMIT_S = 3600.0  # an environment that sets no agent time limit still gets one
STDERR_CHARS = 2000
_SOURCE = Path(__file__).with_name("sandbox_forward.py")


class Mounted(Tracked):
    """The process's sandbox backend (same counts), binding the gateway's socket directory into
    every sandbox it starts."""

    def __init__(self, inner: Tracked, mounts: dict[str, str]):
        super().__init__(inner.backend)
        self.stats, self.mounts = inner.stats, mounts

    async def start(self, spec: SandboxSpec) -> Sandbox:
        return await super().start(dataclasses.replace(spec, mounts={**spec.mounts, **self.mounts}))


class SandboxCommand:
    """One agent's command, run inside each rollout's sandbox."""

    def __init__(self, name: str, cfg: AgentConfig, env: Environment, argv: list[str]):
        if not env.sandboxes:
            raise ConfigError(
                f"agent {name!r}: command_in_sandbox needs an environment that runs in sandboxes "
                f"(harbor, for one); {env.name} has none"
            )
        self.env, self.argv = env, argv
        self.upload: Optional[Path] = None
        if cfg.command_upload is not None:
            self.upload = Path(cfg.command_upload).expanduser().resolve()
            if not self.upload.is_dir():
                raise ConfigError(f"agent {name!r}: command_upload {cfg.command_upload} is not a directory")
        self.forwarder = _SOURCE.read_bytes()

    @classmethod
    def of(cls, name: str, cfg: AgentConfig, env: Environment, argv: list[str]) -> Optional["SandboxCommand"]:
        return cls(name, cfg, env, argv) if cfg.command_in_sandbox else None

    async def mount(self, sandboxes: Optional[Tracked], gateway: Gateway) -> Optional[Tracked]:
        """The backend to start this agent's sandboxes with: the gateway's socket bound in."""
        if sandboxes is None or isinstance(sandboxes, Mounted):
            return sandboxes
        return Mounted(sandboxes, {str(await gateway.listen_unix()): SOCKET_INSIDE})

    async def run(self, calls: RolloutCalls, row: Any, state: Any, metrics: dict) -> Optional[str]:
        """The command's answer (its stdout); None when it ran out of time (the verifier grades)."""
        sandbox: Sandbox = state.sandbox if hasattr(state, "sandbox") else state  # a Harbor Box, or a sandbox
        await sandbox.write_file(FORWARDER, self.forwarder, 0o755)
        await sandbox.write_file(TASK_FILE, json.dumps(calls.task_json).encode(), 0o644)
        if self.upload is not None:
            await sandbox.upload_dir(self.upload, AGENT_DIR)
        limit = self.env.agent_time_limit(row) or DEFAULT_LIMIT_S
        if callable(getattr(state, "time_left", None)):
            limit = state.time_left(limit)
        argv = ["python3", FORWARDER, f"{SOCKET_INSIDE}/{SOCKET_NAME}", TASK_FILE, "--", *self.argv]
        secrets = {"FARM_GATEWAY_ROLLOUT": calls.secret, "FARM_GATEWAY_TASK": calls.task_secret}
        result = await sandbox.exec(argv, timeout_s=limit, cwd=getattr(state, "workdir", None), env=secrets)
        if result.timed_out:
            metrics["agent_timeout"] = True  # its time is up: the verifier grades what it did
            return None
        if result.exit_code == 127 and "python3" in result.stderr and "forwarder" not in result.stderr:
            raise RolloutFailure(
                ErrorKind.agent_error,
                "command_in_sandbox needs python3 in the sandbox's image (the gateway forwarder runs on it)",
                retryable=False,
            )
        if result.exit_code != 0:
            tail = result.stderr.strip()[-STDERR_CHARS:]
            raise RuntimeError(
                f"command {self.argv[0]} exited with status {result.exit_code} in the sandbox: {tail or '(no stderr)'}"
            )
        return result.stdout.rstrip("\n")
