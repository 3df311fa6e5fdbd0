"""A user's own TRL script moved onto the farm: examples/trl_envs/train_trl.py (GRPOTrainer with
environment_factory=Calculator and reward_funcs=[correct_answer]) and train_farm.py (the same script
training through the farm), the diff between them as docs/trl-environments.md shows it,
`trainer.train.farm_dataset` (TRL's dataset routed to a farm agent) and its refusals, and
train_farm.py run as the page's command runs it: real Redis, a real `farm worker --agent arithmetic`
loading the class and the reward function by their import paths, two GRPO steps.

The policy the worker samples from is the stub (workers/policy/stub) scripted to call `add` then
answer, not vLLM: SmolLM2 rarely writes a tool call right, and a vLLM costs minutes on this CPU
(`farm train --embedded` with vLLM and this class is the run in the page's "farm train" section).
The weights go to test_train_run's recording server, which stands in for vLLM's reload endpoint.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT
from helpers.policies import hermes, stub_processes
from helpers.processes import stop
from helpers.waiting import wait_for
from helpers.workers import spawn_worker, worker_env

pytest.importorskip("trl")
from test_train_run import WeightsServer, _page_command, _rollout_versions, small_model  # noqa: E402

__all__ = ["small_model"]  # test_train_run's fixture (the tiny model a script loads in a second), used here

EXAMPLE = ROOT / "examples" / "trl_envs"
PAGE = ROOT / "docs" / "trl-environments.md"
QUESTION = [{"role": "user", "content": "What is the sum of the two numbers below? Answer with the number."}]


def test_the_pages_diff_is_the_diff_between_the_two_scripts():
    """The page's diff block is `diff -u examples/trl_envs/train_trl.py examples/trl_envs/train_farm.py`
    (difflib writes what GNU diff writes for these files): a change to either script fails here."""
    section = PAGE.read_text().split("## Your own TRL script", 1)[1].split("\n## ", 1)[0]
    (shown,) = re.findall(r"```diff\n(.*?)```", section, re.S)
    old, new = "examples/trl_envs/train_trl.py", "examples/trl_envs/train_farm.py"
    made = "".join(
        difflib.unified_diff(
            (ROOT / old).read_text().splitlines(keepends=True),
            (ROOT / new).read_text().splitlines(keepends=True),
            old,
            new,
        )
    )
    assert shown == made, f"regenerate the page's block: diff -u {old} {new}"


def trl_rows(*pairs: tuple[int, int]) -> list[dict]:
    return [{"prompt": QUESTION, "a": a, "b": b} for a, b in pairs]


def test_farm_dataset_routes_trl_rows_to_the_agent_and_keeps_their_columns():
    from datasets import Dataset

    from trainer.batch import parse_row
    from trainer.train import farm_dataset

    mine = {**trl_rows((5, 5))[0], "agent_ref": {"type": "responses_api_agents", "name": "other"}}
    ds = farm_dataset(Dataset.from_list(trl_rows((3, 4), (2, 2))), agent="arithmetic")
    assert ds["agent"] == ["arithmetic", "arithmetic"]
    rows = [parse_row(p) for p in ds["prompt"]]  # what FarmRollout reads back from each prompt
    assert [(r["a"], r["b"]) for r in rows] == [(3, 4), (2, 2)]
    assert rows[0]["responses_create_params"] == {"input": QUESTION} and rows[0]["prompt"] == QUESTION
    assert farm_dataset([mine], agent="arithmetic")["agent"] == ["other"]  # a row's own agent_ref stays
    assert farm_dataset([{"prompt": "Add 1 and 2.", "a": 1, "b": 2}], agent="arithmetic")["agent"] == ["arithmetic"]


@pytest.mark.parametrize(
    "row, agent, says",
    [
        ({"question": "2 + 2?", "a": 2}, "arithmetic", "dataset row 0 (columns question, a): no `prompt`"),
        ({"prompt": 7, "a": 2}, "arithmetic", "the prompt must be chat messages"),
        ({"prompt": ["2 + 2?"], "a": 2}, "arithmetic", "the prompt must be chat messages"),
        ({"prompt": None, "a": 2}, "arithmetic", "not None"),
        ({"prompt": QUESTION, "a": 2}, None, "no agent_ref.name to route it by: pass agent=NAME"),
        ("2 + 2?", "arithmetic", "dataset row 0 (str): a row must be a mapping"),
    ],
)
def test_farm_dataset_refuses_a_row_it_cannot_take_naming_it(row, agent, says):
    from trainer.train import farm_dataset

    with pytest.raises(ValueError, match=re.escape(says)):
        farm_dataset([row], agent=agent)


# -- train_farm.py against a worker ----------------------------------------------------------------

CALL = hermes("add", {"x": 3, "y": 4})
ANSWER = "The sum is 7."


@pytest.fixture
def weights_server():
    server = WeightsServer()
    yield server
    server.close()


@pytest.fixture
def arithmetic_worker(settings, model_dir, tokenizer, tmp_path):
    """`farm worker --agent arithmetic` as the page starts it (examples/trl_envs/farm.yaml, the
    repository on PYTHONPATH), sampling from the stub; every rollout kept in the agent's sample stream."""
    from workers.policy.stub import Script
    from workers.supervise.stack import policy_env

    script = Script(token_replies=[tokenizer.encode(t) + [tokenizer.eos_id] for t in (CALL, ANSWER)], model="stub")
    with stub_processes(script, tmp_path, latency_s=0.01) as start:
        stub = start()
        proc = spawn_worker(
            settings,
            "--agent",
            "arithmetic",
            "--concurrency",
            "4",
            **policy_env(stub.url, stub.served_model_name, model_dir),
            FARM_CONFIG=str(EXAMPLE / "farm.yaml"),
            FARM_SAMPLE_EVERY="1",
        )
        try:
            wait_for(lambda: _live(settings, "arithmetic"), timeout=60, what="the arithmetic worker's heartbeat")
            yield proc
        finally:
            stop(proc, timeout=30)


def _live(settings, agent: str) -> bool:
    import redis

    from farm.state import live_workers

    r = redis.Redis.from_url(settings.redis_url)
    try:
        return agent in live_workers(r, settings.keys).agents()
    finally:
        r.close()


def _sampled(sync_redis, settings, agent: str) -> list[tuple[dict, object]]:
    """(the task's row, the rollout) of every rollout in the agent's sample stream."""
    from farm.schema import decode_rollout, decode_task_body

    out = []
    for _, fields in sync_redis.xrange(settings.keys.samples(agent)):
        out.append((decode_task_body(fields[b"t"]).row, decode_rollout(fields)))
    return out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_train_farm_runs_two_steps_on_a_worker_that_loads_the_class(
    tmp_path, settings, arithmetic_worker, weights_server, small_model, sync_redis
):
    """The page's command for train_farm.py, with the test's model, rows and output directory (and its
    Redis: FARM_REDIS_URL, FARM_NAMESPACE). Rows for 3 + 4 earn both rewards from the worker, where
    the script no longer imports Calculator or correct_answer (the stub's `add(3, 4)` and "7" are
    right); rows for 2 + 2 earn neither, from the same replies: the negative control."""
    assigned, words = _page_command(PAGE.read_text(), "examples/trl_envs/train_farm.py")
    assert sorted(assigned) == ["FARM_POLICY_URLS"] and words[:2] == ["python", "examples/trl_envs/train_farm.py"]
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in trl_rows((3, 4), (2, 2))))  # TRL's shape, no agent_ref
    env = {k: v for k, v in worker_env(settings).items() if k not in ("FARM_CONFIG", "PYTHONPATH")}
    env.update(FARM_POLICY_URLS=weights_server.url, TRL_EXPERIMENTAL_SILENCE="1")
    proc = subprocess.run(
        [sys.executable, words[1], str(small_model), str(rows), str(tmp_path / "out")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Two steps: the start weights, then each step's, pushed to the policy server and announced.
    assert [Path(p["kwargs"]["weights_path"]).name for p in weights_server.pushes] == ["v0", "v1", "v2"]
    assert int(sync_redis.get(settings.keys.policy_version())) == 2
    state = json.loads((tmp_path / "out" / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    # Each step: both rows, two generations each, from the version before it.
    wait_for(lambda: len(_sampled(sync_redis, settings, "arithmetic")) >= 8, timeout=20, what="8 sampled rollouts")
    assert _rollout_versions(sync_redis, settings, "arithmetic") == {0: 4, 1: 4}
    sampled = _sampled(sync_redis, settings, "arithmetic")
    assert sorted((row["a"], row["b"]) for row, _ in sampled) == [(2, 2)] * 4 + [(3, 4)] * 4
    for row, rollout in sampled:
        right = float(row["a"] + row["b"] == 7)
        assert rollout.reward_components == {"correct_answer": right, "Calculator": right}, rollout.error
        assert rollout.reward == 2 * right and rollout.metrics["tool_calls"] == 1
    # What TRL trained on: env_reward, the workers' sums (2, 2, 0, 0 each step).
    logged = re.search(r"'rewards/env_reward/mean': '?([0-9.]+)", proc.stdout + proc.stderr)
    assert logged and float(logged.group(1)) == 1.0, proc.stdout[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_train_trl_the_script_before_the_change_runs_with_trl_alone(tmp_path, small_model):
    """The diff's other side is a script that runs: TRL's GRPOTrainer samples (transformers on the
    CPU), makes Calculator instances and scores with correct_answer, two steps. TRL refuses SmolLM2's
    chat template (it renders no tools): the tiny model gets TRL's Qwen2.5 template."""
    from helpers.trl_envs import tool_template_dir

    model = tool_template_dir(small_model, tmp_path / "model")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in trl_rows((3, 4), (2, 2))))
    proc = subprocess.run(
        [sys.executable, "examples/trl_envs/train_trl.py", str(model), str(rows), str(tmp_path / "out")],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT), TRL_EXPERIMENTAL_SILENCE="1"),  # the script imports the class
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = json.loads((tmp_path / "out" / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    logged = proc.stdout + proc.stderr
    assert "'rewards/correct_answer/mean'" in logged and "'rewards/Calculator/mean'" in logged, logged[-2000:]
