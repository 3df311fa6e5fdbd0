"""The environment SDK: everything an environment imports from the farm.

- `Environment`, `AgentSettings`: the interface the worker drives (setup, tools, new_state,
  verify, aclose) and how its agent loop runs;
- `Row`: the typed shape of a dataset row, subclassed per environment; `normalize_row` reads a row in
  TRL's dataset shape (`prompt` plus columns) as a farm row, `add_to_prompt` appends text to a
  prompt's last message as TRL appends a `reset` observation;
- `Toolset` / `Tool`: tools declared with one decorator, schema from signature and docstring;
- `Transcript`, `Verdict`: what a verifier reads and returns;
- `last_boxed`: answer extraction shared by verifiers;
- `ctx`, `JudgeReply`, `JudgeFailure`, `JudgeConfig`: judges a verifier asks (`await ctx.judge(name,
  messages)`; envs/sdk/judge.py), `judging` to ask them outside a worker;
- `ErrorKind`, `RolloutFailure`: the failure kinds shared by the worker, the client, the
  producer and the dashboard; `ConfigError` for an environment's bad options (the worker exits 2
  with its one line), `where` to name the file and line of the user's code an exception came from.

See docs/write-your-own-environment.md.
"""

from envs.sdk.answers import last_boxed
from envs.sdk.environment import (
    ENTRY_POINT_GROUP,
    AgentSettings,
    Environment,
    LoopKind,
    RolloutScope,
    Transcript,
    Verdict,
    available_envs,
    env_class,
    load_env,
)
from envs.sdk.judge import JudgeConfig, JudgeFailure, JudgeReply, ctx, judging
from envs.sdk.rows import AgentRef, CreateParams, Row, RowError, add_to_prompt, normalize_row, parse_row
from envs.sdk.tools import Tool, ToolArgumentError, Toolset
from farm.errors import ConfigError, RolloutFailure, where
from farm.schema import ErrorKind

__all__ = [
    "ENTRY_POINT_GROUP",
    "AgentRef",
    "AgentSettings",
    "ConfigError",
    "CreateParams",
    "Environment",
    "ErrorKind",
    "JudgeConfig",
    "JudgeFailure",
    "JudgeReply",
    "LoopKind",
    "RolloutScope",
    "Row",
    "RowError",
    "RolloutFailure",
    "Tool",
    "ToolArgumentError",
    "Toolset",
    "Transcript",
    "Verdict",
    "add_to_prompt",
    "available_envs",
    "ctx",
    "env_class",
    "judging",
    "last_boxed",
    "load_env",
    "normalize_row",
    "parse_row",
    "where",
]
