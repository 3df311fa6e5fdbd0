"""OpenEnv through the farm: a real `farm worker` process serving an agent configured as

    agents: {openenv_echo: {environment_factory: "envs.openenv:EchoToolEnv"}}

against OpenEnv's echo server (openenv-core's app in .venv-openenv, tests/test_openenv.py says
more) and the policy stub, which answers SmolLM2 ids as scripted: a call of `echo` with "Hello
World!", then an answer (SmolLM2 rarely writes a tool call right; these tests are about the farm's
path). Rows are in TRL's shape ({"prompt": [messages]}), as GRPOTrainer takes them.

Checked: every rollout completes with the reward the OpenEnv server computed (1.2: 0.1 per
character of the echoed message) as the class's get_reward source, the server's echo inserted as
the tool's answer and never trained on; 8 rows through a worker of 4 slots on a server that holds
only 4 sessions, so each in-flight rollout holds one session and instances are reused across
rollouts (a fifth session would be refused); and the negative control: with no server at the URL,
every rollout fails with the reset's one-line error naming the URL, never a reward.
"""

from __future__ import annotations

import socket

import pytest
import yaml
from helpers.openenv import BUILD_TIMEOUT_S, openenv_python
from helpers.policies import hermes, stub_processes
from helpers.workers import run_through_worker

from envs.openenv import URL_VARIABLE, ServerSettings, echo_server
from farm.schema import ErrorKind, Status
from workers.policy.stub import Script

pytestmark = [pytest.mark.slow, pytest.mark.timeout(BUILD_TIMEOUT_S + 300)]

AGENT = "openenv_echo"
SLOTS = 4  # run_through_worker's --concurrency
CALL = hermes("echo", {"message": "Hello World!"})
ANSWER = "The environment echoed Hello World!"
ROW = {"prompt": [{"role": "user", "content": "Try to echo 'Hello World!' in the environment."}]}


@pytest.fixture(scope="module")
def echo(tmp_path_factory):
    python = openenv_python()
    log = tmp_path_factory.mktemp("openenv") / "echo.log"
    with echo_server(ServerSettings(port=0, max_sessions=SLOTS, python=python, log=log)) as server:
        yield server


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("openenv-config") / "farm.yaml"
    path.write_text(yaml.safe_dump({"agents": {AGENT: {"environment_factory": "envs.openenv:EchoToolEnv"}}}))
    return str(path)


@pytest.fixture(scope="module")
def stub(tokenizer, tmp_path_factory):
    script = Script(token_replies=[tokenizer.encode(t) + [tokenizer.eos_id] for t in (CALL, ANSWER)], model="stub")
    with stub_processes(script, tmp_path_factory.mktemp("stub"), latency_s=0.01) as start:
        yield start()


def test_a_worker_serves_the_openenv_class_with_the_servers_reward(settings, echo, config, stub, model_dir, tokenizer):
    rows = [ROW] * (2 * SLOTS)
    got = run_through_worker(settings, stub, model_dir, AGENT, rows, FARM_CONFIG=config, **{URL_VARIABLE: echo.url})
    sampled = tokenizer.encode(CALL) + [tokenizer.eos_id] + tokenizer.encode(ANSWER) + [tokenizer.eos_id]
    for r in got:
        assert r.status is Status.ok, r.error
        assert r.reward == pytest.approx(1.2) and r.reward_components == {"EchoToolEnv": pytest.approx(1.2)}
        assert r.metrics["tool_calls"] == 1 and r.metrics["turns"] == 2
        ids, mask = r.trace.completion(), r.trace.mask()
        assert [i for i, m in zip(ids, mask) if m] == sampled  # the stub's ids, as it sampled them
        inserted = tokenizer.decode([i for i, m in zip(ids, mask) if not m])
        assert "Hello World!" in inserted  # the server's echo, the tool's answer, never trained


def test_with_no_server_every_rollout_fails_naming_the_url_never_a_reward(settings, config, stub, model_dir):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    rows = [ROW] * 2
    got = run_through_worker(
        settings, stub, model_dir, AGENT, rows, FARM_CONFIG=config, FARM_MAX_ATTEMPTS="1", **{URL_VARIABLE: url}
    )
    for r in got:
        assert r.status is Status.failed and r.error.kind is ErrorKind.agent_error, r
        assert r.reward is None, r.reward
        assert "EchoToolEnv.reset" in r.error.message and f"{url.replace('http', 'ws')}/ws" in r.error.message
        assert "cannot connect" in r.error.message and "\n" not in r.error.message, r.error.message
