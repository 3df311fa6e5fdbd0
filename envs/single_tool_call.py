"""single_tool_call: the smallest tool-use environment (one weather lookup).

Data: "What is the weather in <city>?" rows, generated offline from a seed.
Tool: get_weather(city) returns a deterministic forecast for any city name.
Verifier: reward 1 when the model called get_weather for the asked city (case-insensitive),
with components for calling the tool at all and for naming the right city. Rows of NeMo Gym's
`example_single_tool_call` name no city; for them calling get_weather is enough, which is how
NeMo Gym's own example server scores every row (nemo-gym 0.7.0).
"""

from __future__ import annotations

import hashlib
import random
from typing import Optional

from envs.sdk import AgentSettings, Environment, Row, Toolset, Transcript, Verdict

CITIES = ["Paris", "Tokyo", "Lagos", "Lima", "Oslo", "Cairo", "Sydney", "Toronto", "Mumbai", "Berlin"]
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "snowy"]
SYSTEM = "You are a weather assistant. Use the get_weather tool to look up the weather before answering."


TOOLS = Toolset()


class WeatherRow(Row):
    """A single_tool_call row; NeMo Gym's name no city, and calling get_weather is then enough."""

    expected_city: Optional[str] = None


@TOOLS.tool
async def get_weather(state: list, city: str) -> dict:
    """Get the current weather for a city.

    Args:
        city: City name
    """
    h = int(hashlib.sha256(city.strip().lower().encode()).hexdigest(), 16)
    state.append(city)
    return {"city": city, "temperature_c": h % 35 - 5, "conditions": CONDITIONS[h % len(CONDITIONS)]}


class SingleToolCall(Environment):
    name = "single_tool_call"
    verifier_version = "1"
    agent = AgentSettings(loop="tool_use", max_steps=3, sampling={"max_tokens": 96})
    row_type = WeatherRow
    toolset = TOOLS

    def new_state(self, row: WeatherRow) -> list:
        return []  # the cities looked up, in order

    async def verify(self, row: WeatherRow, state: list, transcript: Transcript) -> Verdict:
        expected = row.expected_city
        called = bool(state)
        if expected is None:
            return Verdict(
                reward=float(called), components={"called_tool": float(called)}, metrics={"lookups": len(state)}
            )
        right = any(c.strip().lower() == expected.strip().lower() for c in state)
        return Verdict(
            reward=1.0 if right else 0.0,
            components={"called_tool": float(called), "right_city": float(right)},
            metrics={"lookups": len(state)},
        )

    def generate(self, size: int, seed: int = 0) -> list[dict]:
        return generate(size, seed)


def generate(size: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(size):
        city = rng.choice(CITIES)
        rows.append(
            {
                "responses_create_params": {
                    "input": [
                        {"role": "system", "content": SYSTEM},
                        {"role": "user", "content": f"What is the weather in {city}?"},
                    ]
                },
                "agent_ref": {"type": "responses_api_agents", "name": "single_tool_call"},
                "expected_city": city,
            }
        )
    return rows
