"""The worker process's event loop and garbage collector (workers/delivery/chores.py `run_loop`).

Each case runs in a fresh interpreter, since the collector's thresholds and frozen objects are
process-wide. The figures behind the settings are bench/concurrency.py's: at 8,192 loops per
process Python's default full collections took 36% of the worker's CPU.
"""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

PROBE = """
import asyncio, gc, json, sys
from workers.delivery.chores import run_loop
async def main():
    return type(asyncio.get_running_loop()).__module__
before = gc.get_threshold()
loop = run_loop(main(), sys.argv[1])
print(json.dumps({"loop": loop, "frozen": gc.get_freeze_count(), "before": before, "after": gc.get_threshold()}))
"""


def probe(choice: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROBE, choice], capture_output=True, text=True, timeout=60)


def test_start_up_heap_is_frozen_and_full_collections_are_rare():
    out = json.loads(probe("asyncio").stdout)
    assert out["loop"].startswith("asyncio")
    assert out["frozen"] > 1000, "the modules loaded before the loop are out of every collection"
    assert out["before"][2] == 10 and out["after"][:2] == out["before"][:2]
    assert out["after"][2] >= 1000


def test_uvloop_where_installed_and_a_choice_that_does_not_exist():
    pytest.importorskip("uvloop")
    assert json.loads(probe("auto").stdout)["loop"].startswith("uvloop")
    assert json.loads(probe("uvloop").stdout)["loop"].startswith("uvloop")
    bad = probe("trio")
    assert bad.returncode != 0 and "choose one of auto, uvloop, asyncio" in bad.stderr
