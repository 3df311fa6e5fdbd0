"""The `slow` marker check (tests/helpers/markers.py) on a small suite of its own, run by pytest in a
subprocess: each way of starting a process or a server fails an unmarked test and names what it
started, a fixture's process counts for every test that uses it, and the same tests marked `slow`
(and an exempt fixture's process, and a test that starts nothing) pass."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from helpers import ROOT

pytestmark = pytest.mark.slow

CONFTEST = """
import subprocess

import pytest
from helpers import markers


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: starts processes")
    markers.register(config)


@pytest.fixture(scope="session")
def server():
    proc = subprocess.Popen(["sleep", "30"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture(scope="session")
def redis_url():
    proc = subprocess.Popen(["sleep", "30"])
    yield "exempt"
    proc.kill()
    proc.wait()
"""

TESTS = """
import asyncio
import multiprocessing
import socket
import subprocess

import pytest


def test_runs():
    subprocess.run(["true"], check=True)


async def test_asyncio_exec():
    proc = await asyncio.create_subprocess_exec("true")
    await proc.wait()


def test_multiprocessing():
    p = multiprocessing.get_context("spawn").Process(target=print)
    p.start()
    p.join()


def test_listens():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()


def test_binds_only():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))


@pytest.mark.slow
def test_marked_runs():
    subprocess.run(["true"], check=True)


@pytest.mark.slow
def test_marked_uses_fixture(server):
    assert server.poll() is None


def test_unmarked_uses_fixture(server):
    assert server.poll() is None


@pytest.mark.parametrize("server", [1])
def test_argument_named_like_that_fixture(server):
    assert server == 1


def test_uses_exempt_fixture(redis_url):
    assert redis_url == "exempt"


def test_starts_nothing():
    assert 1 + 1 == 2
"""


def test_unmarked_tests_that_start_processes_or_servers_fail(tmp_path):
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(TESTS))
    env = {"PYTHONPATH": f"{ROOT / 'tests'}:{ROOT}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto", "-rA", "test_inner.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    outcome = {}
    for line in out.splitlines():
        for word in ("PASSED", "FAILED", "ERROR"):
            if line.startswith(word + " test_inner.py::"):
                outcome[line.split("::")[1].split()[0]] = word
    assert outcome == {
        "test_runs": "FAILED",
        "test_asyncio_exec": "FAILED",
        "test_multiprocessing": "FAILED",
        "test_listens": "FAILED",
        "test_binds_only": "PASSED",
        "test_marked_runs": "PASSED",
        "test_marked_uses_fixture": "PASSED",
        "test_unmarked_uses_fixture": "ERROR",
        "test_argument_named_like_that_fixture[1]": "PASSED",
        "test_uses_exempt_fixture": "PASSED",
        "test_starts_nothing": "PASSED",
    }, out
    assert "test_inner.py::test_runs has no `slow` marker but started:\n  - a subprocess: true" in out
    assert "a multiprocessing process:" in out
    assert "a server listening on 127.0.0.1:" in out
    assert "a subprocess: sleep 30 (in fixture 'server', started for an earlier test)" in out
