"""The environment interface: data, tools, verifier and agent settings of one task family.

An environment is a module or package under envs/ (or a third-party package) registered
under the `farm.envs` entry point group. The worker calls `setup()` once before its first
rollout and `aclose()` when it stops; for each task it checks the row against `row_type`,
renders the prompt, calls the policy, runs the environment's tools on a fresh per-rollout
state, and finally asks the verifier for a reward. A verifier that raises or runs past its
limit makes the rollout `failed` with kind `verifier`; it is never scored 0 silently.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Literal, Optional

from envs.sdk.rows import Row, normalize_row, parse_row
from envs.sdk.sandbox import SandboxBackend
from envs.sdk.tools import Tool, Toolset
from farm.errors import ConfigError, UnknownAgent, where
from farm.lazy import import_object
from farm.trace import TokenTrace

__all__ = [
    "ENTRY_POINT_GROUP",
    "AgentSettings",
    "Environment",
    "LoopKind",
    "RolloutScope",
    "Transcript",
    "Verdict",
    "available_envs",
    "env_class",
    "load_env",
]


ENTRY_POINT_GROUP = "farm.envs"

LoopKind = Literal["single_turn", "tool_use", "multi_turn"]


@dataclass
class AgentSettings:
    """How the agent loop runs for this environment (overridable per agent in the config)."""

    loop: LoopKind = "single_turn"
    max_steps: int = 8  # policy calls per rollout
    sampling: dict[str, Any] = field(default_factory=dict)  # overrides of the task's sampling
    tool_timeout_s: float = 30.0
    verify_timeout_s: float = 60.0


@dataclass
class Transcript:
    """What the verifier sees: the final answer, every tool call made, the output items."""

    final_text: str
    output: list[dict]
    tool_calls: list[dict]
    truncated: bool = False
    reported: Optional["Verdict"] = None  # a harness's own grade (task.report), when it gave one
    trace: Optional[TokenTrace] = None  # the rollout's token ids, when its policy backend keeps them


@dataclass
class Verdict:
    reward: float
    components: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RolloutScope:
    """Who runs one rollout: what its per-rollout resources (a sandbox) are labelled with, and the
    worker's sandbox backend when the environment asked for one (`Environment.sandboxes`)."""

    task_id: str
    worker_id: str
    namespace: str
    sandboxes: Optional[SandboxBackend] = None
    sandbox_slack_s: float = 120.0  # a sandbox lives its task's own time limits plus this


class Environment:
    """The base class of every environment; override what the task family needs."""

    name: str = "base"
    # The verifier's version, recorded on every rollout it scores (Rollout.verifier_version). Bump
    # it whenever a change could score a stored rollout differently (a fixed checker, new partial
    # credit, another judge): `farm reverify` re-scores stored rollouts and reports which changed.
    verifier_version: str = "1"
    agent: AgentSettings = AgentSettings()
    row_type: type[Row] = Row  # the rows' typed shape (ground truth included)
    toolset: Optional[Toolset] = None  # the tools, when declared with @Toolset.tool
    # True: every rollout runs in a sandbox of its own; the worker hands its backend (the
    # `sandbox_backend` setting) to `open_state` in the RolloutScope, and checks it at start.
    sandboxes: bool = False

    async def setup(self) -> None:
        """Called by the worker once, before the first rollout: start pools, open clients."""

    async def aclose(self) -> None:
        """Called by the worker when it stops: close what setup (or first use) opened."""

    def tools(self) -> list[Tool]:
        return self.toolset.list() if self.toolset is not None else []

    def normalize_row(self, row: dict) -> dict:
        """`row` as it enters this environment, before `check_row` (the worker's read_row, `farm data
        prepare`): a row in TRL's dataset shape as a farm row (envs.sdk.rows.normalize_row). An
        environment whose rows imply more may add it (the TRL factory environment puts a row's own
        tools in `responses_create_params.tools`)."""
        return normalize_row(row)

    def check_row(self, row: dict) -> Any:
        """`row` as this environment's Row; RowError (a ValueError) names what does not fit.

        The worker calls it once per task, before any model call, and hands the typed row to
        `new_state` and `verify`; so do the data tools, for every row they write."""
        return parse_row(row, self.row_type)

    def new_state(self, row: Any) -> Any:
        """The state one rollout's tools work on (`row`: a `row_type`), fresh per rollout."""
        return None

    async def open_state(self, row: Any, scope: RolloutScope) -> Any:
        """The state of one rollout, made before its first model call; `new_state` unless the
        environment holds something per rollout that must be started (a sandbox) and released.
        Raise RolloutFailure (kind `infrastructure`) when that cannot start."""
        return self.new_state(row)

    def prompt_addition(self, row: Any, state: Any) -> Optional[str]:
        """Text the environment appends to the last message of the rollout's first prompt, known once
        its state is open (TRL's `reset` observation); None: the row's prompt as it is. The agent loop
        asks after `open_state` and before the first model call, and not on a continuation, whose
        recorded prompt has it already."""
        return None

    async def close_state(self, state: Any) -> None:
        """Release what `open_state` started, after the verifier; the worker calls it however the
        rollout ends (done, failed, timed out, cancelled, interrupted, the worker stopping)."""

    def agent_time_limit(self, row: Any) -> Optional[float]:
        """Seconds the agent may work on this row before the loop stops it and the verifier runs
        (a Harbor task's agent timeout); None: only max_steps and the attempt's timeout bound it."""
        return None

    async def verify(self, row: Any, state: Any, transcript: Transcript) -> Verdict:
        """The reward of a finished rollout (`row`: a `row_type`); raise on a broken row or checker."""
        raise NotImplementedError

    async def score(self, row: Any, state: Any, transcript: Transcript) -> Verdict:
        """`verify` for a plain row (a dict, as read from JSONL): checked first, as the worker does.
        Offline scoring and tests use it; RowError when the row does not fit."""
        if isinstance(row, dict):
            row = self.check_row(row)
        return await self.verify(row, state, transcript)

    def generate(self, size: int, seed: int = 0) -> list[dict]:
        """`size` NeMo Gym-style rows, deterministic by seed, made offline."""
        raise NotImplementedError(f"environment {self.name} has no data generator")


def available_envs() -> dict[str, Any]:
    """Registered environment names -> entry points (loaded only when used)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def import_hint(module: str) -> str:
    """Where Python looked for a user's module (PYTHONPATH, and the current directory only when it is
    on the import path: the `farm` command does not add it), and the PYTHONPATH that finds a module
    kept next to the config file (FARM_CONFIG's directory, else the current one)."""
    cwd = Path.cwd()
    on_path = {Path(p or ".").resolve() for p in sys.path}
    pythonpath = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    looked = f"PYTHONPATH ({os.pathsep.join(pythonpath) or 'unset'})"
    looked += f", the current directory {cwd}" if cwd in on_path else f"; not the current directory {cwd}"
    config = os.environ.get("FARM_CONFIG")
    home = Path(config).resolve().parent if config else cwd
    top = Path(home, *module.split("."))
    there = next((f for f in (top.with_suffix(".py"), top / "__init__.py") if f.is_file()), None)
    known = config or there or (cwd / "farm.yaml").exists()
    where_to = str(home) if known else "<the directory of farm.yaml>"
    found = f" ({there} is there)" if there else ""
    return f"looked in {looked}; a module next to farm.yaml is found with PYTHONPATH={where_to}{found}, or install it"


def missing_module_hint(module: str, exc: ImportError) -> str:
    """`; ` and the import hint when `exc` says `module` itself (or a parent package) is not found; else
    nothing (a module that is found and fails to import a dependency is the dependency's error)."""
    name = exc.name if isinstance(exc, ModuleNotFoundError) else None
    return f"; {import_hint(module)}" if name and (module == name or module.startswith(name + ".")) else ""


def env_class(name: str) -> type[Environment]:
    """The Environment class `name` names: a registered environment, or `module:Class` (an
    environment tried without installing a package; its module must be importable, e.g. from
    the current directory or PYTHONPATH). An environment that fails to import is the user's
    error: ConfigError naming it, its entry point, and the file and line."""
    if ":" in name:
        spec = name
    else:
        envs = available_envs()
        if name not in envs:
            raise UnknownAgent(
                f"unknown environment {name!r}; available: {', '.join(sorted(envs)) or 'none'} "
                "(or name a class as module:Class)"
            )
        spec = envs[name].value
    module = spec.partition(":")[0]
    try:
        obj = import_object(spec)
    except Exception as exc:  # noqa: BLE001 - any error importing the user's module is theirs, in one line
        if isinstance(exc, ModuleNotFoundError) and exc.name == module.split(".")[0] and ":" in name:
            raise ConfigError(f"environment {name}: no module {module!r}: {import_hint(module)}") from None
        raise ConfigError(
            f"environment {name} ({spec}) failed to load: {type(exc).__name__}: {exc}{where(exc)}"
        ) from None
    if not (isinstance(obj, type) and issubclass(obj, Environment)):
        raise ConfigError(f"environment {name}: {spec} is not an Environment subclass")
    return obj


def load_env(name: str, options: Optional[dict] = None) -> Environment:
    cls = env_class(name)
    try:
        return cls(**(options or {}))
    except TypeError as exc:  # an option the environment does not take, or of the wrong kind
        raise ConfigError(f"environment {name}: bad option(s) {sorted(options or {})}: {exc}") from None
