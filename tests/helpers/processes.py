"""Processes the tests start, find and stop, and the system binaries some of them need.

Every test that uses these starts a process, so it carries the `slow` marker (see `markers`).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 20.0) -> str:
    """Signal a process (SIGTERM: a worker's graceful drain) and wait for it to exit; its output.

    One that has not exited after `timeout` seconds is killed and the test fails, so no test
    leaves a process behind.
    """
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"{proc.args} did not exit within {timeout}s of signal {sig}; killed:\n{out}")
    return out


def stop_all(procs, timeout: float = 30.0) -> None:
    """SIGTERM every process, then wait for each."""
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout)


def farm_process(args: list[str], redis_url: str, namespace: str, log: Path, **env: str) -> subprocess.Popen:
    """`python -m farm ARGS` against this test's Redis and namespace, logging to `log`."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    full = {**base, "FARM_REDIS_URL": redis_url, "FARM_NAMESPACE": namespace, "PYTHONPATH": str(ROOT), **env}
    out = open(log, "ab")
    return subprocess.Popen([sys.executable, "-m", "farm", *args], cwd=ROOT, env=full, stdout=out, stderr=out)


def processes_of(namespace: str) -> list[int]:
    """Every process started with FARM_NAMESPACE=namespace (the pool supervisors and their workers)."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            if f"FARM_NAMESPACE={namespace}".encode() in environ.split(b"\0"):
                out.append(int(pid))
    return out


def processes_in_session(sid: int) -> list[str]:
    """The command lines of the live processes of session `sid` (a process started with
    `start_new_session=True` leads one whose id is its pid; its children stay in it)."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            state, _ppid, _pgrp, session = stat.rsplit(")", 1)[1].split()[:4]
            if int(session) == sid and state != "Z":
                out.append(cmdline.replace(b"\0", b" ").decode(errors="replace").strip())
    return out


def need_binary(name: str, package: str) -> str:
    """The path of a system binary the test needs; scripts/test installs it (apt) where it can.
    Missing: a skip that says why, except under CI=true, where it is a failure."""
    path = shutil.which(name)
    if path:
        return path
    reason = f"{name} is not installed (Debian package {package}; scripts/test installs it when run as root)"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    print(f"SKIP: {reason}")
    pytest.skip(reason)


PROGRESS = re.compile(r"^\d\d:\d\d:\d\d INFO    ")  # a progress line of the text log format (farm/logs.py)


def error_line(err: str) -> str:
    """The one line a failed start ends with: no traceback, nothing but INFO progress lines before it
    (a worker says when it loads its tokenizer and how long its agent took)."""
    lines = [line for line in err.splitlines() if line.strip() and not PROGRESS.match(line)]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]
