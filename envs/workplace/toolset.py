"""The office's Toolset, shared by the tool modules: declared with the SDK's decorator, the schema
comes from each signature and the argument notes in its decorator."""

from __future__ import annotations

from envs.sdk import Toolset

TOOLS = Toolset(check_types=False)  # the checks accept ids as numbers, enum values in any case
WRITES = {"mutates": True}  # meta of the tools that change the office

DATE = "Format: YYYY-MM-DD"
STAMP = "Format: YYYY-MM-DD HH:MM:SS"
