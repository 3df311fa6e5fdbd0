"""The `command:` harness on the host: a program per rollout, its model calls through the gateway.

The program gets OPENAI_BASE_URL / OPENAI_API_KEY for its rollout, FARM_TASK_URL for its tools
(POST {url}/tools/NAME) and grade (POST {url}/report), the task as JSON on stdin; its answer is its
stdout. A non-zero exit is a crash (the end of its stderr in the error). It runs in a process group
of its own, which is killed whole when the rollout is cancelled or times out. The worker's own
secrets (the policy's and the dashboard's keys) are not passed on.

The same program inside the rollout's sandbox is workers/loops/sandbox_command.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal

from farm.errors import RolloutFailure
from farm.schema import ErrorKind
from workers.gateway.calls import RolloutCalls
from workers.gateway.server import Gateway

__all__ = ["STDERR_CHARS", "run_command"]

STDERR_CHARS = 2000  # of a crashed command's stderr kept in the error
_HIDDEN_ENV = ("FARM_POLICY_API_KEY", "FARM_DASHBOARD_TOKEN", "OPENAI_API_KEY", "OPENAI_BASE_URL")


async def run_command(argv: list[str], calls: RolloutCalls, gateway: Gateway) -> str:
    """Run `argv` for the rollout `calls`; its answer (stdout, without the last newline)."""
    env = {k: v for k, v in os.environ.items() if k not in _HIDDEN_ENV}
    env.update(
        OPENAI_BASE_URL=gateway.base_url(calls), OPENAI_API_KEY=calls.secret, FARM_TASK_URL=gateway.task_url(calls)
    )
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        raise RolloutFailure(ErrorKind.agent_error, f"cannot start {argv[0]!r}: {exc}", retryable=False) from None
    try:
        out, err = await proc.communicate(json.dumps(calls.task_json).encode())
    except BaseException:
        _kill_group(proc.pid)
        await asyncio.shield(proc.wait())
        raise
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip()[-STDERR_CHARS:]
        raise RuntimeError(f"command {argv[0]} exited with status {proc.returncode}: {tail or '(no stderr)'}")
    return out.decode(errors="replace").rstrip("\n")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
