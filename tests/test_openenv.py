"""OpenEnv's echo environment, served for real: openenv-core 0.3.0's own FastAPI app in
.venv-openenv (scripts/openenv-venv, scripts/openenv_serve.py), started by envs/openenv/server.py
on 127.0.0.1, and the TRL class envs.openenv.EchoToolEnv against it.

Checked: the class's reset, tool and reward (the reward computed by the server: 0.1 per character,
two lengths as the negative control); one OpenEnv session per instance, up to the server's limit,
past which a reset is one line naming the limit; our client answers as openenv-core's own client
does, in its own venv (and that client is async in 0.3.0: TRL's example's plain `step()` call
gives a coroutine there); the server's start errors, one line each; a server lost under an episode
fails the step and the reward (never a silent 0.0), and the next reset opens a new session on the
restarted server; and TRL 1.16's GRPOTrainer itself scores the class's rollouts with the server's
reward (the farm's path is tests/test_openenv_farm.py).
"""

from __future__ import annotations

import json
import subprocess

import pytest
from helpers.openenv import BUILD_TIMEOUT_S, openenv_python

from envs.openenv import (
    URL_VARIABLE,
    EchoToolEnv,
    OpenEnvClient,
    OpenEnvError,
    OpenEnvServerError,
    ServerSettings,
    echo_server,
)
from envs.openenv.server import ROOT, start

pytestmark = [pytest.mark.slow, pytest.mark.timeout(BUILD_TIMEOUT_S + 300)]

MAX_SESSIONS = 4  # as many as TRL's batch below holds rollouts: one session each


@pytest.fixture(scope="module")
def python() -> str:
    return openenv_python()


@pytest.fixture(scope="module")
def echo(python, tmp_path_factory):
    log = tmp_path_factory.mktemp("openenv") / "echo.log"
    with echo_server(ServerSettings(port=0, max_sessions=MAX_SESSIONS, python=python, log=log)) as server:
        yield server


@pytest.fixture
def make(echo, monkeypatch):
    """EchoToolEnv instances pointed at the module's server; their sessions closed after the test."""
    monkeypatch.setenv(URL_VARIABLE, echo.url)
    made: list[EchoToolEnv] = []

    def new() -> EchoToolEnv:
        made.append(EchoToolEnv())
        return made[-1]

    yield new
    for env in made:
        env.env.close()


def test_reset_starts_an_episode_the_tool_steps_it_and_the_reward_is_the_servers(make):
    env = make()
    assert env.reset(prompt=[{"role": "user", "content": "Echo it."}]) is None  # nothing added to the prompt
    first = env.env.state()
    assert first["step_count"] == 0
    assert env.echo("Hello World!") == "Hello World!"
    assert env.get_reward() == pytest.approx(1.2)  # the server's reward: 0.1 per character
    assert env.echo("hi") == "hi" and env.get_reward() == pytest.approx(0.2)  # another length, another reward
    assert env.env.state() == {**first, "step_count": 2}
    assert env.reset() is None and env.get_reward() == 0.0
    again = env.env.state()
    assert again["step_count"] == 0 and again["episode_id"] != first["episode_id"]  # a new episode


def test_each_instance_is_a_session_of_its_own_up_to_the_servers_limit(make):
    envs = [make() for _ in range(MAX_SESSIONS)]
    for i, env in enumerate(envs):
        env.reset()
        for _ in range(i):
            env.echo("x")
    assert [e.env.state()["step_count"] for e in envs] == list(range(MAX_SESSIONS))  # nothing shared
    extra = make()
    with pytest.raises(OpenEnvError) as refused:
        extra.reset()
    message = str(refused.value)
    assert "\n" not in message and extra.env.url in message, message
    assert f"CAPACITY_REACHED: Server at capacity: {MAX_SESSIONS}/{MAX_SESSIONS} sessions active" in message
    envs[0].env.close()  # a session handed back is free for the next reset
    extra.reset()
    assert extra.echo("ok") == "ok"


def test_the_client_answers_as_openenvs_own_client_does(python, echo):
    """openenv-core's EchoEnv in .venv-openenv and our client, the same calls on the same server."""
    program = """
import inspect, json, sys
from echo_env import EchoAction, EchoEnv
plain = EchoEnv(base_url=sys.argv[1]).step(EchoAction(message="x"))
print(json.dumps(inspect.iscoroutine(plain)))
plain.close()
with EchoEnv(base_url=sys.argv[1]).sync() as env:
    results = [env.reset(), env.step(EchoAction(message="Hello World!"))]
fields = [r.observation.model_dump(exclude={"reward", "done", "metadata"}) for r in results]
print(json.dumps([[f, r.reward, r.done] for f, r in zip(fields, results)]))
"""
    out = subprocess.run([python, "-c", program, echo.url], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    coroutine, theirs = (json.loads(line) for line in out.stdout.splitlines())
    assert coroutine is True  # 0.3.0's EnvClient is async: TRL's example needs `.sync()` with it
    with OpenEnvClient(echo.url) as client:
        ours = [client.reset(), client.step({"message": "Hello World!"})]
    assert [[r.observation, r.reward, r.done] for r in ours] == theirs
    assert theirs[1] == [{"echoed_message": "Hello World!", "message_length": 12}, pytest.approx(1.2), False]


def test_a_server_that_cannot_start_says_why_in_one_line(python, echo, tmp_path):
    """The virtualenv missing (no process started), the port taken, the wrong virtualenv (the farm's:
    the server exits on its first OpenEnv import)."""
    cases = [
        (ServerSettings(python=str(tmp_path / "none" / "python")), "build it with scripts/openenv-venv"),
        (ServerSettings(port=echo.port, python=python), "is taken"),
        (
            ServerSettings(port=0, python=str(ROOT / ".venv" / "bin" / "python"), log=tmp_path / "wrong.log"),
            "No module named 'echo_env'",
        ),
    ]
    for settings, words in cases:
        with pytest.raises(OpenEnvServerError) as failed:
            with echo_server(settings):
                pass
        message = str(failed.value)
        assert words in message and "\n" not in message, message
    assert "before it was ready" in message  # the last case: the server exited


def test_a_lost_server_fails_the_step_and_the_reward_and_a_restart_serves_the_next_reset(python, tmp_path, monkeypatch):
    server = start(ServerSettings(port=0, max_sessions=1, python=python, log=tmp_path / "first.log"))
    monkeypatch.setenv(URL_VARIABLE, server.url)
    env = EchoToolEnv()
    try:
        env.reset()
        assert env.echo("before") == "before"
    finally:
        server.stop()

    with pytest.raises(OpenEnvError, match="closed the session"):
        env.echo("after")  # the model gets this error as the tool's answer
    with pytest.raises(OpenEnvError, match="session ended before its reward"):
        env.get_reward()  # not the 0.6 of the last step, nor 0.0
    with pytest.raises(OpenEnvError, match="cannot connect"):
        env.reset()  # nothing listens
    with echo_server(ServerSettings(port=server.port, max_sessions=1, python=python, log=tmp_path / "second.log")):
        env.reset()  # a new session on the restarted server
        assert env.echo("again") == "again" and env.get_reward() == pytest.approx(0.5)
        env.env.close()


def test_trl_scores_the_class_with_the_servers_reward(echo, model_dir, tmp_path, monkeypatch):
    """TRL 1.16's own path: GRPOTrainer(environment_factory=EchoToolEnv) with no reward_funcs (the
    class's get_reward is its reward source) through `_generate_and_score_completions`; only the
    model's sampling is scripted (as in tests/test_factory_trl.py): a row whose model calls `echo`
    earns the server's 1.2, a row whose model answers without it 0.0 (the negative control)."""
    from helpers.trl_envs import tool_template_dir

    monkeypatch.setenv(URL_VARIABLE, echo.url)
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model = str(tool_template_dir(model_dir, tmp_path / "model"))
    rows = [{"prompt": [{"role": "user", "content": "Try to echo 'Hello World!' in the environment."}]}] * 2 + [
        {"prompt": [{"role": "user", "content": "Just say hello."}]}
    ] * 2
    call = '<tool_call>\n{"name": "echo", "arguments": {"message": "Hello World!"}}\n</tool_call>'
    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        use_cpu=True,
        num_generations=2,
        per_device_train_batch_size=4,
        max_completion_length=128,
        report_to="none",
    )
    trainer = GRPOTrainer(
        model=model, environment_factory=EchoToolEnv, args=args, train_dataset=Dataset.from_list(rows)
    )
    tok, seen = trainer.processing_class, {}

    def generate(prompt_ids, images, multimodal_fields, num_generations, **kw):
        replies = []
        for ids in prompt_ids:
            text = tok.decode(ids)
            turn = text.count("<|im_start|>assistant") - 1
            script = [call, "It echoed Hello World!"] if "Try to echo" in text else ["Hello!"]
            replies.append(tok.encode(script[turn], add_special_tokens=False) + [tok.eos_token_id])
        return replies, [[0.0] * len(r) for r in replies]

    calculate = trainer._calculate_rewards

    def calculate_rewards(inputs, prompts, completions, completion_ids):
        rewards = calculate(inputs, prompts, completions, completion_ids)
        seen.update(rewards=rewards.tolist(), completions=completions)
        return rewards

    trainer._generate_single_turn = generate
    trainer._calculate_rewards = calculate_rewards
    trainer.model.train()
    trainer._generate_and_score_completions(list(rows))
    assert list(trainer.reward_func_names) == ["EchoToolEnv"]
    assert [r[0] for r in seen["rewards"]] == pytest.approx([1.2, 1.2, 0.0, 0.0])
    tool_answers = [m["content"] for c in seen["completions"] for m in c if m["role"] == "tool"]
    assert tool_answers == ["Hello World!", "Hello World!"]  # the server's echo, as TRL handed it to the model
    for env in trainer._environment_pool[None]:
        env.env.close()
