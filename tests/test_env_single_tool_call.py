"""single_tool_call: the weather tool, its verifier on known cases, its data, a smoke run.

The smoke run mixes generated rows with a row in NeMo Gym's own format (tools in the row,
no expected city), to show such rows run through the farm unchanged.
"""

import asyncio

import pytest
from helpers.data import as_row
from helpers.workers import run_through_worker

from envs.data import check_row
from envs.sdk import RowError, Transcript, load_env
from envs.single_tool_call import SingleToolCall, generate, get_weather
from farm.schema import Sampling

# A row as NeMo Gym's example_single_tool_call data has it: the tool in the row, no ground truth.
REFERENCE_ROW = {
    "responses_create_params": {
        "input": [{"role": "user", "content": "what's it like in sf?"}],
        "tools": [
            {
                "type": "function",
                "name": "get_weather",
                "description": "",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
                "strict": True,
            }
        ],
    },
    "agent_ref": {"type": "responses_api_agents", "name": "single_tool_call"},
}


def verify(row, looked_up):
    env = SingleToolCall()
    return asyncio.run(
        env.verify(as_row(env, row), list(looked_up), Transcript(final_text="", output=[], tool_calls=[]))
    )


async def test_the_tool_answers_deterministically_and_records_the_city():
    state = SingleToolCall().new_state(as_row(SingleToolCall(), {}))
    a = await get_weather(state, "Paris")
    b = await get_weather(state, " paris ")
    assert a["temperature_c"] == b["temperature_c"] and a["conditions"] == b["conditions"]
    assert state == ["Paris", " paris "]


@pytest.mark.parametrize(
    "city,looked_up",
    [("Paris", ["Paris"]), ("Tokyo", ["tokyo"]), ("Lima", ["Oslo", " LIMA "]), ("Sydney", ["Sydney", "Sydney"])],
)
def test_full_reward_for_looking_up_the_asked_city(city, looked_up):
    v = verify({"expected_city": city}, looked_up)
    assert v.reward == 1.0 and v.components == {"called_tool": 1.0, "right_city": 1.0}
    assert v.metrics["lookups"] == len(looked_up)


@pytest.mark.parametrize(
    "city,looked_up", [("Paris", []), ("Paris", ["Berlin"]), ("Lima", ["Limassol"]), ("Oslo", ["Osl"])]
)
def test_no_reward_for_another_city_or_no_lookup(city, looked_up):
    v = verify({"expected_city": city}, looked_up)
    assert v.reward == 0.0 and v.components["right_city"] == 0.0
    assert v.components["called_tool"] == float(bool(looked_up))


def test_a_nemo_gym_row_without_a_city_rewards_calling_the_tool():
    assert verify(REFERENCE_ROW, ["San Francisco"]).reward == 1.0
    v = verify(REFERENCE_ROW, [])
    assert v.reward == 0.0 and v.components == {"called_tool": 0.0}


def test_a_malformed_expected_city_is_an_error_not_a_zero():
    with pytest.raises(RowError, match="expected_city"):
        verify({"expected_city": ["Paris"]}, ["Paris"])


def test_generation_is_deterministic():
    assert generate(12, seed=5) == generate(12, seed=5) == load_env("single_tool_call").generate(12, seed=5)
    assert generate(12, seed=5) != generate(12, seed=6)
    for row in generate(12, seed=5):
        assert check_row(row) == []
        assert row["expected_city"] in row["responses_create_params"]["input"][-1]["content"]


@pytest.mark.slow
@pytest.mark.vllm
def test_worker_runs_generated_and_nemo_gym_rows_against_real_vllm(settings, vllm, model_dir):
    rows = generate(3, seed=11) + [REFERENCE_ROW]
    got = run_through_worker(
        settings, vllm, model_dir, "single_tool_call", rows, sampling=lambda i: Sampling(max_tokens=32, seed=i)
    )
    for r in got:
        assert r.status.value in ("ok", "truncated"), r.error
        assert r.reward in (0.0, 1.0)
        n = len(r.trace.completion())
        assert n > 0 and len(r.trace.completion_logprobs()) == n
    assert all(set(r.reward_components) == {"called_tool", "right_city"} for r in got[:3])
    assert set(got[3].reward_components) == {"called_tool"}


# NeMo Gym's recorded example rollouts (resources_servers/example_single_tool_call/data/
# example_rollouts.jsonl of nemo-gym 0.7.0), as data: the user's prompt, the get_weather calls made,
# NeMo Gym's reward. Its server rewards a rollout that called get_weather (tests/
# test_env_nemo_gym_server_real.py runs it); an earlier release recorded 1.0 for the two that did not.
NEMO_GYM_ROLLOUTS = [
    ("how's the outside?", [], 0.0),
    ("get the weather for 3 cities in the us", [], 0.0),
    ("humidity in sf", ["San Francisco"], 1.0),
    ("what's it like in sf?", ["San Francisco"], 1.0),
    ("going out in sf tn", ["San Francisco"], 1.0),
]


@pytest.mark.parametrize("prompt,cities,nemo_gym_reward", NEMO_GYM_ROLLOUTS)
async def test_nemo_gym_recorded_rollouts(prompt, cities, nemo_gym_reward):
    """The farm rewards a rollout that looked the weather up (these rows name no city), as NeMo Gym
    does: the two that answered without calling the tool score 0 in both."""
    env = SingleToolCall()
    params = {**REFERENCE_ROW["responses_create_params"], "input": [{"role": "user", "content": prompt}]}
    row = as_row(env, {**REFERENCE_ROW, "responses_create_params": params})
    state = env.new_state(row)
    for city in cities:
        await get_weather(state, city)
    got = await env.verify(row, state, Transcript(final_text="", output=[], tool_calls=[]))
    assert got.reward == nemo_gym_reward
