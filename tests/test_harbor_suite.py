"""The project's Harbor suite, run for real: every task's image builds from the offline base, a
do-nothing agent scores 0 and the reference solution (solution/solve.sh) scores 1.

Plain `docker` commands, as Harbor's own Docker environment runs a trial (build the environment,
start a container, upload solution/ and tests/, run them from the task's workdir, read
/logs/verifier/reward.txt or reward.json), so a suite's correctness does not depend on the farm's
sandbox backends, which are tested against it elsewhere. The base image is `farm sandbox base`'s
`rollout-farm/base:bookworm`; without Docker or the base image the tests skip, and fail under CI=true.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest
from helpers.processes import need_binary

from envs.harbor.task import HarborTask, load_suite

pytestmark = pytest.mark.slow

BASE_IMAGE = "rollout-farm/base:bookworm"
TASKS = load_suite()


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def docker() -> str:
    path = need_binary("docker", "docker.io")
    if subprocess.run([path, "info"], capture_output=True, timeout=60).returncode != 0:
        _unavailable("the Docker daemon does not answer (`docker info` fails)")
    if subprocess.run([path, "image", "inspect", BASE_IMAGE], capture_output=True, timeout=60).returncode != 0:
        _unavailable(f"no {BASE_IMAGE} image: build it with `farm sandbox base`")
    return path


def _run(args: list[str], timeout: float, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(args[:4])} ... exited {done.returncode}: {done.stderr[-2000:]}")
    return done


def _reward(docker: str, container: str) -> float:
    """reward.json's `reward` (Harbor's convention for several keys) or reward.txt's number."""
    found = _run([docker, "exec", container, "cat", "/logs/verifier/reward.json"], 30, check=False)
    if found.returncode == 0:
        return float(json.loads(found.stdout)["reward"])
    found = _run([docker, "exec", container, "cat", "/logs/verifier/reward.txt"], 30, check=False)
    assert found.returncode == 0, "the verifier wrote neither reward.json nor reward.txt"
    return float(found.stdout.strip())


def _trial(docker: str, task: HarborTask, image: str, solve: bool) -> float:
    """One trial in a fresh container: the solution (or nothing), then the tests; the reward."""
    env = task.config.environment
    workdir = env.workdir or "/"
    name = f"farm-harbor-suite-{uuid.uuid4().hex[:12]}"
    limits = ["--cpus", str(env.cpus or 1), "--memory", f"{env.memory_mb or 1024}m"]
    network = ["--network", "none"] if not env.allows_internet else []
    _run([docker, "run", "-d", "--name", name, *network, *limits, image, "sleep", "infinity"], 120)
    try:
        if solve:
            assert task.solve_script is not None, f"{task.name} has no solution/solve.sh"
            _run([docker, "cp", str(task.solution_dir), f"{name}:/solution"], 60)
            agent_timeout = task.config.agent.timeout_sec or 600
            _run([docker, "exec", "-w", workdir, name, "bash", "/solution/solve.sh"], agent_timeout)
        _run([docker, "cp", str(task.tests_dir), f"{name}:/tests"], 60)
        _run([docker, "exec", "-w", workdir, name, "bash", "/tests/test.sh"], task.config.verifier.timeout_sec + 30)
        return _reward(docker, name)
    finally:
        _run([docker, "rm", "-f", name], 60, check=False)


@pytest.mark.parametrize("task", TASKS, ids=[f"{t.tier}/{t.name}" for t in TASKS])
def test_nop_scores_0_and_the_solution_scores_1(docker, task: HarborTask):
    image = f"farm-harbor-suite/{task.name}:{task.content_id}"
    _run([docker, "build", "-q", "-t", image, str(task.environment_dir)], task.config.environment.build_timeout_sec)
    try:
        nop = _trial(docker, task, image, solve=False)
        oracle = _trial(docker, task, image, solve=True)
    finally:
        _run([docker, "image", "rm", "-f", image], 60, check=False)
    print(f"{task.tier}/{task.name}: nop {nop:g}, oracle {oracle:g}")
    assert (nop, oracle) == (0.0, 1.0)
