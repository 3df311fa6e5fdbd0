"""`farm eval`: one rollout per held-out row through the farm, pass rate with a Wilson 95% interval;
failed rollouts are reported apart, never counted as misses."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import ROOT
from helpers.processes import stop
from helpers.workers import spawn_worker, worker_env

from producer.evaluate import wilson


@pytest.mark.parametrize(
    "passes,n,lo,hi",
    [(5, 10, 0.2366, 0.7634), (0, 10, 0.0, 0.2775), (10, 10, 0.7225, 1.0), (30, 200, 0.1072, 0.2064)],
)
def test_wilson_interval_matches_published_values(passes, n, lo, hi):
    got = wilson(passes, n)
    assert got == pytest.approx((lo, hi), abs=5e-4)


def test_wilson_interval_of_nothing_is_everything():
    assert wilson(0, 0) == (0.0, 1.0)


def noop(i: int, **spec) -> dict:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": f"q{i}"}]},
        "agent_ref": {"type": "responses_api_agents", "name": "noop"},
        "noop": spec,
    }


@pytest.mark.slow
def test_farm_eval_reports_pass_rate_interval_and_failures(settings, tmp_path):
    rows = [noop(i, reward=1.0) for i in range(6)] + [noop(i, reward=0.0) for i in range(6, 10)]
    rows += [noop(10, fail="fatal")]
    (tmp_path / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    worker = spawn_worker(settings, "--agent", "noop", "--concurrency", "8")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "farm", "eval", "--input", str(tmp_path / "heldout.jsonl")]
            + ["--output", str(tmp_path / "eval.jsonl"), "--json"],
            cwd=ROOT,
            env=worker_env(settings),
            capture_output=True,
            text=True,
            timeout=120,
        )
        table = subprocess.run(
            [sys.executable, "-m", "farm", "eval", "--input", str(tmp_path / "heldout.jsonl")]
            + ["--output", str(tmp_path / "eval.jsonl")],
            cwd=ROOT,
            env=worker_env(settings),
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        stop(worker)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    overall = result["overall"]
    assert (overall["n"], overall["passes"], overall["failed"]) == (10, 6, 1)
    assert overall["pass_rate"] == 0.6
    assert overall["ci95"] == pytest.approx(list(wilson(6, 10)))
    assert result["agents"]["noop"]["n"] == 10 and result["temperature"] == 0.0
    assert json.loads((tmp_path / "eval_eval.json").read_text())["overall"]["passes"] == 6
    # The same rows again: the output is rewritten, not appended to; the table says the same.
    assert table.returncode == 0, table.stderr
    line = next(x for x in table.stdout.splitlines() if x.startswith("all "))
    assert line.split()[1:4] == ["10", "6", "60.0%"] and line.split()[-1] == "1"
    assert "31.3% - 83.2%" in line
    assert all(len(x) <= 80 for x in table.stdout.splitlines() if x.startswith(("agent", "noop", "all")))
