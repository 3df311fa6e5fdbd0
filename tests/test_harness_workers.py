"""Harness agents through real `farm worker` processes: real Redis, the worker's gateway, the policy stub.

tests/test_gateway.py runs the gateway and HarnessAgent in one process; here each agent is a
config entry (`harness:` or `command:`) served by `farm worker --agent NAME`, its model a
workers/policy/stub process that answers SmolLM2 token ids as scripted (SmolLM2 rarely calls tools
right, and these tests are about the farm's path, not the model). Checked: the plain openai SDK,
the Agents SDK (Responses API) and a verifiers environment (a command in .venv-verifiers) earn
the reward their row deserves, with negative controls (another city, a wrong number); a harness
that raises is retried, then a failed rollout naming its exception; a harness agent refused at
start-up under policy_kind chat; a running harness rollout cancelled, its model request closed.

The worker imports this module for the raising harness (`test_harness_workers:raising`): its
tests/ directory is put on the worker's PYTHONPATH, so the module and its `helpers` import there
as they do under pytest.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest
import yaml
from helpers import ROOT
from helpers.policies import stub_processes
from helpers.processes import stop
from helpers.waiting import wait_for
from helpers.workers import run_through_worker, spawn_worker, worker_env

from envs.single_tool_call import generate
from envs.verifiers_env import Verifiers
from farm.client import FarmClient
from farm.schema import ErrorKind, Status
from workers.policy.stub import WEATHER_ANSWER, WEATHER_CALL, Script, weather_script
from workers.supervise.stack import policy_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

PYTHONPATH = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
COMPLETIONS = "POST /v1/completions"


async def raising(client, task):
    """A harness that asks the model once (so it is no idle harness), then raises."""
    await client.chat.completions.create(model=task.model, messages=task.messages, tools=task.tools)
    raise LookupError(f"no forecast in {task.row['expected_city']}")


def agents_config(vf_python: str = ".venv-verifiers/bin/python") -> dict:
    return {
        "agents": {
            "weather_sdk": {"harness": "examples.harnesses.plain_sdk:run", "env": "single_tool_call"},
            "weather_agents": {"harness": "examples.harnesses.agents_sdk:run", "env": "single_tool_call"},
            "vf": {"command": [vf_python, "examples/harnesses/verifiers_rubric.py"], "env": "verifiers"},
            "raising": {"harness": f"{__name__}:raising", "env": "single_tool_call"},
        }
    }


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("harness-config") / "workers.yaml"
    path.write_text(yaml.safe_dump(agents_config()))
    return str(path)


@pytest.fixture(scope="module")
def stub(tokenizer, tmp_path_factory):
    """One weather stub for the module: a Hermes call for Paris's weather, then an answer."""
    with stub_processes(weather_script(tokenizer), tmp_path_factory.mktemp("stub"), latency_s=0.01) as start:
        yield start()


def weather_rows() -> list[dict]:
    """Two rows asking for Paris (the scripted call's city: reward 1) and two for other cities (0)."""
    rows = generate(4, seed=3)
    for r in rows[:2]:
        r["expected_city"] = "Paris"
        r["responses_create_params"]["input"][-1]["content"] = "What is the weather in Paris?"
    assert {r["expected_city"] for r in rows[2:]}.isdisjoint({"Paris"})
    return rows


def check_weather_rollouts(got, rows, tokenizer) -> None:
    sampled = (
        tokenizer.encode(WEATHER_CALL) + [tokenizer.eos_id] + tokenizer.encode(WEATHER_ANSWER) + [tokenizer.eos_id]
    )
    for row, r in zip(rows, got):
        assert r.status is Status.ok, r.error
        assert r.reward == float(row["expected_city"] == "Paris"), (row["expected_city"], r.reward_components)
        assert r.reward_components["called_tool"] == 1.0
        assert r.metrics["tool_calls"] == 1 and r.metrics["turns"] == 2
        assert r.metrics["retokenized_tokens"] == 0
        assert r.trace is not None and r.segments == [] and r.trainable
        ids, mask = r.trace.completion(), r.trace.mask()
        assert [i for i, m in zip(ids, mask) if m] == sampled  # the stub's ids, as it sampled them
        assert 0 in mask  # the tool result, inserted by the template, never trained


@pytest.mark.parametrize("agent", ["weather_sdk", "weather_agents"])
def test_sdk_harnesses_earn_the_rows_reward_with_the_sampled_ids(settings, stub, config, model_dir, tokenizer, agent):
    """The plain SDK (Chat Completions) and the Agents SDK (Responses API): one segment of the
    stub's own ids, reward 1 where the row asks for Paris and 0 where it asks for another city."""
    rows = weather_rows()
    got = run_through_worker(settings, stub, model_dir, agent, rows, FARM_CONFIG=config, PYTHONPATH=PYTHONPATH)
    check_weather_rollouts(got, rows, tokenizer)


@pytest.fixture(scope="module")
def verifiers_python() -> str:
    """.venv-verifiers' python, built by scripts/verifiers-venv (a minute or two the first time);
    a skip that says why when it cannot be built, a failure under CI=true."""
    try:
        proc = subprocess.run(
            [str(ROOT / "scripts" / "verifiers-venv")], cwd=ROOT, capture_output=True, text=True, timeout=600
        )
        ok, why = proc.returncode == 0, proc.stderr.strip()[-1000:]
    except (OSError, subprocess.TimeoutExpired) as exc:
        ok, why = False, str(exc)
    if not ok:
        reason = f"scripts/verifiers-venv cannot build .venv-verifiers: {why}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.timeout(720)  # the first run builds .venv-verifiers
def test_verifiers_rubric_through_a_command_grades_right_and_wrong_answers(
    settings, verifiers_python, model_dir, tokenizer, tmp_path
):
    """A verifiers SingleTurnEnv in its own venv, run per rollout by the worker: the stub answers
    one number to every question, so the rubric gives 1 where that is the row's answer, 0 elsewhere,
    and the farm takes its reward and components as they are."""
    rows = Verifiers().generate(4, seed=0)
    said = rows[0]["answer"]
    assert [r["answer"] for r in rows].count(said) < len(rows), "every row has the same answer: no negative control"
    script = Script(token_replies=[tokenizer.encode(said) + [tokenizer.eos_id]], model="stub", max_model_len=4096)
    path = tmp_path / "workers.yaml"
    path.write_text(yaml.safe_dump(agents_config(verifiers_python)))
    with stub_processes(script, tmp_path, latency_s=0.01) as start:
        got = run_through_worker(settings, start(), model_dir, "vf", rows, FARM_CONFIG=str(path), timeout_s=120)
    for row, r in zip(rows, got):
        assert r.status is Status.ok, r.error
        right = float(row["answer"] in said)
        assert r.reward == right, (row["answer"], said, r.reward_components)
        assert r.reward_components == {"contains_answer": right, "exact_answer": float(row["answer"] == said)}
        assert r.metrics["reported_reward"] == right
        assert r.trace is not None and r.segments == [] and r.metrics["retokenized_tokens"] == 0
    assert {r.reward for r in got} == {0.0, 1.0}


def test_a_raising_harness_is_retried_then_fails_naming_its_exception(settings, stub, config, model_dir):
    """Each of 2 attempts asks the model once and raises: then one failed rollout per task, kind
    agent_error, whose message (and each attempt's record) names the exception."""
    rows = generate(2, seed=1)
    before = stub.stats().get(COMPLETIONS, 0)
    got = run_through_worker(
        settings, stub, model_dir, "raising", rows, FARM_CONFIG=config, PYTHONPATH=PYTHONPATH, FARM_MAX_ATTEMPTS="2"
    )
    for row, r in zip(rows, got):
        assert r.status is Status.failed and r.error.kind is ErrorKind.agent_error, r
        raised = f"the harness raised LookupError: no forecast in {row['expected_city']}"
        assert r.error.message == f"failed 2 attempts; last: {raised}", r.error
        assert r.attempt == 2 and [(a.attempt, a.kind, a.error) for a in r.history] == [
            (1, "agent_error", raised),
            (2, "agent_error", raised),
        ]
    assert stub.stats()[COMPLETIONS] - before == 2 * len(rows)  # one model call per attempt


def test_a_harness_agent_under_policy_kind_chat_is_refused_at_start_up(settings, stub, config, model_dir):
    """policy_kind chat gives text, no token ids to train on: `farm worker` says so in one line and
    exits 2 (a config error, never restarted), before it serves anything."""
    env = worker_env(
        settings, FARM_CONFIG=config, FARM_POLICY_KIND="chat", **policy_env(stub.url, stub.served_model_name, model_dir)
    )
    proc = subprocess.run(
        [sys.executable, "-m", "farm", "worker", "--agent", "weather_sdk"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2, out
    assert "Traceback" not in out and len(out.splitlines()) == 1, out
    assert "policy_kind tokens" in out and "'chat'" in out and "weather_sdk" in out, out


def test_a_running_harness_rollout_cancelled_ends_cancelled_and_closes_its_model_call(
    settings, stub, config, model_dir
):
    """Two plain-SDK rollouts waiting on a 60 s model: cancelled through the client, each ends
    `cancelled` within seconds and the stub sees its open request closed (a vLLM would stop
    generating); the worker then drains and exits 0."""
    proc = spawn_worker(
        settings,
        "--agent",
        "weather_sdk",
        FARM_CONFIG=config,
        PYTHONPATH=PYTHONPATH,
        **policy_env(stub.url, stub.served_model_name, model_dir),
    )
    before = stub.stats()
    stub.control(latency_s=60.0)
    try:

        async def main():
            client = FarmClient(settings)
            tasks = [client.task(run_id="cancel", agent="weather_sdk", row=r) for r in generate(2, seed=2)]
            await client.submit(tasks, check_agents=False)  # its worker process is still starting
            await asyncio.to_thread(
                wait_for, lambda: stub.stats()["pending"] == 2, timeout=60, what="2 model calls in flight"
            )
            assert stub.stats()["aborted"] == before["aborted"]  # the negative control: nothing closed yet
            t0 = time.monotonic()
            report = await client.cancel(tasks)
            got = await client.collect(tasks, timeout_s=20)
            took = time.monotonic() - t0
            await client.aclose()
            return report, list(got.values()), took

        report, got, took = asyncio.run(main())
        assert len(report.open) == 2
        for r in got:
            assert r.status is Status.cancelled and r.error.kind is ErrorKind.cancelled, r
            assert r.error.message.startswith("cancelled after"), r.error
        assert took < 5.0, f"cancelled rollouts took {took:.1f}s"
        wait_for(lambda: stub.stats()["aborted"] - before["aborted"] == 2, timeout=5, what="2 aborted model calls")
        assert stub.stats()["pending"] == 0
    finally:
        stub.control(latency_s=0.01)
        out = stop(proc, timeout=30)
    assert proc.returncode == 0, out
