"""Harbor's own parser agrees with envs/harbor/task.py on the project's suite.

Harbor (PyPI `harbor`, in .venv-harbor built by scripts/harbor-venv: it needs Python 3.12 and its
own stack) loads every task of the suite with its `Task` class (task.toml through
`TaskConfig.model_validate_toml`, plus its checks of the directory), and the values the farm acts on
(name, instruction, timeouts, resources, network, workdir) must equal the farm's reading. Without
Python 3.12 or PyPI the test skips, and fails under CI=true.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from helpers import ROOT

from envs.harbor.task import HarborTask, load_suite

pytestmark = pytest.mark.slow

# Run by .venv-harbor's python with task directories as arguments; prints one JSON object per task.
HARBOR_READS = """
import json
import sys
import warnings

warnings.simplefilter("ignore")
from harbor.models.task.task import Task

out = []
for path in sys.argv[1:]:
    task = Task(path)
    c, env = task.config, task.config.environment
    out.append({
        "name": task.name,
        "instruction": task.instruction,
        "schema_version": c.schema_version,
        "agent_timeout_sec": c.agent.timeout_sec,
        "verifier_timeout_sec": c.verifier.timeout_sec,
        "build_timeout_sec": env.build_timeout_sec,
        "cpus": env.cpus,
        "memory_mb": env.memory_mb,
        "storage_mb": env.storage_mb,
        "network_mode": env.network_mode.value,
        "workdir": env.workdir,
        "docker_image": env.docker_image,
        "difficulty": c.metadata.get("difficulty"),
        "tags": c.metadata.get("tags", []),
    })
print(json.dumps(out))
"""


def ours(task: HarborTask) -> dict:
    c, env = task.config, task.config.environment
    return {
        "name": task.name,
        "instruction": task.instruction,
        "schema_version": c.schema_version,
        "agent_timeout_sec": c.agent.timeout_sec,
        "verifier_timeout_sec": c.verifier.timeout_sec,
        "build_timeout_sec": env.build_timeout_sec,
        "cpus": env.cpus,
        "memory_mb": env.memory_mb,
        "storage_mb": env.storage_mb,
        "network_mode": env.network_mode,
        "workdir": env.workdir,
        "docker_image": env.docker_image,
        "difficulty": c.metadata.difficulty,
        "tags": list(c.metadata.tags),
    }


@pytest.fixture(scope="module")
def harbor_python() -> str:
    built = subprocess.run([str(ROOT / "scripts" / "harbor-venv")], capture_output=True, text=True, timeout=1200)
    if built.returncode != 0:
        reason = f"scripts/harbor-venv failed (exit {built.returncode}): {built.stderr.strip()[-500:]}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return built.stdout.strip().splitlines()[-1]


def test_harbor_reads_every_suite_task_as_the_farm_does(harbor_python):
    tasks = load_suite()
    done = subprocess.run(
        [harbor_python, "-c", HARBOR_READS, *(str(t.path) for t in tasks)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout)
    assert len(theirs) == len(tasks) >= 24
    for task, harbor in zip(tasks, theirs):
        assert harbor == ours(task), task.path


def test_harbor_reads_older_spellings_as_the_farm_does(harbor_python, tmp_path):
    """The deprecated forms both parsers still read: `version`, `memory`/`storage` sizes, `allow_internet`."""
    from envs.harbor.task import load_task

    task = tmp_path / "legacy"
    for rel, text in {
        "task.toml": 'version = "1.0"\n[environment]\nmemory = "1.5G"\nstorage = "2048K"\nallow_internet = false\n'
        "cpus = 2.0\n[agent]\ntimeout_sec = 90\n",
        "instruction.md": "<!-- harbor-canary GUID 0 -->\nDo it.\n",
        "tests/test.sh": "#!/bin/bash\n",
        "environment/Dockerfile": "FROM rollout-farm/base:bookworm\n",
    }.items():
        (task / rel).parent.mkdir(parents=True, exist_ok=True)
        (task / rel).write_text(text)
    done = subprocess.run([harbor_python, "-c", HARBOR_READS, str(task)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == [ours(load_task(task))]
