"""The office's tools: NeMo Gym's workplace_assistant names and arguments, over one rollout's Office.

Declared with the SDK's Toolset (toolset.py) in two modules, tools_mail (directory, email,
calendar) and tools_data (analytics, project management, CRM), imported here in that order,
which is the order the model sees them in; `meta["mutates"]` marks the tools that change the
office (MUTATING).
"""

from __future__ import annotations

from typing import Any

# isort: off
from envs.workplace import tools_mail, tools_data  # noqa: F401 - registers the tools, in this order

# isort: on
from envs.workplace.office import Office, ToolError
from envs.workplace.toolset import TOOLS

__all__ = ["MUTATING", "TOOLS", "call"]

MUTATING = frozenset(tool.name for tool in TOOLS if tool.meta.get("mutates"))


def call(office: Office, name: str, arguments: dict) -> Any:
    """Run one tool synchronously (what the verifier's replay and the generator use)."""
    if name not in TOOLS:
        raise ToolError(f"unknown tool {name!r}")
    tool = TOOLS[name]
    return tool.fn(office, **tool.check(arguments))
