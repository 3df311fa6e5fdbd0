"""The policy stub's start with text replies: it says what it does before it listens, and a stop
during the model's first preparation leaves no converter behind.

Against the real stub process (`python -m workers.policy.stub --reply ...`) with a data dir of its
own whose model is not prepared yet (the model wheel copied in, so the conversion starts at once).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT
from helpers.processes import stop

pytestmark = pytest.mark.slow


def converters(marker: str) -> list[int]:
    """Live processes whose command line names the conversion script and `marker` (the test's dir)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if "convert.py" in cmd and marker in cmd and state != "Z":
            found.append(int(pid))
    return found


def test_a_stub_stopped_while_its_model_converts_leaves_no_converter(model_dir, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(model_dir.parent / "wheel", data / "models" / "wheel")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update(FARM_DATA_DIR=str(data), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.policy.stub", "--port", "0", "--reply", "hello"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = []
    assert proc.stderr is not None
    for line in proc.stderr:  # the stub's own lines come first, then the preparation's steps
        seen.append(line)
        if "converting" in line:
            break
    assert any(line.startswith("policy stub: loading a tokenizer") for line in seen), seen
    deadline = time.monotonic() + 30
    while not converters(str(data)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert converters(str(data)), "the conversion never started:\n" + "".join(seen)
    proc.stderr.close()
    proc.stderr = None  # stop() reads no more output from it
    stop(proc, signal.SIGTERM, timeout=20)
    deadline = time.monotonic() + 10
    while converters(str(data)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not converters(str(data)), "the model converter outlived its stub (SIGTERM)"
