"""session_state: a counter that lives for one rollout and changes only through tool calls.

It is the smallest environment whose reward depends on state the tools build up, the
pattern of bigger ones (a database, a sandbox): the verifier reads the state the rollout
left behind, never the model's claims about it. It mirrors NeMo Gym's
`example_session_state_mgmt` server, so that server's rows load here unchanged.

Data: "add 4 then add 3 then get the count" rows; `initial_count` seeds the counter and
`expected_count` is initial_count plus the additions. Generated offline from a seed.
Tools: increment_counter(count=1) adds to the counter (NeMo Gym names the argument
`count`; `amount` is accepted as well); get_counter_value() reads it.
Verifier: reward 1 when the counter holds `expected_count` at the end, else 0; a row
without an integer `expected_count` is an error (a `verifier` failure), not a 0.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Optional

from envs.sdk import AgentSettings, Environment, Row, Toolset, Transcript, Verdict

SYSTEM = (
    "You keep a counter through tools. Call increment_counter to add to it and get_counter_value to "
    "read it, then answer with the final value."
)


@dataclass
class Counter:
    """One rollout's state: new_state builds a fresh one per rollout, so rollouts never share it."""

    value: int = 0
    increments: int = 0
    reads: int = 0


TOOLS = Toolset()


class CounterRow(Row):
    """A session_state row: the counter's start and the value the tools must leave it at."""

    expected_count: int
    initial_count: int = 0


@TOOLS.tool
async def increment_counter(state: Counter, count: Optional[int] = None, amount: Optional[int] = None) -> dict:
    """Add an integer to the counter (default 1).

    Args:
        count: How much to add.
        amount: How much to add (another name for count).
    """
    if count is not None and amount is not None:
        raise TypeError("give either count or amount, not both")
    step = count if count is not None else amount
    state.value += 1 if step is None else step
    state.increments += 1
    return {"success": True}


@TOOLS.tool
async def get_counter_value(state: Counter) -> dict:
    """Read the counter's current value."""
    state.reads += 1
    return {"count": state.value}


def _last_integer(text: str) -> Optional[int]:
    found = re.findall(r"-?\d+", text or "")
    return int(found[-1]) if found else None


class SessionState(Environment):
    name = "session_state"
    verifier_version = "1"
    agent = AgentSettings(loop="tool_use", max_steps=6, sampling={"max_tokens": 128})
    row_type = CounterRow
    toolset = TOOLS

    def new_state(self, row: CounterRow) -> Counter:
        return Counter(value=row.initial_count)

    async def verify(self, row: CounterRow, state: Counter, transcript: Transcript) -> Verdict:
        expected = row.expected_count
        right = state.value == expected
        return Verdict(
            reward=1.0 if right else 0.0,
            components={"called_tool": float(state.increments + state.reads > 0), "right_count": float(right)},
            metrics={
                "counter": state.value,
                "increments": state.increments,
                "reads": state.reads,
                "answered_count": _last_integer(transcript.final_text) == state.value,
            },
        )

    def generate(self, size: int, seed: int = 0) -> list[dict]:
        return generate(size, seed)


def generate(size: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    tools = [t.response_schema() for t in TOOLS]
    rows = []
    for _ in range(size):
        initial = rng.randint(0, 9)
        adds = [rng.randint(1, 9) for _ in range(rng.randint(1, 3))]
        ask = " then ".join(f"add {a}" for a in adds) + " then get the count"
        rows.append(
            {
                "responses_create_params": {
                    "input": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ask}],
                    "tools": tools,
                },
                "agent_ref": {"type": "responses_api_agents", "name": "session_state"},
                "initial_count": initial,
                "expected_count": initial + sum(adds),
            }
        )
    return rows
