"""Tools: functions the model may call, declared with one decorator.

    TOOLS = Toolset()

    @TOOLS.tool
    async def increment_counter(state: Counter, count: int = 1) -> dict:
        \"\"\"Add an integer to the counter.

        Args:
            count: How much to add.
        \"\"\"

The JSON schema the model sees comes from the signature (types, defaults: a parameter
without a default is required) and the docstring (the first paragraph describes the tool,
the `Args:` section its arguments); `@TOOLS.tool("description", arg="what it is")` gives
them explicitly instead. The first parameter is the rollout's state and is not shown to
the model. A call's arguments are checked against the signature before the function runs
(strictly: `"3"` is not an integer, `true` is not a number); a mismatch is a `TypeError`,
which the agent loop hands back to the model as the tool's result. The decorator returns
the function unchanged, so tests call it directly.
"""

from __future__ import annotations

import inspect
import re
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Optional, Union

import msgspec

__all__ = ["Tool", "Toolset", "ToolArgumentError"]


class ToolArgumentError(TypeError):
    """Arguments that do not fit the tool's signature (a TypeError: the model's mistake, not a crash)."""


@dataclass
class Tool:
    """A function the model may call: its JSON schema and a body over the rollout's state."""

    name: str
    description: str
    parameters: dict
    fn: Callable[..., Any]  # fn(state, **arguments) -> str | JSON value, sync or async
    meta: dict[str, Any] = field(default_factory=dict)
    arguments: Optional[type[msgspec.Struct]] = None  # what the arguments are checked against (@Toolset.tool)

    def schema(self) -> dict:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def response_schema(self) -> dict:
        """The tool as a Responses API row writes it (`responses_create_params.tools`)."""
        return {"type": "function", "name": self.name, "description": self.description, "parameters": self.parameters}

    def check(self, arguments: dict) -> dict:
        """The arguments, checked against the signature; ToolArgumentError names what is wrong."""
        if not isinstance(arguments, dict):
            raise ToolArgumentError(f"arguments must be an object, got {type(arguments).__name__}")
        if self.arguments is None:
            return arguments
        try:
            value: msgspec.Struct = msgspec.convert(arguments, self.arguments, strict=True)
        except msgspec.ValidationError as exc:
            raise ToolArgumentError(_readable(str(exc))) from None
        return {name: getattr(value, name) for name in self.arguments.__struct_fields__ if name in arguments}

    async def __call__(self, state: Any, arguments: dict) -> Any:
        result = self.fn(state, **self.check(arguments))
        if inspect.isawaitable(result):
            result = await result
        return result


class Toolset:
    """One environment's tools, in declaration order: the registry every environment uses."""

    def __init__(self, check_types: bool = True) -> None:
        """`check_types=False`: calls are checked for unknown and missing arguments only, and the
        tools check their own argument types (to accept more than the schema says, e.g. an id
        given as a number where the schema asks for a string)."""
        self._tools: dict[str, Tool] = {}
        self.check_types = check_types

    def tool(
        self,
        description: Union[str, Callable, None] = None,
        *,
        tool_name: Optional[str] = None,
        meta: Optional[dict] = None,
        **arg_docs: str,
    ):
        """Register a function as a tool: bare `@tools.tool`, or `@tools.tool("what it does", arg="what
        arg is", ...)`; `tool_name` renames it, `meta` is kept on the Tool for the environment's use."""
        if callable(description):
            return self._register(description, None, tool_name, meta, arg_docs)

        def register(fn: Callable) -> Callable:
            return self._register(fn, description, tool_name, meta, arg_docs)

        return register

    def add(self, tool: Tool) -> Tool:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is declared twice")
        self._tools[tool.name] = tool
        return tool

    def _register(
        self,
        fn: Callable,
        description: Optional[str],
        name: Optional[str],
        meta: Optional[dict],
        arg_docs: dict[str, str],
    ) -> Callable:
        self.add(
            from_function(
                fn, description=description, name=name, meta=meta, arg_docs=arg_docs, check_types=self.check_types
            )
        )
        return fn

    def __iter__(self):
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def names(self) -> list[str]:
        return list(self._tools)

    def list(self) -> list[Tool]:
        return list(self._tools.values())


_MSGSPEC_WORDS = (
    ("Object contains unknown field", "unknown argument"),
    ("Object missing required field", "missing required argument"),
    (" - at `$.", " - argument `"),
)


def _readable(message: str) -> str:
    """msgspec's validation message in the words of a tool call (arguments, not fields)."""
    for theirs, ours in _MSGSPEC_WORDS:
        message = message.replace(theirs, ours)
    return message


def from_function(
    fn: Callable,
    *,
    description: Optional[str] = None,
    name: Optional[str] = None,
    meta: Optional[dict] = None,
    arg_docs: Optional[dict[str, str]] = None,
    check_types: bool = True,
) -> Tool:
    """A Tool whose schema and argument check come from `fn`'s signature and docstring."""
    summary, doc_args = parse_docstring(inspect.getdoc(fn) or "")
    docs = {**doc_args, **(arg_docs or {})}
    hints = typing.get_type_hints(fn, include_extras=True)
    params = list(inspect.signature(fn).parameters.values())[1:]  # the first is the rollout's state
    unknown = set(docs) - {p.name for p in params}
    if unknown:
        raise TypeError(f"tool {fn.__name__}: documented arguments not in its signature: {sorted(unknown)}")
    fields, loose = [], []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"tool {fn.__name__}: *args/**kwargs cannot be described to a model")
        kind = hints.get(p.name, Any)
        if p.name in docs:
            kind = Annotated[kind, msgspec.Meta(description=docs[p.name])]
        fields.append((p.name, kind) if p.default is p.empty else (p.name, kind, p.default))
        loose.append((p.name, Any) if p.default is p.empty else (p.name, Any, p.default))
    struct = msgspec.defstruct(f"{fn.__name__}_arguments", fields, kw_only=True, forbid_unknown_fields=True)
    checked = (
        struct
        if check_types
        else msgspec.defstruct(f"{fn.__name__}_arguments", loose, kw_only=True, forbid_unknown_fields=True)
    )
    return Tool(
        name=name or fn.__name__,
        description=description or summary,
        parameters=json_schema(struct),
        fn=fn,
        meta=dict(meta or {}),
        arguments=checked,
    )


def json_schema(struct: type) -> dict:
    """The arguments' JSON schema, flattened for a model: no `$ref`, no title, optional means not required."""
    schema = msgspec.json.schema(struct)
    body = dict(schema["$defs"][schema["$ref"].rsplit("/", 1)[1]])
    body.pop("title", None)
    properties = {}
    for key, prop in body.get("properties", {}).items():
        prop = dict(prop)
        options = prop.get("anyOf")
        if options and {"type": "null"} in options and key not in body.get("required", ()):
            rest = [o for o in options if o != {"type": "null"}]
            prop.pop("anyOf")
            prop.update(rest[0] if len(rest) == 1 else {"anyOf": rest})
        if prop.get("default", 0) is None:
            prop.pop("default")
        properties[key] = prop
    body["properties"] = properties
    body.setdefault("required", [])
    return body


_ARG_LINE = re.compile(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(the first paragraph, {argument: description} from a Google-style `Args:` section)."""
    summary = " ".join(doc.split("\n\n", 1)[0].split())
    args: dict[str, str] = {}
    lines = doc.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() in ("Args:", "Arguments:"))
    except StopIteration:
        return summary, args
    current = None
    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        if not line.startswith((" ", "\t")):
            break
        m = _ARG_LINE.match(line)
        if m and len(line) - len(line.lstrip()) <= 4 + (len(lines[start]) - len(lines[start].lstrip())):
            current = m.group(1)
            args[current] = m.group(2).strip()
        elif current:
            args[current] = f"{args[current]} {line.strip()}"
    return summary, args
