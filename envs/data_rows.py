"""Reading and checking dataset rows: what `farm data prepare` and `farm data generate` check.

A row is checked as a NeMo Gym row (`responses_create_params` with `input` and optional
`tools`, an `agent_ref`, optional `follow_up_messages`) and, given `row_type_of`, against
the Row type of the environment its agent runs (envs.sdk.Row), so a broken ground truth is
reported by line number before a run. Problems are phrased for a person.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Collection, Iterator, Mapping, Optional

AGENT_TYPE = "responses_api_agents"
ROLES = {"system", "developer", "user", "assistant", "tool"}


@dataclass
class LineError:
    """What is wrong with line `line` of a dataset file, for a person (not an exception: a file's
    errors are collected and reported together). A row that does not fit its Row type raises
    envs.sdk.RowError; its message becomes one of these."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


RowTypeOf = Callable[[str], Optional[Any]]  # a Row type, or an environment that checks rows itself


def row_types(agent_envs: Optional[Mapping[str, Any]] = None) -> RowTypeOf:
    """agent name -> the Row type of the environment serving it (configured agents through
    `agent_envs`: an environment name, or the agent's config, farm.agent_config.AgentConfig; else
    the environment of that name); None for agents without one (`noop`). Each environment class
    is looked up once. An environment whose rows depend on its options (`check_row_needs_options`:
    the TRL factory, whose `reset` says what a row holds) is made once with the agent's env_options,
    and its own `check_row` checks the rows (check_type)."""
    from envs.sdk import available_envs, env_class, load_env

    envs = available_envs()
    found: dict[str, Optional[Any]] = {}

    def of(agent: str) -> Optional[Any]:
        if agent not in found:
            cfg = (agent_envs or {}).get(agent, agent)
            env, options = (cfg, None) if isinstance(cfg, str) else (cfg.env, cfg.env_options)
            cls = env_class(env) if (env in envs or ":" in env) else None
            needs_options = getattr(cls, "check_row_needs_options", False)
            found[agent] = load_env(env, options) if needs_options else getattr(cls, "row_type", None)
        return found[agent]

    return of


def check_row(
    row: object,
    *,
    agents: Optional[Collection[str]] = None,
    need_agent_ref: bool = True,
    row_type_of: Optional[RowTypeOf] = None,
) -> list[str]:
    """What is wrong with one decoded row (empty when nothing), phrased for a person. With
    `row_type_of`, the row is also checked against its agent's environment's Row type."""
    if not isinstance(row, dict):
        return [f"a row must be a JSON object, not {type(row).__name__}"]
    problems = []
    params = row.get("responses_create_params")
    if params is None:
        problems.append("missing `responses_create_params`")
    elif not isinstance(params, dict):
        problems.append("`responses_create_params` must be an object")
    else:
        problems += _check_input(params.get("input"))
        problems += _check_tools(params.get("tools"))
    follow = row.get("follow_up_messages")
    if follow is not None and not (isinstance(follow, list) and all(isinstance(m, (str, dict)) for m in follow)):
        problems.append("`follow_up_messages` must be a list of strings or messages")
    ref = row.get("agent_ref")
    if ref is None:
        if need_agent_ref:
            problems.append("missing `agent_ref` (give --agent NAME to add one)")
    elif not isinstance(ref, dict) or not isinstance(ref.get("name"), str) or not ref["name"]:
        problems.append('`agent_ref` must be {"type": "responses_api_agents", "name": "<agent>"}')
    elif ref.get("type", AGENT_TYPE) != AGENT_TYPE:
        problems.append(f"`agent_ref.type` must be {AGENT_TYPE!r}, not {ref.get('type')!r}")
    elif agents is not None and ref["name"] not in agents:
        problems.append(f"unknown agent_ref name {ref['name']!r}; known: {', '.join(sorted(agents)) or 'none'}")
    elif row_type_of is not None and not problems:
        problems += check_type(row, row_type_of(ref["name"]))
    return problems


def check_type(row: dict, row_type: Optional[Any]) -> list[str]:
    """What keeps `row` from fitting `row_type` (nothing when it fits, or when there is no type);
    `row_type` may be an environment itself (row_types), whose `check_row` then decides."""
    from envs.sdk import RowError, parse_row

    if row_type is None:
        return []
    try:
        if isinstance(row_type, type):
            parse_row(row, row_type)
        else:
            row_type.check_row(row_type.normalize_row(row))
    except RowError as exc:
        return [str(exc)]
    return []


def _check_input(items: object) -> list[str]:
    if isinstance(items, str):
        return [] if items.strip() else ["`responses_create_params.input` is an empty string"]
    if not isinstance(items, list):
        return ["`responses_create_params.input` must be a string or a list of messages"]
    if not items:
        return ["`responses_create_params.input` is empty"]
    for i, m in enumerate(items):
        where = f"`responses_create_params.input[{i}]`"
        if not isinstance(m, dict):
            return [f"{where} must be an object"]
        if m.get("role") not in ROLES:
            return [f"{where} has role {m.get('role')!r}; expected one of {', '.join(sorted(ROLES))}"]
        content = m.get("content", "")
        if not isinstance(content, str) and not (
            isinstance(content, list) and all(isinstance(p, dict) for p in content)
        ):
            return [f"{where}.content must be a string or a list of content parts"]
    return []


def _check_tools(tools: object) -> list[str]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        return ["`responses_create_params.tools` must be a list"]
    for i, t in enumerate(tools):
        fn = t.get("function", t) if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            return [f"`responses_create_params.tools[{i}]` must be a function tool with a name"]
        if not isinstance(fn.get("parameters", {}), dict):
            return [f"`responses_create_params.tools[{i}].parameters` must be a JSON schema object"]
    return []


def decoded_lines(path: str | Path) -> Iterator[tuple[int, object]]:
    """(line number, decoded value or a LineError) for every non-blank line, streamed."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            row = decode_line(n, raw, path)
            if row is not None:
                yield n, row


def decode_line(n: int, raw: bytes, path: str | Path) -> object:
    """Line `n` of `path` decoded; a LineError when it is not UTF-8 JSON, None when blank. Prepare and
    blend share it, so a file one refuses the other refuses too, with the same words."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return LineError(n, f"not UTF-8 text ({exc.reason} at byte {exc.start}) in {path}")
    if not line.strip():
        return None
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        return LineError(n, f"invalid JSON: {exc.msg} at column {exc.colno}")
