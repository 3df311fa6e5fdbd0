"""The suite's parallel run keeps its groups: scripts/test runs pytest-xdist with `--dist loadgroup`,
and tests/conftest.py puts every test of the session's vLLM on one worker, and a module whose tests
share a fixture of its own on one worker. Run here on a small suite of its own with that conftest's
hook: the grouped tests share a worker, the others are spread over both. (On pytest 9.2 xdist 3.8
grouped nothing and said nothing: pytest-xdist issue 1386; pyproject.toml pins pytest below it.)"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict

import pytest
from helpers import ROOT

pytestmark = pytest.mark.slow

CONFTEST = f"""
import importlib.util
import pytest

spec = importlib.util.spec_from_file_location("suite_conftest", {str(ROOT / "tests" / "conftest.py")!r})
suite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite)
pytest_collection_modifyitems = suite.pytest_collection_modifyitems


@pytest.fixture(scope="session")
def vllm():
    return "a stand-in: only its name counts"
"""

SLEEP = "import time\n\n"


def write_suite(root) -> None:
    (root / "conftest.py").write_text(CONFTEST)
    (root / "test_uses_vllm.py").write_text(
        SLEEP + "".join(f"def test_v{i}(vllm):\n    time.sleep(0.2)\n\n" for i in range(4))
    )
    (root / "test_shared.py").write_text(
        SLEEP
        + "import pytest\n\n@pytest.fixture(scope='module')\ndef server():\n    return object()\n\n"
        + "".join(f"def test_m{i}(server):\n    time.sleep(0.2)\n\n" for i in range(4))
    )
    (root / "test_free.py").write_text(SLEEP + "".join(f"def test_f{i}():\n    time.sleep(0.3)\n\n" for i in range(8)))


def test_grouped_tests_share_a_worker_and_the_rest_are_spread(tmp_path):
    write_suite(tmp_path)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-v",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
        ],
        cwd=tmp_path,
        env={"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    workers: dict[str, set[str]] = defaultdict(set)
    for worker, module in re.findall(r"\[(gw\d)\].*PASSED (test_\w+)\.py::", out.stdout):
        workers[module].add(worker)
    assert sum(out.stdout.count(f"PASSED {m}.py::") for m in workers) == 16, out.stdout
    assert len(workers["test_uses_vllm"]) == 1, out.stdout  # the session's vLLM: one worker
    assert len(workers["test_shared"]) == 1, out.stdout  # a module's shared fixture: one worker
    assert workers["test_free"] == {"gw0", "gw1"}, out.stdout  # and the run is parallel at all
