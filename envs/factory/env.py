"""The `environment_factory` environment: TRL `environment_factory` classes on the farm's workers.

Options (an agent's `environment_factory:` in farm.yaml sets them; farm/agent_config.py):

    factory          "module:Class" (or "module:function" returning an instance), or a dict
                     {name: "module:Class"} that the row's `environment` column selects from
    reward_funcs     ["module:function", ...], called as TRL calls reward functions
    reward_weights   one float per reward function (GRPOConfig's reward_weights); a class with
                     `get_reward` adds a source of weight 1

Rows: the row's own columns (every key but the farm's `responses_create_params` and `agent_ref`; a
row without `prompt` gets its input as `prompt`) are `reset(**columns)`'s keyword arguments, less
`environment` with a dict of factories, as TRL passes a dataset row. `check_row` binds them to
`reset`'s signature (and to the reward functions'), so `farm data prepare` and the worker refuse a
row that TRL would fail on, naming the class and its file:line.

A rollout draws an instance from its environment's pool (made with the factory only when none is
free: construct once, reset often), calls `reset`, and hands the instance back when its state is
closed, however the rollout ended; so a pool holds at most as many instances as rollouts were ever
in flight at once. What `reset` returns is appended to the last message of the first prompt
(`prompt_addition`). The tools are the classes' public methods, one farm Tool per name, each call
dispatched to the rollout's own instance: sync methods inline, async ones awaited, a method that
raises answered `{'error': '...'}` (TRL's `str({"error": str(e)})`), results as `str(result)`.
The verifier is envs/factory/rewards.py.
"""

from __future__ import annotations

import inspect
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from envs.factory.loading import EnvSpec, RewardFunc, load_env_spec, load_reward, located, one_line
from envs.factory.rewards import Source, score, trl_arguments
from envs.sdk import (
    AgentSettings,
    ConfigError,
    Environment,
    ErrorKind,
    RolloutFailure,
    RolloutScope,
    Row,
    RowError,
    Tool,
    Transcript,
    Verdict,
    add_to_prompt,
    normalize_row,
    parse_row,
    where,
)

__all__ = ["FactoryEnvironment", "FactoryRow", "FactoryState", "FactoryTool", "TRLRow"]

FARM_KEYS = ("responses_create_params", "agent_ref")  # what the farm adds to a row; not a TRL column
NOT_REWARD_COLUMNS = ("prompt", "completion", "completion_ids")  # the columns TRL keeps from reward functions


class TRLRow(Row):
    """What every row of a factory agent holds: the farm's fields, TRL's `prompt` (absent from a row
    in NeMo Gym's shape) and, with a dict of factories, the `environment` that serves it. The rest
    of its columns are `reset`'s business (check_row binds them to its signature)."""

    prompt: Optional[Union[str, list[dict]]] = None
    environment: Any = None


@dataclass(frozen=True)
class FactoryRow:
    """A checked row: which environment, `reset`'s keyword arguments, the reward functions' columns."""

    name: Optional[str]
    reset_kwargs: dict
    reward_columns: dict
    prompt: Any  # the row's prompt (chat messages or a text), before the reset observation


@dataclass
class FactoryState:
    """One rollout's instance, what its reset said, and its prompt as the reward functions see it."""

    spec: EnvSpec
    instance: Any
    addition: Optional[str]
    prompt: Any
    closed: bool = False


class FactoryTool(Tool):
    """A tool method of the factory's classes, dispatched to the rollout's instance; its schema is
    transformers' get_json_schema output, as TRL renders it."""

    def schema(self) -> dict:
        return self.meta["schema"]

    def response_schema(self) -> dict:
        return {"type": "function", **self.meta["schema"]["function"]}


def _dispatch(name: str):
    """The body of tool `name`: the rollout instance's method, answered as TRL's tool loop answers."""

    async def call(state: FactoryState, /, **arguments: Any) -> str:
        if name not in state.spec.tools:
            return str({"error": f"Tool {name} not found."})
        try:
            result = getattr(state.instance, name)(**arguments)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:  # noqa: BLE001 - TRL hands any tool error back to the model
            return str({"error": str(exc)})
        return str(result)

    return call


@dataclass
class _Pool:
    """Free instances of one environment; `made` counts every instance ever made (the probe included)."""

    free: list = field(default_factory=list)
    made: int = 0


class FactoryEnvironment(Environment):
    """TRL `environment_factory` classes and reward functions, as the options name them (module docstring)."""

    name = "environment_factory"
    verifier_version = "1"
    agent = AgentSettings(loop="tool_use", max_steps=8)
    row_type = TRLRow
    # `farm data prepare` checks this agent's rows with an instance made from its env_options
    # (envs/data_rows.py row_types): what a row must hold depends on the factory's reset.
    check_row_needs_options = True

    def __init__(
        self,
        factory: Union[str, dict[str, str], None] = None,
        reward_funcs: Optional[list[str]] = None,
        reward_weights: Optional[list[float]] = None,
    ):
        if not factory:
            raise ConfigError(
                "environment environment_factory needs the option `factory`: 'module:Class' or {name: 'module:Class'}"
            )
        self.multi = isinstance(factory, dict)
        entries = factory.items() if isinstance(factory, dict) else [(None, factory)]
        self.specs: dict[Optional[str], EnvSpec] = {name: load_env_spec(name, path) for name, path in entries}
        self.rewards = _rewards(list(reward_funcs or []), reward_weights)
        if not self.rewards and not any(s.has_reward for s in self.specs.values()):
            raise ConfigError(
                "environment_factory has no reward source: give reward_funcs, or a class with get_reward "
                f"({', '.join(s.label for s in self.specs.values())} has none)"
            )
        self.pools = {name: _Pool([spec.probe], 1) for name, spec in self.specs.items()}
        self._tools: dict[str, FactoryTool] = {}
        for spec in self.specs.values():
            for tool, schema in spec.tools.items():
                if tool not in self._tools:
                    fn = schema["function"]
                    self._tools[tool] = FactoryTool(
                        tool, fn.get("description", ""), fn.get("parameters", {}), _dispatch(tool), {"schema": schema}
                    )
        self.row_tools = {name: list(spec.tools.values()) for name, spec in self.specs.items()}

    def tools(self) -> list[Tool]:
        return list(self._tools.values())

    # -- rows ---------------------------------------------------------------------------------
    def normalize_row(self, row: dict) -> dict:
        """A TRL row as a farm row; with a dict of factories, the tools of the row's environment only
        (in `responses_create_params.tools`, which the agent loop prefers to the environment's)."""
        row = normalize_row(row)
        params = row.get("responses_create_params") if isinstance(row, dict) else None
        tools = self.row_tools.get(_key(row.get("environment"))) if self.multi and isinstance(params, dict) else None
        if tools is None or not isinstance(params, dict):
            return row
        return {**row, "responses_create_params": {**params, "tools": tools}}

    def check_row(self, row: dict) -> FactoryRow:
        parse_row(row, TRLRow)
        name = row.get("environment") if self.multi else None
        spec = self.specs.get(_key(name))
        if spec is None:
            known = ", ".join(repr(n) for n in self.specs)
            raise RowError(f"row has environment={name!r}, not one of the environment_factory's: {known}")
        columns = {k: v for k, v in row.items() if k not in FARM_KEYS}
        columns.setdefault("prompt", row["responses_create_params"]["input"])
        reset_kwargs = {k: v for k, v in columns.items() if k != "environment"} if self.multi else columns
        reward_columns = {k: v for k, v in columns.items() if k not in NOT_REWARD_COLUMNS}
        problem = spec.row_problem(frozenset(reset_kwargs))
        for reward in self.rewards:
            problem = problem or reward.row_problem(frozenset(reward_columns))
        if problem:
            raise RowError(problem)
        return FactoryRow(name, reset_kwargs, reward_columns, columns["prompt"])

    # -- one rollout --------------------------------------------------------------------------
    async def open_state(self, row: FactoryRow, scope: RolloutScope) -> FactoryState:
        spec, pool = self.specs[row.name], self.pools[row.name]
        if pool.free:
            instance = pool.free.pop()
        else:
            instance = self._make(spec)
            pool.made += 1
        try:
            observation = instance.reset(**row.reset_kwargs)
            if inspect.isawaitable(observation):
                observation = await observation
            addition = _text(observation, spec)
        except BaseException as exc:
            pool.free.append(instance)  # the next reset starts it afresh
            if isinstance(exc, RolloutFailure) or not isinstance(exc, Exception):
                raise
            where_reset = located(getattr(spec.cls, "reset"))
            message = f"{spec.cls.__qualname__}.reset ({where_reset}) raised {type(exc).__name__}: {one_line(exc)}"
            raise RolloutFailure(ErrorKind.agent_error, message + where(exc)) from None
        return FactoryState(spec, instance, addition, add_to_prompt(row.prompt, addition))

    def _make(self, spec: EnvSpec) -> Any:
        try:
            return spec.factory()
        except Exception as exc:
            message = f"environment_factory {spec.path} raised {type(exc).__name__}: {one_line(exc)}{where(exc)}"
            raise RolloutFailure(ErrorKind.agent_error, message) from None

    def prompt_addition(self, row: FactoryRow, state: FactoryState) -> Optional[str]:
        return state.addition

    async def close_state(self, state: Optional[FactoryState]) -> None:
        if state is not None and not state.closed:
            state.closed = True
            self.pools[state.spec.name].free.append(state.instance)

    async def verify(self, row: FactoryRow, state: FactoryState, transcript: Transcript) -> Verdict:
        names: dict[str, int] = {}
        sources = []
        for reward in self.rewards:
            names[reward.name] = names.get(reward.name, 0) + 1
            suffix = f"_{names[reward.name]}" if names[reward.name] > 1 else ""
            sources.append(Source.function(reward, reward.name + suffix))
        if state.spec.has_reward:
            sources.append(Source.get_reward(state.instance))
        metrics: dict[str, Any] = {}
        kwargs = trl_arguments(state.prompt, transcript, row.reward_columns, state.instance, metrics)
        return await score(sources, kwargs, metrics)


def _key(name: Any) -> Any:
    """The `environment` column as a key of the factories (a list or a dict is none of them)."""
    return name if isinstance(name, Hashable) else object()


def _rewards(paths: list[str], weights: Optional[list[float]]) -> list[RewardFunc]:
    if weights is not None and len(weights) != len(paths):
        raise ConfigError(
            f"reward_weights has {len(weights)} value(s) for {len(paths)} reward function(s): give one per "
            "reward function (a class's get_reward has weight 1), as GRPOConfig requires"
        )
    return [load_reward(p, float(w)) for p, w in zip(paths, weights or [1.0] * len(paths))]


def _text(observation: Any, spec: EnvSpec) -> Optional[str]:
    """What reset returned, as the text appended to the prompt (None: nothing)."""
    if observation is None or isinstance(observation, str):
        return observation
    if isinstance(observation, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in observation):
        return "".join(p.get("text", "") for p in observation)
    raise RolloutFailure(
        ErrorKind.agent_error,
        f"{spec.cls.__qualname__}.reset ({located(getattr(spec.cls, 'reset'))}) returned a "
        f"{type(observation).__name__}; the farm appends text (a str, or a list of text parts) to the prompt",
    )
