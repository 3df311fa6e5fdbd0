"""Rows: the typed shape of a dataset row, one msgspec Struct per environment.

Every row is a NeMo Gym JSONL row: `responses_create_params` (what the model sees),
an optional `agent_ref` (which agent runs it) and the environment's ground truth at the
top level. An environment declares its ground truth by subclassing `Row`:

    class CounterRow(Row):
        expected_count: int
        initial_count: int = 0

`farm data prepare` checks every row against its environment's Row, and the worker checks a
task's row before it spends a model call on it: a row that does not fit is a `malformed`
failure that names the field. Fields the Row does not declare are kept and ignored, so rows
exported by NeMo Gym, which carry more than any one verifier reads, load unchanged.

A row in TRL's dataset shape (`prompt` plus columns) is read as a farm row by `normalize_row`
(farm/rows.py, re-exported here), and `add_to_prompt` appends an environment's text to the last
message of a prompt the way TRL appends what an `environment_factory` class's `reset` returns.
"""

from __future__ import annotations

from typing import Any, Optional, TypeVar, Union

import msgspec

from farm.rows import normalize_row
from farm.schema import AgentRef

__all__ = ["AgentRef", "CreateParams", "Row", "RowError", "add_to_prompt", "normalize_row", "parse_row"]


class RowError(ValueError):
    """A row that does not fit its environment's Row type; the message names the field."""


class CreateParams(msgspec.Struct, kw_only=True):
    """`responses_create_params`: what the model sees. Other Responses API keys pass through."""

    input: Union[str, list[dict]]
    tools: Optional[list[dict]] = None


class RowAgentRef(AgentRef, frozen=True, forbid_unknown_fields=False):
    """A row's `agent_ref`: the wire's AgentRef (farm.schema), read as leniently as the rest of the row.

    Same fields and defaults, so `row.agent_ref` can go on a Task as it is; keys it does not
    declare are ignored here, where the wire, decoding a Task, refuses them.
    """


class Row(msgspec.Struct, kw_only=True):
    """The fields every environment's rows share."""

    responses_create_params: CreateParams
    agent_ref: Optional[RowAgentRef] = None


R = TypeVar("R", bound=Row)


def parse_row(row: Any, row_type: type[R]) -> R:
    """`row` as `row_type`, strictly typed (no "3" for 3); RowError names the first field that does not fit."""
    try:
        return msgspec.convert(row, row_type, strict=True)
    except msgspec.ValidationError as exc:
        raise RowError(f"row does not fit {row_type.__name__}: {str(exc).replace('$.', '')}") from None


def add_to_prompt(prompt: Any, text: Optional[str]) -> Any:
    """`prompt` with `text` appended to its last message, as TRL appends a `reset` observation: the
    last message is rebuilt (the row's own list is left untouched), a list of content parts gets a
    text part; a text prompt gets the text appended. None or "" leaves the prompt as it is."""
    if not text:
        return prompt
    if isinstance(prompt, str):
        return prompt + text
    if not prompt:
        return [{"role": "user", "content": text}]
    last = prompt[-1]
    content = last.get("content")
    added = content + [{"type": "text", "text": text}] if isinstance(content, list) else (content or "") + text
    return [*prompt[:-1], {**last, "content": added}]
