"""harbor: a Harbor task per rollout, in a sandbox of its own, its tests as the verifier.

Data: rows made by `farm data generate harbor --tasks DIR` (envs/harbor/rows.py): the task's
instruction as the prompt, its directory in `task_dir`.
Sandbox: started from the task's image (its `environment/Dockerfile`, built once per content by
the worker's backend, or `[environment] docker_image`) with the task's cpus, memory, storage and
network, living the task's agent + verifier timeouts plus the worker's `sandbox_slack_s`; removed
when the rollout ends, however it ends.
Tools: `bash` (a command in the sandbox, output cut to a bounded size with the count of what was
cut), `read_file`, `write_file`. The agent stops at the task's agent timeout (no new turn starts,
and no command runs past it); then the verifier runs.
Verifier: every process the agent left is killed, the task's `tests/` uploaded to /tests,
`bash /tests/test.sh` run within the verifier timeout; the reward is read from
/logs/verifier/reward.json (`reward`, or its one number; every number a component) or reward.txt.
No reward file, a test script past its timeout, or an unreadable reward: a `verifier` failure,
which the trainer masks: never a 0.
Oracle: `solution/solve.sh`, for the built-in `harbor_oracle` agent (workers/loops/scripted.py).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Optional

from envs.harbor.task import HarborTask, TaskError, load_task
from envs.sdk import (
    AgentSettings,
    Environment,
    ErrorKind,
    RolloutFailure,
    RolloutScope,
    Row,
    RowError,
    Toolset,
    Transcript,
    Verdict,
)
from envs.sdk.sandbox import (
    LABEL_NAMESPACE,
    LABEL_TASK,
    LABEL_WORKER,
    ExecResult,
    ImageSpec,
    Sandbox,
    SandboxError,
    SandboxSpec,
)

TOOLS = Toolset()

TESTS_DIR, SOLUTION_DIR, REWARD_DIR = "/tests", "/solution", "/logs/verifier"
OUTPUT_BYTES = 8 * 1024  # of each stream a tool result shows the model
FILE_BYTES = 64 * 1024  # of a file read_file shows
DEFAULT_AGENT_TIMEOUT_S = 600.0  # Harbor's tasks may leave the agent's timeout open; the farm never does
COMMAND_TIMEOUT_S = 180.0  # one bash call, within what is left of the agent's time


class HarborRow(Row):
    task_dir: str
    task_name: Optional[str] = None
    tier: Optional[str] = None
    content_id: Optional[str] = None


@dataclass
class Box:
    """One rollout's sandbox and task."""

    sandbox: Sandbox
    task: HarborTask
    workdir: str
    agent_deadline: float  # monotonic

    def time_left(self, most: float) -> float:
        return max(1.0, min(most, self.agent_deadline - time.monotonic()))


def shown(result: ExecResult) -> str:
    """An exec's result as the model reads it: the exit code, then each stream, cuts counted."""
    head = f"exit code {result.exit_code}" + (" (timed out; its processes were killed)" if result.timed_out else "")
    parts = [head]
    for name, text, dropped in (
        ("stdout", result.stdout, result.stdout_dropped),
        ("stderr", result.stderr, result.stderr_dropped),
    ):
        if text or dropped:
            cut = f"\n[... {dropped} more bytes not shown]" if dropped else ""
            parts.append(f"{name}:\n{text.rstrip()}{cut}")
    return "\n".join(parts)


@TOOLS.tool
async def bash(state: Box, command: str) -> str:
    """Run a command with bash in the task's sandbox, in the task's working directory.

    Args:
        command: The command line to run.
    """
    result = await state.sandbox.exec(
        command, timeout_s=state.time_left(COMMAND_TIMEOUT_S), cwd=state.workdir, max_output=OUTPUT_BYTES
    )
    return shown(result)


@TOOLS.tool
async def read_file(state: Box, path: str) -> str:
    """Read a text file in the sandbox.

    Args:
        path: The file's path (relative paths start at the task's working directory).
    """
    data = await state.sandbox.read_file(_at(state, path), max_bytes=FILE_BYTES + 1)
    text = data[:FILE_BYTES].decode(errors="replace")
    return text + (f"\n[... cut at {FILE_BYTES} bytes]" if len(data) > FILE_BYTES else "")


@TOOLS.tool
async def write_file(state: Box, path: str, content: str) -> str:
    """Write a text file in the sandbox, replacing it if it exists.

    Args:
        path: The file's path (relative paths start at the task's working directory).
        content: The whole new content of the file.
    """
    data = content.encode()
    await state.sandbox.write_file(_at(state, path), data)
    return f"wrote {len(data)} bytes to {path}"


def _at(state: Box, path: str) -> str:
    return path if path.startswith("/") else f"{state.workdir.rstrip('/')}/{path}"


@lru_cache(maxsize=4096)
def _task(task_dir: str, content_id: Optional[str]) -> HarborTask:
    """A task read once per process (rows of one task share it); RowError when it cannot be used."""
    try:
        task = load_task(task_dir)
    except TaskError as exc:
        raise RowError(str(exc)) from None
    if content_id and task.content_id != content_id:
        raise RowError(
            f"{task_dir}: the task changed since its rows were made (content {task.content_id}, rows say "
            f"{content_id}): make the rows again with `farm data generate harbor`"
        )
    return task


class Harbor(Environment):
    name = "harbor"
    verifier_version = "1"
    # The verifier's limit is each task's own (verifier timeout_sec), enforced around test.sh.
    agent = AgentSettings(loop="tool_use", max_steps=30, tool_timeout_s=COMMAND_TIMEOUT_S + 30, verify_timeout_s=86400)
    row_type = HarborRow
    toolset = TOOLS
    sandboxes = True

    def __init__(self, default_agent_timeout_s: float = DEFAULT_AGENT_TIMEOUT_S):
        self.default_agent_timeout_s = default_agent_timeout_s

    def task_of(self, row: HarborRow) -> HarborTask:
        return _task(row.task_dir, row.content_id)

    def check_row(self, row: dict) -> Any:
        typed = super().check_row(row)
        self.task_of(typed)  # a row whose task cannot be read fails before its sandbox starts
        return typed

    def agent_time_limit(self, row: Any) -> float:
        return self.task_of(row).config.agent.timeout_sec or self.default_agent_timeout_s

    async def open_state(self, row: Any, scope: RolloutScope) -> Box:
        task = self.task_of(row)
        backend = scope.sandboxes
        if backend is None:
            raise RolloutFailure(ErrorKind.infrastructure, "harbor runs in sandboxes: no sandbox backend")
        env = task.config.environment
        image = env.docker_image or await backend.build(ImageSpec(task.environment_dir))
        agent_s = self.agent_time_limit(row)
        spec = SandboxSpec(
            image=image,
            lifetime_s=agent_s + task.config.verifier.timeout_sec + scope.sandbox_slack_s,
            cpus=env.cpus or 1.0,
            memory_mb=env.memory_mb or 2048,
            disk_mb=env.storage_mb or 4096,
            network=env.allows_internet
            if task.config.agent.network_mode is None
            else task.config.agent.network_mode != "no-network",
            workdir=env.workdir or "/",
            env=dict(env.env),
            labels={LABEL_NAMESPACE: scope.namespace, LABEL_WORKER: scope.worker_id, LABEL_TASK: scope.task_id},
        )
        sandbox = await backend.start(spec)
        return Box(sandbox, task, env.workdir or "/", time.monotonic() + agent_s)

    async def close_state(self, state: Any) -> None:
        if isinstance(state, Box):
            await state.sandbox.close()

    async def oracle(self, row: Any, state: Box) -> dict:
        """Run the task's reference solution in the rollout's sandbox (`harbor_oracle`)."""
        task = state.task
        if task.solve_script is None:
            raise RolloutFailure(ErrorKind.agent_error, f"task {task.name} has no solution/solve.sh")
        await state.sandbox.upload_dir(task.solution_dir, SOLUTION_DIR)
        result = await state.sandbox.exec(
            f"bash {SOLUTION_DIR}/solve.sh",
            timeout_s=state.time_left(math.inf),
            cwd=state.workdir,
            env=dict(task.config.solution.env),
        )
        return {"oracle_exit_code": result.exit_code, "oracle_timed_out": result.timed_out}

    async def verify(self, row: Any, state: Box, transcript: Transcript) -> Verdict:
        task = state.task
        limit = task.config.verifier.timeout_sec
        box = state.sandbox
        t0 = time.monotonic()
        try:
            await box.kill_all()  # nothing the agent started edits files while the tests read them
            await box.exec(f"rm -rf {TESTS_DIR} {REWARD_DIR} && mkdir -p {REWARD_DIR}", timeout_s=30)
            await box.upload_dir(task.tests_dir, TESTS_DIR)
            result = await box.exec(
                f"bash {TESTS_DIR}/test.sh", timeout_s=limit, cwd=state.workdir, env=dict(task.config.verifier.env)
            )
            if result.timed_out:
                raise RolloutFailure(ErrorKind.verifier, f"task {task.name}: tests/test.sh ran past {limit:g}s")
            reward, components = await _reward(box, task, result)
        except SandboxError as exc:  # the tests could not be put in or run (a disk the agent filled)
            raise RolloutFailure(ErrorKind.verifier, f"task {task.name}: the tests could not run: {exc}") from None
        metrics = {"task": task.name, "tier": row.tier or task.tier, "verifier_exit_code": result.exit_code}
        metrics["verifier_s"] = round(time.monotonic() - t0, 3)
        return Verdict(reward=reward, components=components, metrics=metrics)


async def _reward(box: Sandbox, task: HarborTask, result: ExecResult) -> tuple[float, dict[str, float]]:
    """The reward test.sh wrote: reward.json (its `reward`, else its one number) or reward.txt."""
    for name in ("reward.json", "reward.txt"):
        try:
            raw = (await box.read_file(f"{REWARD_DIR}/{name}", max_bytes=65536)).decode(errors="replace")
        except SandboxError:
            continue
        try:
            if name == "reward.txt":
                return _finite(float(raw.strip())), {}
            data = json.loads(raw)
            numbers = {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            if "reward" in numbers:
                return _finite(numbers["reward"]), {k: v for k, v in numbers.items() if k != "reward"}
            if len(numbers) == 1:
                return _finite(next(iter(numbers.values()))), {}
            raise ValueError(f"no `reward` among {sorted(numbers) or 'no numbers'}")
        except (ValueError, AttributeError) as exc:
            raise RolloutFailure(
                ErrorKind.verifier, f"task {task.name}: {REWARD_DIR}/{name} unreadable: {exc}"
            ) from None
    tail = (result.stderr or result.stdout).strip()[-300:]
    raise RolloutFailure(
        ErrorKind.verifier,
        f"task {task.name}: tests/test.sh wrote no reward file (exit code {result.exit_code}): {tail or '(no output)'}",
    )


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{value} is not a finite number")
    return value
