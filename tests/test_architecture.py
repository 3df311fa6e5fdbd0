"""The layers point down, and the contracts that say so can fail (`.importlinter`, run by scripts/test)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

from conftest import ROOT

LINT = Path(sys.executable).with_name("lint-imports")


def lint() -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_import_contracts_hold():
    out = lint()
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 kept, 0 broken" in out.stdout


def test_an_upward_import_breaks_the_core_contract():
    """A module of the core that imports a worker module: lint-imports must fail and name it."""
    probe = ROOT / "farm" / f"_probe_{uuid.uuid4().hex[:8]}.py"
    probe.write_text("import workers.runtime  # noqa: F401\n")
    try:
        out = lint()
    finally:
        probe.unlink()
    assert out.returncode != 0
    assert f"farm.{probe.stem} -> workers.runtime" in out.stdout, out.stdout


def test_an_environment_importing_a_worker_breaks_its_contract():
    probe = ROOT / "envs" / f"_probe_{uuid.uuid4().hex[:8]}.py"
    probe.write_text("from workers.agent import available_agents  # noqa: F401\n")
    try:
        out = lint()
    finally:
        probe.unlink()
    assert out.returncode != 0 and f"envs.{probe.stem} -> workers.agent" in out.stdout, out.stdout
