"""docs/write-your-own-environment.md: its example environment, exactly as printed, works.

The module is cut out of the guide (the ```python block after its `guide-example` marker),
imported, and run through the real agent loop and tokenizer with a scripted policy, so the
guide cannot drift from the SDK without this failing.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT
from helpers.policies import ScriptedPolicy, hermes
from helpers.processes import processes_in_session

from envs.sdk import Environment, ErrorKind, RolloutFailure, ToolArgumentError, Transcript, env_class
from farm.schema import Status, Task
from workers.loops.agent import AgentContext
from workers.loops.env_calls import verify
from workers.loops.loop import AgentLoop

GUIDE = ROOT / "docs" / "write-your-own-environment.md"


@pytest.fixture(scope="module")
def pantry(tmp_path_factory):
    text = GUIDE.read_text()
    found = re.search(r"<!-- guide-example: (\S+) -->\n```python\n(.*?)```", text, re.S)
    assert found, "the guide's example module is marked with <!-- guide-example: PATH -->"
    path = tmp_path_factory.mktemp("guide") / "pantry.py"
    path.write_text(found.group(2))
    spec = importlib.util.spec_from_file_location("guide_pantry", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["guide_pantry"] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules["guide_pantry"]


def said(text: str = "done", calls: list | None = None) -> Transcript:
    return Transcript(final_text=text, output=[], tool_calls=calls or [])


def test_the_example_is_an_environment_with_typed_rows_and_derived_tool_schemas(pantry):
    env = pantry.Pantry()
    assert isinstance(env, Environment) and env.row_type is pantry.PantryRow
    add = pantry.TOOLS["add_item"].schema()["function"]
    assert add["description"] == "Put items into the pantry."
    assert add["parameters"]["required"] == ["item"]
    assert add["parameters"]["properties"]["count"] == {
        "type": "integer",
        "default": 1,
        "description": "How many (default 1).",
    }
    rows = env.generate(20, seed=3)
    assert rows == env.generate(20, seed=3) and rows != env.generate(20, seed=4)
    for row in rows:
        typed = env.check_row(row)
        assert sum(typed.expected.values()) > sum(typed.start.values())


async def test_its_tools_and_verifier_on_known_cases(pantry):
    env = pantry.Pantry()
    row = {
        "responses_create_params": {"input": "Add 2 rice."},
        "start": {"salt": 1},
        "expected": {"salt": 1, "rice": 2},
    }
    state = env.new_state(env.check_row(row))
    assert await pantry.TOOLS["add_item"](state, {"item": "rice", "count": 2}) == {"item": "rice", "stock": 2}
    assert (await env.score(row, state, said())).reward == 1.0
    assert (await env.score(row, {"salt": 1, "rice": 3}, said())).reward == 0.0
    assert (await env.score(row, {"salt": 1}, said("I added 2 rice."))).reward == 0.0
    for bad in ({"item": "rice", "count": "2"}, {"count": 2}, {"item": "rice", "amount": 2}):
        with pytest.raises(ToolArgumentError):
            await pantry.TOOLS["add_item"](state, bad)
    assert state == {"salt": 1, "rice": 2}


async def test_a_scripted_model_earns_the_reward_through_the_real_loop(pantry, tokenizer):
    env = pantry.Pantry()
    row = next(r for r in env.generate(10, seed=1))
    item, count = re.search(r"Add (\d+) (\w+)", row["responses_create_params"]["input"][-1]["content"]).group(2, 1)
    script = [hermes("get_stock"), hermes("add_item", {"item": item, "count": int(count)}), "done"]
    agent = AgentLoop.over_tokens(env, ScriptedPolicy(tokenizer, script), tokenizer)
    rollout = await agent.run(
        Task.new(run_id="guide", agent="pantry", row=row, reply_to="x"), AgentContext(worker_id="test", settings=None)
    )
    assert rollout.status is Status.ok and rollout.reward == 1.0 and rollout.metrics["tool_calls"] == 2

    broken = {**row, "expected": {item: "many"}}
    with pytest.raises(RolloutFailure, match="PantryRow") as info:
        await AgentLoop.over_tokens(env, ScriptedPolicy(tokenizer, []), tokenizer).run(
            Task.new(run_id="guide", agent="pantry", row=broken, reply_to="x"),
            AgentContext(worker_id="test", settings=None),
        )
    assert info.value.kind is ErrorKind.malformed


def _guide_dir(tmp_path: Path, module: str) -> Path:
    (tmp_path / "my_envs").mkdir(parents=True)
    (tmp_path / "my_envs" / "pantry.py").write_text(module)
    return tmp_path


def _guide_env(settings) -> dict:
    """The guide's user: the farm's virtualenv first on PATH, this test's Redis and namespace."""
    bin_dir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_") or k == "FARM_DATA_DIR"}
    return {
        **env,
        "PATH": f"{bin_dir}:{env['PATH']}",
        "FARM_REDIS_URL": settings.redis_url,
        "FARM_NAMESPACE": settings.namespace,
    }


@pytest.mark.slow
def test_the_guides_try_it_commands_run_as_written(settings, model_dir, tmp_path):
    """The guide's "Try it" block, verbatim, in a directory holding its module: rows generated from
    `module:Class`, the stub answering its text replies, `farm collect --embedded` collecting them."""
    text = GUIDE.read_text()
    module = re.search(r"<!-- guide-example: (\S+) -->\n```python\n(.*?)```", text, re.S).group(2)
    commands = re.search(r"<!-- guide-commands -->\n```bash\n(.*?)```", text, re.S).group(1)
    cwd = _guide_dir(tmp_path, module)
    (cwd / "try.sh").write_text(commands)
    log = cwd / "try.log"
    with open(log, "w") as sink:  # a file, not a pipe: the stub the block starts in the background keeps it open
        proc = subprocess.Popen(
            ["bash", "-e", "try.sh"],
            cwd=cwd,
            env=_guide_env(settings),
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=240)
            # The block ends what it started (the stub): within seconds nothing of its session is left.
            deadline = time.monotonic() + 15
            while (left := processes_in_session(proc.pid)) and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # whatever it did leave, so no test run inherits it
            except ProcessLookupError:
                pass
    out = log.read_text()
    assert proc.returncode == 0, out
    assert left == [], f"the guide's block left these running: {left}\n{out}"
    assert "8 new rollouts" in out, out
    rollouts = [json.loads(line)["rollout"] for line in (cwd / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 8 and all(r["status"] == "ok" for r in rollouts), out
    # The stand-in's replies ran: the get_stock call, then "done"; the rows asked for changes, so reward 0.
    assert all(r["metrics"]["tool_calls"] == 1 and r["reward"] == 0.0 for r in rollouts)


@pytest.mark.slow
def test_errors_in_the_users_module_name_it_and_the_line(settings, model_dir, tmp_path):
    """A module that fails to import, and a verifier that raises: each says the environment and the
    file and line, in one line (exit 2) or in the rollout's error, never `internal error`."""
    module = re.search(r"<!-- guide-example: (\S+) -->\n```python\n(.*?)```", GUIDE.read_text(), re.S).group(2)
    broken = module.replace("class PantryRow(Row):", "missing_name\n\n\nclass PantryRow(Row):")
    cwd = _guide_dir(tmp_path, broken)
    env = {**_guide_env(settings), "PYTHONPATH": str(cwd)}
    argv = [sys.executable, "-m", "farm", "data", "generate", "my_envs.pantry:Pantry", "--size", "2", "-o", "-"]
    out = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert "my_envs.pantry:Pantry" in lines[0] and "NameError" in lines[0], lines
    assert f"{cwd / 'my_envs' / 'pantry.py'}:" in lines[0] and "Traceback" not in out.stderr, lines

    raising = re.sub(r"(    async def verify\(self, row: PantryRow.*?:\n)", r'\1        {}["token"]\n', module, count=1)
    sys.path.insert(0, str(_guide_dir(tmp_path / "raising", raising)))
    try:
        env = env_class("my_envs.pantry:Pantry")()
        row = env.generate(1, seed=0)[0]
        state = env.new_state(env.check_row(row))
        with pytest.raises(RolloutFailure) as info:
            asyncio.run(verify(env, env.check_row(row), state, said(), 5.0))
        assert info.value.kind is ErrorKind.verifier
        assert "verifier raised KeyError: 'token'" in info.value.message
        assert "my_envs/pantry.py:" in info.value.message and "in verify" in info.value.message
    finally:
        sys.path.pop(0)
        for name in [m for m in sys.modules if m.startswith("my_envs")]:
            del sys.modules[name]
