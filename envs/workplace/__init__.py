"""workplace_assistant: multi-step tool use over a stateful office, scored by the end state, as NeMo Gym's.

Data: NeMo Gym's own workplace rows, on NeMo Gym's own tables (`tables=`, a constructor
option, or a row's `tables` field: a directory laid out as NeMo Gym's `csv_data`, see
tables.py), or requests the farm generates offline ("Reschedule my 'Budget review' meeting with
Raj to Friday, December 8 at 3pm") from an office seeded from the row's `seed`. Rows follow
NeMo Gym's: the tools as Responses-style function tools, `ground_truth` as a list of
{name, arguments (a JSON string)}, `id`, `category`, `environment_name`. Which office a row
runs on: its `tables`, else its `seed`, else the environment's `tables`, else seed 0.

Tools: NeMo Gym's 27 (company directory, email, calendar, analytics, project management, CRM)
with its names, arguments, accepted values, result shapes, refusal messages and new-id rule,
plus two read-only tools of the farm's own; over a fresh office per rollout (tools.py).

Verifier (NeMo Gym's is_correct): the office the model's calls left against a fresh office
with the ground-truth calls replayed; reward 1 when every mutable table ends the same, text
compared case-insensitively except status, list_name and board (office.rows_off). Reads and
refused calls change nothing. Kept differences from NeMo Gym, none of which changes one of its
published expectations: records the model created are matched by content, not by their
order-dependent id and row position (office.py); and a ground-truth call that would change the
office but fails, or that is malformed or names an unknown tool, makes the row broken: the
verifier raises (a `verifier` failure) where NeMo Gym skips the call and scores on. A failing
ground-truth call that only reads is skipped, as NeMo Gym skips it (replay.py).

`prompt_tools="task"` (a generate() / constructor option) puts only the tools a request needs
into a generated row, for small-context policies such as SmolLM2 (the full list is ~4k tokens).
"""

from __future__ import annotations

from typing import Any, Optional, Union

from envs.sdk import AgentSettings, Environment, Row, RowError, Transcript, Verdict
from envs.workplace.office import Office, rows_off
from envs.workplace.replay import BadGroundTruth, ground_truth_calls, replay
from envs.workplace.seeded import build_office
from envs.workplace.tables import TablesError, load_tables
from envs.workplace.tasks import ENV_NAME, PromptTools, generate
from envs.workplace.tools import MUTATING, TOOLS

__all__ = ["BadGroundTruth", "WorkplaceAssistant", "WorkplaceRow", "generate", "load_tables"]


class WorkplaceRow(Row):
    """A workplace_assistant row: the calls that carry out the request (a list, or that list as a
    JSON string) and the office they run on: `tables` (NeMo Gym's CSVs) or `seed`."""

    ground_truth: Union[list[Any], str, None] = None
    seed: Optional[int] = None
    tables: Optional[str] = None
    id: Any = None
    category: Optional[str] = None
    environment_name: Optional[str] = None


class WorkplaceAssistant(Environment):
    name = ENV_NAME
    verifier_version = "1"
    agent = AgentSettings(loop="tool_use", max_steps=10, sampling={"max_tokens": 256})
    row_type = WorkplaceRow
    toolset = TOOLS

    def __init__(self, prompt_tools: PromptTools = "all", tables: Optional[str] = None):
        """`tables`: a directory of NeMo Gym's workplace CSVs, the office of rows without `seed` or `tables`."""
        if prompt_tools not in ("all", "task"):
            raise ValueError(f"prompt_tools must be 'all' or 'task', got {prompt_tools!r}")
        self.prompt_tools = prompt_tools
        self.tables = tables
        if tables is not None:
            load_tables(tables)  # read now (once per process): a wrong directory fails at start, not per rollout

    def check_row(self, row: dict) -> Any:
        typed = super().check_row(row)
        if typed.tables is not None:
            try:
                load_tables(typed.tables)
            except (OSError, TablesError) as exc:
                raise RowError(f"row's tables: {exc}") from None
        return typed

    def new_state(self, row: WorkplaceRow) -> Office:
        if row.tables is not None:
            return load_tables(row.tables)
        if row.seed is None and self.tables is not None:
            return load_tables(self.tables)
        return build_office(row.seed or 0)

    async def verify(self, row: WorkplaceRow, state: Any, transcript: Transcript) -> Verdict:
        truth = ground_truth_calls(row.ground_truth)
        skipped: list[int] = []
        expected = replay(self.new_state(row), truth, strict=True, failed=skipped)
        actual = (
            state if isinstance(state, Office) else replay(self.new_state(row), transcript.tool_calls, strict=False)
        )
        differing = rows_off(actual, expected)
        components = {domain: float(n == 0) for domain, n in differing.items()}
        off = sum(differing.values())
        mutating = sum(c.get("name") in MUTATING for c in transcript.tool_calls)
        return Verdict(
            reward=float(off == 0),
            components=components,
            metrics={
                "mutating_calls": mutating,
                "read_calls": len(transcript.tool_calls) - mutating,
                "expected_calls": len(truth),
                "skipped_truth_calls": len(skipped),
                "rows_off": off,
            },
        )

    def generate(self, size: int, seed: int = 0) -> list[dict]:
        return generate(size, seed, self.prompt_tools)
