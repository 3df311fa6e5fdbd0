"""The `environment_factory` environment (envs/factory): TRL classes and reward functions loaded and
checked (each bad input one line naming the class or function and its file:line), instances pooled,
tool calls dispatched to the rollout's instance as TRL answers them, rewards weighted as TRL weighs
them and a broken reward a `verifier` failure, rows in TRL's shape read wherever rows enter.

The classes are tests/helpers/trl_envs.py's; tests/test_factory_loop.py runs them through the agent
loop, tests/test_factory_trl.py against TRL's own GRPOTrainer, tests/test_factory_worker.py in a
worker process.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import pytest
from helpers import ROOT
from helpers import trl_envs as helpers_envs

from envs.data import DataError, row_types, run_prepare
from envs.factory import FactoryEnvironment
from envs.sdk import ConfigError, RowError, Transcript, load_env, normalize_row
from farm.agent_config import AgentConfig
from farm.errors import RolloutFailure
from farm.schema import ErrorKind
from workers.loops.env_calls import call_tool, read_row, verify

HELPERS = Path(helpers_envs.__file__)
EXAMPLE = ROOT / "examples" / "trl_envs"
PROMPT = [{"role": "user", "content": "Bring the counter to the target."}]


def line_of(text: str) -> str:
    """`file:line` of the first line of tests/helpers/trl_envs.py that starts with `text` (found in the
    file, not through inspect, which the code under test uses)."""
    for n, line in enumerate(HELPERS.read_text().splitlines(), 1):
        if line.strip().startswith(text):
            return f"{HELPERS}:{n}"
    raise AssertionError(text)


def factory_env(factory="helpers.trl_envs:Counter", rewards=(), weights=None) -> FactoryEnvironment:
    env = load_env(
        "environment_factory", {"factory": factory, "reward_funcs": list(rewards), "reward_weights": weights}
    )
    assert isinstance(env, FactoryEnvironment)
    return env


def trl_row(**columns) -> dict:
    return {"prompt": PROMPT, **columns}


def checked(env, row):
    return env.check_row(env.normalize_row(row))


# -- loading ----------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["helpers.trl_envs:Counter", "helpers.trl_envs:make_counter"])
def test_a_class_or_a_factory_function_gives_its_public_methods_as_tools_with_transformers_schemas(path):
    from transformers.utils import get_json_schema

    env = factory_env(path)
    probe = env.specs[None].probe
    assert [t.name for t in env.tools()] == ["double", "fail", "increment"]  # TRL's order: getmembers, sorted
    assert [t.schema() for t in env.tools()] == [
        get_json_schema(getattr(probe, n)) for n in ("double", "fail", "increment")
    ]
    assert env.specs[None].has_reward and env.pools[None].free == [probe]  # the probe is the pool's first


BAD_FACTORIES = [
    ("helpers.trl_envs:NoReset", ["NoReset", line_of("class NoReset"), "has no reset method"]),
    (
        "helpers.trl_envs:Undocumented",
        ["tool Undocumented.look", line_of("def look(self, where: str)"), "no docstring"],
    ),
    ("helpers.trl_envs:Unhinted", ["tool Unhinted.look", line_of("def look(self, where) ->"), "type hint"]),
    ("helpers.trl_envs:Exploding", ["helpers.trl_envs:Exploding", "raised OSError: no such device", str(HELPERS)]),
    ("helpers.trl_envs:Nowhere", ["helpers.trl_envs:Nowhere", str(HELPERS), "has no 'Nowhere'"]),
    ("helpers.no_such_module:Counter", ["no module 'helpers.no_such_module'", "looked in PYTHONPATH"]),
    ("Counter", ["'Counter'", "give an import path, 'module:Class' or 'module:function'"]),
]


@pytest.mark.parametrize("path,words", BAD_FACTORIES, ids=[p for p, _ in BAD_FACTORIES])
def test_a_factory_trl_would_refuse_is_one_line_naming_the_class_and_its_file_and_line(path, words):
    with pytest.raises(ConfigError) as err:
        factory_env(path, rewards=["helpers.trl_envs:exact"])
    message = str(err.value)
    assert "\n" not in message, message
    for word in words:
        assert word in message, (word, message)


BAD_REWARDS = [
    (["helpers.trl_envs:takes_nothing_extra"], None, ["takes_nothing_extra", line_of("def takes_nothing_extra")]),
    (["helpers.trl_envs:exact"], [1.0, 2.0], ["reward_weights has 2 value(s) for 1 reward function(s)"]),
    (["helpers.trl_envs:nothing"], None, ["reward function helpers.trl_envs:nothing", "has no 'nothing'"]),
]


@pytest.mark.parametrize("rewards,weights,words", BAD_REWARDS)
def test_a_reward_function_trl_could_not_call_is_one_line_naming_it(rewards, weights, words):
    with pytest.raises(ConfigError) as err:
        factory_env(rewards=rewards, weights=weights)
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message, (word, message)
    if rewards == ["helpers.trl_envs:takes_nothing_extra"]:
        assert "no 'completion_ids', 'trainer_state', 'log_extra', 'log_metric', 'environments'" in message
        assert "add **kwargs" in message


def test_no_reward_source_and_no_factory_are_refused():
    with pytest.raises(ConfigError, match=r"no reward source: .*Echo \(.*trl_envs.py:\d+\) has none"):
        factory_env("helpers.trl_envs:Echo")
    with pytest.raises(ConfigError, match="needs the option `factory`"):
        load_env("environment_factory")
    factory_env("helpers.trl_envs:StrictReset")  # get_reward alone is a reward source, as in TRL


# -- rows -------------------------------------------------------------------------------------
def test_trl_rows_are_farm_rows_with_every_column_kept():
    row = trl_row(target=3, level="easy")
    assert normalize_row(row) == {**row, "responses_create_params": {"input": PROMPT}}
    assert normalize_row({"prompt": "2+2?", "x": 1})["responses_create_params"] == {"input": "2+2?"}
    farm_row = {"responses_create_params": {"input": "q"}, "prompt": "other"}
    assert normalize_row(farm_row) is farm_row  # a farm row is taken as it is
    assert normalize_row({"x": 1}) == {"x": 1} and normalize_row([1]) == [1]


def test_reset_gets_the_rows_columns_and_reward_functions_the_rest_but_the_prompt():
    env = factory_env(rewards=["helpers.trl_envs:exact"])
    row = checked(env, {**trl_row(target=3), "agent_ref": {"name": "counter"}})
    assert row.reset_kwargs == {"prompt": PROMPT, "target": 3}  # the farm's own fields are not TRL's columns
    assert row.reward_columns == {"target": 3}
    nemo = checked(env, {"responses_create_params": {"input": PROMPT}, "target": 2})
    assert nemo.reset_kwargs == {"prompt": PROMPT, "target": 2}  # a NeMo Gym row's input is its prompt


BAD_ROWS = [
    ("helpers.trl_envs:Counter", [], {}, ["Counter.reset", line_of("def reset(self, target: int"), "'target'"]),
    ("helpers.trl_envs:StrictReset", [], {"target": 1}, ["StrictReset.reset", "unexpected keyword argument 'prompt'"]),
    ("helpers.trl_envs:Counter", ["helpers.trl_envs:needs_answer"], {"target": 1}, ["needs_answer", "'answer'"]),
    (
        "helpers.trl_envs:Counter",
        ["helpers.trl_envs:strict_columns"],
        {"target": 1, "level": 2},
        ["strict_columns", line_of("def strict_columns"), "no 'level'"],
    ),
]


@pytest.mark.parametrize("factory,rewards,columns,words", BAD_ROWS)
def test_a_row_that_does_not_fit_reset_or_a_reward_function_is_a_row_error_naming_it(factory, rewards, columns, words):
    env = factory_env(factory, rewards=rewards)
    with pytest.raises(RowError) as err:
        checked(env, trl_row(**columns))
    for word in words:
        assert word in str(err.value), (word, str(err.value))
    row = env.normalize_row(trl_row(**columns))
    with pytest.raises(RolloutFailure) as failure:  # in the worker: malformed, before any model call
        read_row(env, row)
    assert failure.value.kind is ErrorKind.malformed


def test_farm_data_prepare_reads_trl_rows_and_checks_them_against_reset(tmp_path):
    cfg = msgspec.convert(
        {"environment_factory": "helpers.trl_envs:Counter", "reward_funcs": ["helpers.trl_envs:exact"]}, AgentConfig
    )
    src = tmp_path / "rows.jsonl"
    src.write_text(json.dumps(trl_row(target=2)) + "\n" + json.dumps(trl_row(goal=2)) + "\n")
    with pytest.raises(DataError) as err:
        run_prepare(src, agent="counter", output=tmp_path / "out.jsonl", row_type_of=row_types({"counter": cfg}))
    [bad] = err.value.errors
    assert bad.line == 2 and "Counter.reset" in bad.message and line_of("def reset(self, target: int") in bad.message
    src.write_text(json.dumps(trl_row(target=2)) + "\n")
    run_prepare(src, agent="counter", output=tmp_path / "out.jsonl", row_type_of=row_types({"counter": cfg}))
    [written] = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert written == {
        **trl_row(target=2),
        "responses_create_params": {"input": PROMPT},
        "agent_ref": {"type": "responses_api_agents", "name": "counter"},
    }


def test_the_cli_prepares_the_example_rows_and_refuses_a_row_reset_cannot_take(tmp_path, capsys, monkeypatch):
    from farm.cli import main

    monkeypatch.setenv("FARM_CONFIG", str(EXAMPLE / "farm.yaml"))
    out = tmp_path / "prepared.jsonl"
    assert main(["data", "prepare", str(EXAMPLE / "rows.jsonl"), "--agent", "arithmetic", "-o", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 32
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": PROMPT, "a": 1}) + "\n")
    capsys.readouterr()
    assert main(["data", "prepare", str(bad), "--agent", "arithmetic", "-o", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert "line 1: row does not fit Calculator.reset" in err[0] and "missing a required argument: 'b'" in err[0]
    assert err[-1] == f"farm: {bad}: 1 row invalid; nothing written"


def test_a_dict_of_factories_routes_by_the_environment_column_with_that_environments_tools_only():
    env = factory_env(
        {"counter": "helpers.trl_envs:Counter", "echo": "helpers.trl_envs:Echo"}, ["helpers.trl_envs:abstains"]
    )
    assert [t.name for t in env.tools()] == ["double", "fail", "increment", "echo"]
    row = env.normalize_row(trl_row(environment="echo"))
    assert [t["function"]["name"] for t in row["responses_create_params"]["tools"]] == ["echo"]
    typed = env.check_row(row)
    assert typed.name == "echo" and "environment" not in typed.reset_kwargs  # not forwarded to reset, as in TRL
    assert typed.reward_columns == {"environment": "echo"}  # but a column the reward functions get
    with pytest.raises(RowError, match=r"environment='nope', not one of the environment_factory's: 'counter', 'echo'"):
        env.check_row(env.normalize_row(trl_row(environment="nope")))


def test_the_agent_config_maps_environment_factory_to_the_environment_and_its_options():
    cfg = msgspec.convert(
        {"environment_factory": {"a": "m:A"}, "reward_funcs": ["m:f"], "reward_weights": [0.5]}, AgentConfig
    )
    assert cfg.env == "environment_factory"
    assert cfg.env_options == {"factory": {"a": "m:A"}, "reward_funcs": ["m:f"], "reward_weights": [0.5]}
    for bad, words in [
        ({}, "needs `env`"),
        ({"env": "math", "environment_factory": "m:A"}, "leave out `env: math`"),
        ({"env": "math", "reward_funcs": ["m:f"]}, "go with environment_factory"),
    ]:
        with pytest.raises(msgspec.ValidationError, match=words):
            msgspec.convert(bad, AgentConfig)


# -- pooling ----------------------------------------------------------------------------------
async def test_instances_are_made_once_and_reset_per_rollout_no_more_than_were_in_flight():
    env = factory_env(rewards=["helpers.trl_envs:exact"])
    row = checked(env, trl_row(target=1))
    states = [await env.open_state(row, None) for _ in range(5)]
    assert len({id(s.instance) for s in states}) == 5 and env.pools[None].made == 5
    for s in states:
        await env.close_state(s)
    await env.close_state(states[0])  # closing twice hands it back once
    assert len(env.pools[None].free) == 5
    for _ in range(3):  # waves of 4: every instance comes from the pool
        wave = [await env.open_state(row, None) for _ in range(4)]
        for s in wave:
            await env.close_state(s)
    assert env.pools[None].made == 5 and len(env.pools[None].free) == 5
    assert sum(s.instance.resets for s in states) == 5 + 3 * 4


async def test_a_reset_that_raises_fails_the_rollout_naming_it_and_the_instance_goes_back():
    env = factory_env("helpers.trl_envs:ResetRaises")
    row = checked(env, trl_row())
    with pytest.raises(RolloutFailure) as err:
        await env.open_state(row, None)
    assert err.value.kind is ErrorKind.agent_error
    assert "ResetRaises.reset" in err.value.message and "raised KeyError: 'target'" in err.value.message
    assert len(env.pools[None].free) == 1


# -- tools ------------------------------------------------------------------------------------
async def test_tool_calls_run_on_the_rollouts_instance_and_errors_are_answered_as_trl_answers_them():
    env = factory_env(rewards=["helpers.trl_envs:exact"])
    tools = {t.name: t for t in env.tools()}
    row = checked(env, trl_row(target=4, start=1))
    one, two = await env.open_state(row, None), await env.open_state(row, None)
    metrics = {"bad_tool_calls": 0, "tool_errors": 0}

    async def call(name, arguments, state):
        return await call_tool(tools, name, arguments, state, 5.0, metrics)

    assert await call("increment", {"by": 2}, one) == "3"  # sync, inline
    assert await call("double", {}, one) == "6"  # async, awaited
    assert one.instance.count == 6 and two.instance.count == 1  # each rollout its own instance
    assert await call("fail", {"reason": "x"}, one) == str({"error": "failed: x"})
    answer = await call("increment", {"by": 1, "extra": 2}, one)
    assert answer == str({"error": "Counter.increment() got an unexpected keyword argument 'extra'"})
    assert metrics == {"bad_tool_calls": 0, "tool_errors": 0}  # answered, as TRL answers: the model reads them


async def test_in_a_dict_of_factories_a_tool_the_rollouts_class_lacks_is_not_found_as_in_trl():
    env = factory_env(
        {"counter": "helpers.trl_envs:Counter", "echo": "helpers.trl_envs:Echo"}, ["helpers.trl_envs:abstains"]
    )
    tools = {t.name: t for t in env.tools()}
    state = await env.open_state(checked(env, trl_row(environment="echo")), None)
    assert await tools["echo"](state, {"text": "hi"}) == "hi"
    assert await tools["increment"](state, {"by": 1}) == str({"error": "Tool increment not found."})


# -- rewards ----------------------------------------------------------------------------------
def transcript(answer: str) -> Transcript:
    output = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": answer}]}]
    return Transcript(final_text=answer, output=output, tool_calls=[])


async def scored(env, row, answer, count=None):
    typed = checked(env, row)
    state = await env.open_state(typed, None)
    if count is not None:
        state.instance.count = count
    try:
        return await verify(env, typed, state, transcript(answer), 5.0)
    finally:
        await env.close_state(state)


async def test_the_reward_is_the_weighted_sum_of_the_reward_functions_and_get_reward():
    env = factory_env(rewards=["helpers.trl_envs:exact", "helpers.trl_envs:async_exact"], weights=[0.5, 2.0])
    v = await scored(env, trl_row(target=3), "It is 3", count=3)
    assert v.components == {"exact": 1.0, "async_exact": 1.0, "Counter": 1.0}
    assert v.reward == 0.5 + 2.0 + 1.0 and v.metrics["reward_weights"] == {"exact": 0.5, "async_exact": 2.0}
    v = await scored(env, trl_row(target=3), "It is 4", count=0)
    assert v.reward == 0.0 and v.components == {"exact": 0.0, "async_exact": 0.0, "Counter": 0.0}


async def test_log_extra_and_log_metric_land_in_the_rollouts_metrics():
    env = factory_env(rewards=["helpers.trl_envs:logs"])
    v = await scored(env, trl_row(target=1), "done")
    assert v.metrics["extra/said"] == "done" and v.metrics["metric/calls"] == 2.0
    assert v.reward == 0.5 + 0.0  # logs' 0.5, and the counter is not at its target


async def test_a_source_that_abstains_is_left_out_and_one_that_async_get_reward_is_awaited():
    env = factory_env("helpers.trl_envs:AsyncReward", ["helpers.trl_envs:abstains"])
    v = await scored(env, trl_row(target=1), "x")
    assert v.components == {"AsyncReward": 0.25} and v.reward == 0.25  # None is skipped, as TRL's nansum skips it


BROKEN = [
    ("helpers.trl_envs:Echo", ["helpers.trl_envs:raising"], ["raising", line_of("def raising"), "RuntimeError"]),
    ("helpers.trl_envs:Echo", ["helpers.trl_envs:wordy"], ["wordy", "returned a str, not a number: 'high'"]),
    ("helpers.trl_envs:Echo", ["helpers.trl_envs:two"], ["two", "returned 2 values, not a list of one reward"]),
    ("helpers.trl_envs:Echo", ["helpers.trl_envs:abstains"], ["no reward source scored this rollout", "abstains"]),
    ("helpers.trl_envs:NoneReward", [], ["no reward source scored", "NoneReward.get_reward"]),
    ("helpers.trl_envs:RewardRaises", [], ["RewardRaises.get_reward", "ZeroDivisionError: no steps taken"]),
]


@pytest.mark.parametrize("factory,rewards,words", BROKEN)
async def test_a_reward_that_raises_or_is_not_one_number_fails_the_rollout_as_verifier_never_zero(
    factory, rewards, words
):
    env = factory_env(factory, rewards)
    with pytest.raises(RolloutFailure) as err:
        await scored(env, trl_row(target=1), "1")
    assert err.value.kind is ErrorKind.verifier
    for word in words:
        assert word in err.value.message, (word, err.value.message)


def test_the_row_readers_take_trl_rows(tmp_path, settings):
    """The client's task, `farm collect`'s reader and the trainer's dataset reader all see farm rows."""
    from farm.client import FarmClient
    from producer.output import read_rows
    from trainer.train import load_rows

    client = FarmClient(settings)
    task = client.task(run_id="r", agent="counter", row=trl_row(target=2))
    assert task.row["responses_create_params"] == {"input": PROMPT} and task.row["target"] == 2
    asyncio.run(client.aclose())
    [item] = list(read_rows(str(EXAMPLE / "rows.jsonl"), "arithmetic", 1))
    assert item.row["responses_create_params"]["input"] == item.row["prompt"] and {"a", "b"} <= set(item.row)
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({**trl_row(target=2), "agent_ref": {"name": "counter"}}) + "\n")
    [loaded] = load_rows(path)
    assert loaded["responses_create_params"] == {"input": PROMPT}
    path.write_text(json.dumps(trl_row(target=2)) + "\n")
    with pytest.raises(ValueError, match="farm data prepare --agent NAME"):
        load_rows(path)


def test_the_example_rows_are_the_generators():
    from examples.trl_envs.make_rows import rows

    written = [json.loads(line) for line in (EXAMPLE / "rows.jsonl").read_text().splitlines()]
    assert written == rows(32, seed=0) and rows(8, seed=1) == rows(8, seed=1) != rows(8, seed=2)
