"""TRL classes on real `farm worker` processes: the example (examples/trl_envs) as a configured agent,
rows in TRL's shape submitted through the client, the policy stub answering SmolLM2 ids as scripted
(a call of the `add` tool, then an answer), rewards from the reward function and get_reward; a
class TRL would refuse stops the worker at start with one line and exit 2; and the harness loop
(the worker's gateway, in this process) shows a harness the reset observation too.

The stub stands in for the model because SmolLM2 rarely writes a tool call right and these tests
are about the farm's path; tests/test_factory_trl.py compares the same path with TRL's.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml
from helpers import ROOT
from helpers.policies import hermes, stub_processes
from helpers.redis import make_settings
from helpers.workers import run_through_worker, worker_env

from envs.sdk import load_env
from farm.agent_config import AgentConfig
from farm.rows import normalize_row
from farm.schema import Status, Task
from workers.loops.context import AgentContext
from workers.policy.stub import Script
from workers.policy.tokens import Completion

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

EXAMPLE = ROOT / "examples" / "trl_envs"
CALL = hermes("add", {"x": 3, "y": 4})
ANSWER = "The sum is 7."
QUESTION = [{"role": "user", "content": "What is the sum of the two numbers below? Answer with the number."}]


@pytest.fixture(scope="module")
def stub(tokenizer, tmp_path_factory):
    script = Script(token_replies=[tokenizer.encode(t) + [tokenizer.eos_id] for t in (CALL, ANSWER)], model="stub")
    with stub_processes(script, tmp_path_factory.mktemp("stub"), latency_s=0.01) as start:
        yield start()


def test_the_example_class_earns_its_rewards_on_a_worker(settings, stub, model_dir, tokenizer):
    """Rows for 3 + 4 earn both rewards (the answer and the tool's result are 7); a row for 2 + 2 earns
    neither: the same replies, another row (the negative control)."""
    rows = [{"prompt": QUESTION, "a": 3, "b": 4}] * 3 + [{"prompt": QUESTION, "a": 2, "b": 2}]
    got = run_through_worker(
        settings, stub, model_dir, "arithmetic", rows, FARM_CONFIG=str(EXAMPLE / "farm.yaml"), PYTHONPATH=str(ROOT)
    )
    for row, r in zip(rows, got):
        assert r.status is Status.ok, r.error
        right = float(row["a"] + row["b"] == 7)
        assert r.reward_components == {"correct_answer": right, "Calculator": right}
        assert r.reward == 2 * right
        assert r.metrics["tool_calls"] == 1 and r.metrics["turns"] == 2
        prompt = tokenizer.decode(list(r.trace.prompt()))
        assert prompt.count(f"The numbers are {row['a']} and {row['b']}.") == 1  # the reset's text, once
        ids, mask = r.trace.completion(), r.trace.mask()
        assert [i for i, m in zip(ids, mask) if m] == tokenizer.encode(CALL) + [tokenizer.eos_id] + tokenizer.encode(
            ANSWER
        ) + [tokenizer.eos_id]
        assert 0 in mask  # the tool's answer, inserted by the template, never trained


def test_a_class_trl_would_refuse_stops_the_worker_at_start_with_one_line(settings, tmp_path):
    config = tmp_path / "farm.yaml"
    agent = {"environment_factory": "helpers.trl_envs:Undocumented", "reward_funcs": ["helpers.trl_envs:exact"]}
    config.write_text(yaml.safe_dump({"agents": {"broken": agent}}))
    env = worker_env(
        settings,
        FARM_CONFIG=str(config),
        FARM_POLICY_URLS="http://127.0.0.1:9",
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "farm", "worker", "--agent", "broken"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2, out
    assert "Traceback" not in out and len(out.splitlines()) == 1, out
    assert "tool Undocumented.look" in out and "trl_envs.py:" in out and "no docstring" in out, out


class Scripted:
    """The gateway's policy: the next scripted text per call, its prompts kept."""

    def __init__(self, tok, turns):
        self.tok, self.turns, self.prompts = tok, list(turns), []

    async def max_model_len(self, session):
        return 2048

    async def complete(self, prompt_ids, sampling, session):
        self.prompts.append(list(prompt_ids))
        ids = self.tok.encode(self.turns.pop(0)) + [self.tok.eos_id]
        return Completion(ids, [-0.25] * len(ids), "", "stop", "scripted", 0.0)

    def ready(self):
        return True

    async def wait_ready(self):
        return None

    async def aclose(self):
        return None


async def test_a_harness_sees_the_reset_observation_and_its_rollout_is_rewarded(tokenizer):
    from workers.loops.harness import HarnessAgent

    options = {"factory": "examples.trl_envs.arithmetic:Calculator", "reward_funcs": []}
    env = load_env("environment_factory", options)
    settings = make_settings("redis://127.0.0.1:6379", "factory-gw", policy_urls=["http://127.0.0.1:9"])
    policy = Scripted(tokenizer, [CALL, ANSWER])
    cfg = AgentConfig(environment_factory=options["factory"], harness="examples.harnesses.plain_sdk:run")
    agent = HarnessAgent("arithmetic", env, policy, tokenizer, env.agent, cfg, settings)
    await agent.setup()
    row = normalize_row({"prompt": QUESTION, "a": 3, "b": 4})
    try:
        rollout = await agent.run(
            Task.new(run_id="r", agent="arithmetic", row=row, reply_to="farm:results:r"), AgentContext("w", settings)
        )
    finally:
        await agent.aclose()
    assert rollout.status is Status.ok and rollout.reward_components == {"Calculator": 1.0}, rollout.error
    assert tokenizer.decode(policy.prompts[0]).count("The numbers are 3 and 4.") == 1
