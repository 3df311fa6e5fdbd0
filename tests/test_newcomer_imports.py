"""A `module:Class` environment or `module:function` harness that is not found says where Python looked
and how to make it look next to farm.yaml: the `farm` command (a console script) does not put the
current directory on the import path, so a module kept beside the config is not found without
PYTHONPATH. A module that is found but fails on a dependency gets no such hint."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from envs.sdk.environment import env_class
from farm.errors import ConfigError
from farm.settings import load_settings
from workers.loops.agent import load_agent
from workers.loops.harness import load_harness

ENV = "from envs.sdk import Environment\n\n\nclass Pantry(Environment):\n    name = 'pantry'\n"


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A directory holding farm.yaml and the user's modules, as the current directory, not on sys.path."""
    (tmp_path / "farm.yaml").write_text("agents:\n  pantry:\n    env: nc_pantry:Pantry\n")
    (tmp_path / "nc_pantry.py").write_text(ENV)
    (tmp_path / "nc_agent.py").write_text("async def run(client, task):\n    return None\n")
    (tmp_path / "nc_broken.py").write_text("import nc_no_such_dependency\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p and Path(p).resolve() != tmp_path.resolve()])
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.delenv("FARM_CONFIG", raising=False)
    return tmp_path.resolve()


def test_an_environment_module_not_found_says_where_it_was_looked_for(project):
    with pytest.raises(ConfigError) as caught:
        env_class("nc_pantry:Pantry")
    said = str(caught.value)
    assert said.startswith("environment nc_pantry:Pantry: no module 'nc_pantry': looked in PYTHONPATH (unset)")
    assert f"not the current directory {project}" in said
    assert f"PYTHONPATH={project} ({project / 'nc_pantry.py'} is there)" in said


def test_a_harness_module_not_found_says_where_it_was_looked_for(project, monkeypatch):
    elsewhere = project / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("FARM_CONFIG", str(project / "farm.yaml"))  # the config's directory, not the cwd
    with pytest.raises(ConfigError) as caught:
        load_harness("nc_agent:run")
    said = str(caught.value)
    assert said.startswith("harness nc_agent:run: cannot import nc_agent: No module named 'nc_agent'; looked in")
    assert f"PYTHONPATH={project} ({project / 'nc_agent.py'} is there)" in said


def test_a_found_module_whose_dependency_is_missing_gets_no_path_hint(project, monkeypatch):
    monkeypatch.syspath_prepend(str(project))
    with pytest.raises(ConfigError) as caught:
        load_harness("nc_broken:run")
    assert "nc_no_such_dependency" in str(caught.value) and "PYTHONPATH" not in str(caught.value)
    assert callable(load_harness("nc_agent:run")), "found once its directory is on the path"


@pytest.mark.slow
def test_the_farm_command_says_it_and_pythonpath_finds_it(project, redis_url, namespace):
    """The console script, as a user runs it from the directory of farm.yaml: exit 2, one line with the
    hint; with the PYTHONPATH it names, the module is found (the next error is the missing policy URL)."""
    farm = Path(sys.executable).parent / "farm"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_") and k != "PYTHONPATH"}
    env.update(FARM_REDIS_URL=redis_url, FARM_NAMESPACE=namespace)
    argv = [str(farm), "--config", "farm.yaml", "worker", "--agent", "pantry"]
    proc = subprocess.run(argv, env=env, cwd=project, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert f"PYTHONPATH={project}" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    proc = subprocess.run(argv, env={**env, "PYTHONPATH": str(project)}, cwd=project, capture_output=True, text=True)
    assert proc.returncode == 2 and "set policy_urls" in proc.stderr, proc.stderr


def harness_agent_settings(tmp_path, **overrides):
    """A harness agent against vLLM with data_dir an empty directory: no prepared model in it."""
    agents = {"weather": {"harness": "examples.harnesses.plain_sdk:run", "env": "single_tool_call"}}
    base = {"data_dir": str(tmp_path), "policy_urls": ["http://127.0.0.1:9"], "agents": agents}
    return load_settings(env={}, overrides={**base, **overrides})


def test_a_tokenizer_that_is_not_there_says_what_to_do_not_a_hub_repo_id(tmp_path):
    """Outside the checkout with no prepared model, a harness agent's tokenizer is a path that does not
    exist; transformers took it for a hub repo id ("Repo id must be in the form ...")."""
    with pytest.raises(ConfigError) as caught:
        load_agent("weather", harness_agent_settings(tmp_path))
    said = str(caught.value)
    assert "Repo id" not in said
    assert said.startswith(f"no tokenizer at {tmp_path / 'models' / 'smollm2-135m-instruct'}")
    assert "farm policy prepare" in said and "policy_tokenizer" in said


def test_a_policy_tokenizer_directory_that_is_not_there_is_named(tmp_path):
    settings = harness_agent_settings(tmp_path, policy_tokenizer=str(tmp_path / "no-model"))
    with pytest.raises(ConfigError, match=r"^policy_tokenizer .*no-model is not a directory"):
        load_agent("weather", settings)
