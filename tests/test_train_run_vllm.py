"""`farm train --embedded` on the shipped config, from a copy of configs/ as a fresh checkout has it:
an embedded Redis, real vLLM (SmolLM2 on the CPU, weight sync on), one worker pool per agent the
rows name, two GRPO steps, everything stopped at the end. And the config's data comments, run as
they are written, make the rows it ships."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
from helpers import ROOT
from helpers.processes import processes_of

from farm.embedded import free_port

CONFIG = ROOT / "configs" / "grpo_smollm2_multi_env.yaml"


def comment_commands(prefix: str) -> list[str]:
    return [m for m in re.findall(r"^#   (.*)$", CONFIG.read_text(), re.M) if m.startswith(prefix)]


def farm_env(tmp_path, **extra: str) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    bindir = os.path.dirname(sys.executable)  # `farm` is the venv's
    return {**base, "PATH": f"{bindir}:{base.get('PATH', '')}", "PYTHONPATH": str(ROOT), **extra}


@pytest.mark.slow
def test_the_config_comments_make_the_rows_it_ships(tmp_path):
    commands = comment_commands("farm data ")
    assert len(commands) == 3
    (tmp_path / "configs" / "data").mkdir(parents=True)
    for command in commands:
        subprocess.run(command, shell=True, cwd=tmp_path, env=farm_env(tmp_path), check=True, capture_output=True)
    made = (tmp_path / "configs" / "data" / "train_multi_env.jsonl").read_text()
    assert made == (ROOT / "configs" / "data" / "train_multi_env.jsonl").read_text()


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_farm_train_embedded_runs_two_steps_of_the_shipped_config(tmp_path, model_dir):
    """The model is the one under FARM_DATA_DIR (the config names it by its bare name), vLLM listens on
    the port --policy-port pins, and the run ends naming its final weights, the last pushed version,
    with no TRL checkpoint and no second copy of the weights in output_dir."""
    (command,) = [c for c in comment_commands("farm train ") if "--embedded" in c]
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    (tmp_path / "data" / "models").mkdir(parents=True)
    (tmp_path / "data" / "models" / model_dir.name).symlink_to(model_dir)  # prepared: not made again
    namespace = f"emb{os.getpid()}"
    port = free_port("127.0.0.1")
    env = farm_env(
        tmp_path,
        FARM_DATA_DIR=str(tmp_path / "data"),
        FARM_EMBEDDED_PORT=str(free_port("127.0.0.1")),
        FARM_NAMESPACE=namespace,
        VLLM_CPU_KVCACHE_SPACE="1",
    )
    started = time.monotonic()
    proc = subprocess.run(
        command + f" --max-steps 2 --policy-port {port}",
        shell=True,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=850,
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["global_step"] == 2 and summary["policy_version"] == 2 and summary["syncs"] == 2
    out = tmp_path / "outputs" / "farm_multi_env"
    assert sorted(p.name for p in (out / "policy").iterdir()) == ["v2"]
    assert summary["final_weights"] == "outputs/farm_multi_env/policy/v2" and (out / "policy" / "v2").is_dir()
    assert sorted(p.name for p in out.iterdir()) == ["farm_summary.json", "policy"]
    assert f"starting vLLM on http://127.0.0.1:{port} " in proc.stderr
    assert (tmp_path / "data" / "models" / model_dir.name).is_symlink()  # no second copy prepared
    assert "policy v0 = the trainer's start weights, pushed to the servers" in proc.stderr
    logs = tmp_path / "data" / "logs"
    assert {p.name for p in logs.glob("train-worker-*.log")} == {
        "train-worker-single_tool_call.log",
        "train-worker-session_state.log",
    }
    assert processes_of(namespace) == []  # workers, vLLM and Redis stopped
    print(f"farm train --embedded, 2 steps of the shipped config: {elapsed:.0f}s")


@pytest.mark.vllm
@pytest.mark.slow
def test_farm_policy_serve_takes_weight_updates(vllm):
    """`farm policy serve` starts vLLM with VLLM_SERVER_DEV_MODE=1: the pre-flight finds /collective_rpc
    (before, it was missing and a training run's first weight sync failed). The session's server is
    started by that command, without VLLM_SERVER_DEV_MODE in its environment (tests/conftest.py)."""
    import httpx

    from trainer.preflight import check_policy

    assert httpx.get(vllm.url + "/collective_rpc", timeout=10).status_code == 405
    check_policy([vllm.url])
