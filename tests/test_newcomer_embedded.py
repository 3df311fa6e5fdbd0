"""`farm collect --embedded` whose environment module raises at import says the worker's own line
(the file and line) and exits 2, as `farm worker` would, instead of exit 1 and a log folder. The
policy is never started: the environment fails to load before the agent's policy is looked at."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BROKEN = "from envs.sdk import Environment\n\nraise RuntimeError('the data file is missing')\n"


@pytest.mark.slow
def test_collect_embedded_shows_the_workers_own_error_and_exits_2(tmp_path, redis_url, namespace):
    (tmp_path / "nc_boom.py").write_text(BROKEN)
    (tmp_path / "farm.yaml").write_text("agents:\n  boom:\n    env: nc_boom:Env\n")
    row = {"responses_create_params": {"input": "hi"}, "agent_ref": {"type": "responses_api_agents", "name": "boom"}}
    (tmp_path / "rows.jsonl").write_text(json.dumps(row) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update(
        PYTHONPATH=str(tmp_path),
        FARM_REDIS_URL=redis_url,
        FARM_NAMESPACE=namespace,
        FARM_DATA_DIR=str(tmp_path / "data"),
        FARM_POLICY_URLS="http://127.0.0.1:9",  # never asked: the worker fails before its policy
    )
    argv = [str(Path(sys.executable).parent / "farm"), "--config", "farm.yaml", "collect", "--embedded"]
    argv += ["--input", "rows.jsonl", "--output", "out.jsonl"]
    proc = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("farm: ")]
    assert proc.returncode == 2, proc.stderr
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    said = errors[0]
    assert "`farm worker --agent boom --processes 1` exited with 2 before it was ready" in said, said
    assert "RuntimeError: the data file is missing" in said and f"{tmp_path / 'nc_boom.py'}:3" in said, said
    assert f"(log in {tmp_path / 'data' / 'logs'})" in said, said
