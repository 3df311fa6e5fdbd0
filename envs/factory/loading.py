"""Loading what an `environment_factory` agent names, and checking it as TRL and transformers would.

An import path is `module:Class` or `module:function` (a factory that returns an instance, or a
reward function). Everything TRL 1.16 refuses at `GRPOTrainer(...)`, or that would fail in the
middle of training, is refused here when the worker starts, as one line that names the class or
function and its file:line:

- an import path that does not resolve (where Python looked, as for any environment);
- a class without `reset`;
- a tool method (public, not `reset` / `get_reward`) that transformers' `get_json_schema` cannot
  describe (no docstring, an argument without a type hint or a description): the schema the
  model sees is that function's output, the one `apply_chat_template(tools=[methods])` renders;
- a reward function that cannot take the keyword arguments TRL always passes (`prompts`,
  `completions`, `completion_ids`, `trainer_state`, `log_extra`, `log_metric`, `environments`)
  because it has no `**kwargs` and lacks one of them.

What depends on the data (the row's columns against `reset`'s signature and against the reward
functions' parameters) is checked per row (EnvSpec.row_problem, RewardFunc.row_problem), once per
distinct set of columns, by the environment's `check_row`.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from envs.sdk import ConfigError, where
from envs.sdk.environment import missing_module_hint

__all__ = ["TRL_REWARD_KWARGS", "EnvSpec", "RewardFunc", "import_path", "load_env_spec", "load_reward", "located"]

# The keyword arguments TRL's _calculate_rewards passes every reward function, besides the row's columns.
TRL_REWARD_KWARGS = (
    "prompts",
    "completions",
    "completion_ids",
    "trainer_state",
    "log_extra",
    "log_metric",
    "environments",
)
NOT_TOOLS = ("reset", "get_reward")
CHECKED_SHAPES = 1024  # distinct column sets whose check is remembered


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def located(obj: Any) -> str:
    """`file:line` of a class or function's definition, a module's file ("?" when Python does not know).

    Memoized: finding the line reads and tokenizes the source file (0.1-0.5 ms), and a reward source's
    label is asked for on every rollout's verify (bench/factory_scale.py: a third of the worker's CPU)."""
    try:
        return _located(obj)
    except TypeError:  # an unhashable callable
        return _locate(obj)


@functools.lru_cache(maxsize=1024)
def _located(obj: Any) -> str:
    return _locate(obj)


def _locate(obj: Any) -> str:
    target = inspect.unwrap(obj) if callable(obj) else obj
    try:
        path = inspect.getsourcefile(target) or inspect.getfile(target)
        if inspect.ismodule(target):
            return str(path)
        line = inspect.getsourcelines(target)[1]
    except (OSError, TypeError):
        return "?"
    return f"{path}:{line}"


def import_path(spec: Any, what: str) -> Any:
    """The object `module:attr` names; ConfigError (one line) when it does not resolve."""
    module, sep, attr = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    if not (sep and module and attr):
        raise ConfigError(f"{what} {spec!r}: give an import path, 'module:Class' or 'module:function'")
    try:
        obj: Any = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - whatever the user's module raises on import is theirs, in one line
        hint = missing_module_hint(module, exc) if isinstance(exc, ImportError) else ""
        if hint:
            raise ConfigError(f"{what} {spec}: no module {module!r}{hint}") from None
        raise ConfigError(
            f"{what} {spec} failed to import: {type(exc).__name__}: {one_line(exc)}{where(exc)}"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{what} {spec}: {module} ({located(obj)}) has no {attr!r}")
        obj = getattr(obj, part)
    return obj


@dataclass
class _Shapes:
    """Per distinct set of columns, the problem found (None: none), so a dataset's rows cost one
    check each, not one signature binding per row."""

    seen: dict[frozenset, Optional[str]] = field(default_factory=dict)

    def get(self, columns: frozenset, check: Callable[[], Optional[str]]) -> Optional[str]:
        if columns not in self.seen:
            if len(self.seen) >= CHECKED_SHAPES:
                self.seen.clear()
            self.seen[columns] = check()
        return self.seen[columns]


@dataclass
class EnvSpec:
    """One environment of the factory: how to make an instance, its class, tools and reward."""

    name: Optional[str]  # the `environment` column's value (None: the single environment)
    path: str  # the import path it came from
    factory: Callable[[], Any]
    cls: type
    probe: Any  # the instance made to inspect it (TRL makes one too); the pool's first
    tools: dict[str, dict] = field(default_factory=dict)  # tool name -> get_json_schema output, in TRL's order
    has_reward: bool = False  # the class defines get_reward
    reset: Optional[inspect.Signature] = None
    _shapes: _Shapes = field(default_factory=_Shapes)

    @property
    def label(self) -> str:
        return f"{self.cls.__qualname__} ({located(self.cls)})"

    def row_problem(self, columns: frozenset) -> Optional[str]:
        """Why `reset(**row)` cannot be called with these columns, or None."""
        return self._shapes.get(columns, lambda: self._bind(columns))

    def _bind(self, columns: frozenset) -> Optional[str]:
        if self.reset is None:
            return None
        try:
            self.reset.bind(**dict.fromkeys(columns))
        except TypeError as exc:
            where_reset = located(getattr(self.cls, "reset"))
            return f"row does not fit {self.cls.__qualname__}.reset ({where_reset}): {exc}"
        return None


def load_env_spec(name: Optional[str], path: Any) -> EnvSpec:
    """The environment `path` names, probed once: its reset, its tools' schemas, its get_reward."""
    what = "environment_factory" if name is None else f"environment_factory[{name!r}]"
    factory = import_path(path, what)
    if not callable(factory):
        raise ConfigError(f"{what} {path}: {type(factory).__name__} is not a class or a function")
    try:
        probe = factory()
    except Exception as exc:  # noqa: BLE001 - the user's constructor, in one line
        raise ConfigError(
            f"{what} {path} ({located(factory)}) raised {type(exc).__name__}: {one_line(exc)}{where(exc)}"
        ) from None
    cls = type(probe)
    members = dict(inspect.getmembers(cls, predicate=inspect.isfunction))  # on the class: properties unread
    if "reset" not in members:
        raise ConfigError(
            f"{what} {path}: {cls.__qualname__} ({located(cls)}) has no reset method; "
            "TRL calls reset(**row) before every rollout"
        )
    spec = EnvSpec(name, path, factory, cls, probe, has_reward="get_reward" in members)
    spec.reset = _signature(probe.reset)
    for tool in sorted(n for n in members if not n.startswith("_") and n not in NOT_TOOLS):
        spec.tools[tool] = _schema(cls, getattr(probe, tool))
    return spec


def _schema(cls: type, method: Callable) -> dict:
    """The tool's schema as transformers writes it for TRL, or ConfigError naming the method."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(method)
    except Exception as exc:  # noqa: BLE001 - DocstringParsingException, TypeHintParsingException, ...
        raise ConfigError(
            f"tool {cls.__qualname__}.{method.__name__} ({located(method)}) cannot be described to the model: "
            f"{one_line(exc)} (transformers' get_json_schema, as TRL renders tools; give it a docstring with "
            "an Args: line per argument and a type hint for each)"
        ) from None


def _signature(fn: Callable) -> Optional[inspect.Signature]:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check
        return None


@dataclass
class RewardFunc:
    """A reward function as TRL calls it: keyword arguments only, lists of one entry per completion."""

    name: str
    path: str
    fn: Callable[..., Any]
    weight: float = 1.0
    var_kw: bool = True  # takes **kwargs
    params: frozenset = frozenset()  # what it takes by keyword
    required: frozenset = frozenset()  # what it must be given
    _shapes: _Shapes = field(default_factory=_Shapes)

    @property
    def label(self) -> str:
        return f"reward function {self.path} ({located(self.fn)})"

    def row_problem(self, columns: frozenset) -> Optional[str]:
        """Why TRL's call with these row columns would fail, or None."""
        return self._shapes.get(columns, lambda: self._fits(columns))

    def _fits(self, columns: frozenset) -> Optional[str]:
        given = columns | set(TRL_REWARD_KWARGS)
        missing = sorted(self.required - given)
        if missing:
            return f"{self.label} needs {', '.join(map(repr, missing))}, which the row does not have"
        extra = sorted(columns - self.params) if not self.var_kw else []
        if extra:
            return f"{self.label} takes no **kwargs and no {', '.join(map(repr, extra))}, a column TRL passes it"
        return None


def load_reward(path: Any, weight: float = 1.0) -> RewardFunc:
    """The reward function `path` names, checked to take TRL's keyword arguments."""
    fn = import_path(path, "reward function")
    if not callable(fn):
        raise ConfigError(f"reward function {path}: {type(fn).__name__} is not callable")
    name = getattr(fn, "__name__", None) or str(path).rpartition(":")[2]
    reward = RewardFunc(name, str(path), fn, weight)
    sig = _signature(fn)
    if sig is None:
        return reward
    params = sig.parameters.values()
    positional = [p.name for p in params if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    if positional:
        raise ConfigError(f"{reward.label} has positional-only parameter(s) {positional}: TRL passes keywords")
    keyword = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    reward.var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    reward.params = frozenset(p.name for p in keyword)
    reward.required = frozenset(p.name for p in keyword if p.default is p.empty)
    if not reward.var_kw:
        missing = [k for k in TRL_REWARD_KWARGS if k not in reward.params]
        if missing:
            raise ConfigError(
                f"{reward.label} takes no **kwargs and no {', '.join(map(repr, missing))}, which TRL passes "
                "every reward function: add **kwargs"
            )
    return reward
