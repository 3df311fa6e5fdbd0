"""The `single_tool_call` scenario against the stub: the policy asks for the weather in Paris
with a Hermes tool call, then answers; every row asks for Paris, so a right rollout earns
reward 1. The concurrency benchmark and the tests at scale and under chaos run it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.policy.stub.model import Script

if TYPE_CHECKING:
    from workers.policy.chat import ChatTokenizer

WEATHER_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER_ANSWER = "It is sunny in Paris, 21 degrees."


def weather_script(tok: ChatTokenizer) -> Script:
    """The policy's two turns, as token ids ending in EOS (so the worker sees finished turns)."""
    return Script(
        token_replies=[tok.encode(WEATHER_CALL) + [tok.eos_id], tok.encode(WEATHER_ANSWER) + [tok.eos_id]],
        model="stub",
        max_model_len=4096,
    )


def weather_rows(n: int) -> list[dict]:
    """`n` single_tool_call rows, each asking for the weather in Paris."""
    from envs.single_tool_call import generate

    out = generate(n, seed=0)
    for r in out:  # every row asks for Paris, so a right rollout earns reward 1
        r["responses_create_params"]["input"][-1]["content"] = "What is the weather in Paris?"
        r["expected_city"] = "Paris"
    return out
