"""workplace_assistant: multi-step tool use over a stateful office, scored by the end state.

Data: requests such as "Reschedule my 'Budget review' meeting with Raj to Friday, December 8
at 3pm", each generated offline from a seeded office (office.py) together with
the calls that carry it out. Rows follow NeMo Gym's workplace_assistant: the tools as
Responses-style function tools, `ground_truth` as a list of {name, arguments (a JSON string)},
`id`, `category`, `environment_name`; plus `seed`, the office to build (0 when absent).

Tools: company directory, email, calendar, analytics, project tasks and CRM, over a fresh
office per rollout (new_state builds it from the row's seed).

Verifier: the office the model's calls mutated against a fresh office with the ground-truth
calls replayed; reward 1 when every mutable table ends the same. Reads, failed calls and the
order of independent calls do not change the outcome; a missing, extra or wrong change does.
Records the model created are matched by content, since their ids depend on creation order.
A ground truth that does not replay is a broken row: the verifier raises (a `verifier`
failure), it never scores 0.

`prompt_tools="task"` (a generate() / constructor option) puts only the tools a request needs
into the row, for small-context policies such as SmolLM2 (the full list is ~4k tokens).
"""

from __future__ import annotations

from typing import Any, Optional, Union

from envs.sdk import AgentSettings, Environment, Row, Transcript, Verdict
from envs.workplace.office import TABLES, Office, build_office, snapshot
from envs.workplace.replay import BadGroundTruth, ground_truth_calls, replay
from envs.workplace.tasks import ENV_NAME, PromptTools, generate
from envs.workplace.tools import MUTATING, TOOLS

__all__ = ["BadGroundTruth", "WorkplaceAssistant", "WorkplaceRow", "generate"]


class WorkplaceRow(Row):
    """A workplace_assistant row: the calls that carry out the request (a list, or that list as a
    JSON string) and the seed of the office they run on (0 when absent)."""

    ground_truth: Union[list[Any], str, None] = None
    seed: Optional[int] = None
    id: Any = None
    category: Optional[str] = None
    environment_name: Optional[str] = None


class WorkplaceAssistant(Environment):
    name = ENV_NAME
    agent = AgentSettings(loop="tool_use", max_steps=10, sampling={"max_tokens": 256})
    row_type = WorkplaceRow
    toolset = TOOLS

    def __init__(self, prompt_tools: PromptTools = "all"):
        if prompt_tools not in ("all", "task"):
            raise ValueError(f"prompt_tools must be 'all' or 'task', got {prompt_tools!r}")
        self.prompt_tools = prompt_tools

    def new_state(self, row: WorkplaceRow) -> Office:
        return build_office(row.seed or 0)

    async def verify(self, row: WorkplaceRow, state: Any, transcript: Transcript) -> Verdict:
        truth = ground_truth_calls(row.ground_truth)
        expected = replay(self.new_state(row), truth, strict=True)
        actual = (
            state if isinstance(state, Office) else replay(self.new_state(row), transcript.tool_calls, strict=False)
        )
        got, want = snapshot(actual), snapshot(expected)
        components = {domain: float(got[domain] == want[domain]) for domain in TABLES}
        off = sum(sum(((got[d] - want[d]) + (want[d] - got[d])).values()) for d in TABLES)
        mutating = sum(c.get("name") in MUTATING for c in transcript.tool_calls)
        return Verdict(
            reward=float(off == 0),
            components=components,
            metrics={
                "mutating_calls": mutating,
                "read_calls": len(transcript.tool_calls) - mutating,
                "expected_calls": len(truth),
                "rows_off": off,
            },
        )

    def generate(self, size: int, seed: int = 0) -> list[dict]:
        return generate(size, seed, self.prompt_tools)
