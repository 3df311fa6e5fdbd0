"""The training config's keys: documented, checked, and where model_name loads from."""

from __future__ import annotations

import re

import pytest
from helpers import ROOT

from trainer.config import TrainConfig, load_train_config, model_path


def test_every_key_of_the_training_config_is_documented_in_the_training_page():
    page = (ROOT / "docs" / "training.md").read_text()
    missing = [k for k in TrainConfig.__struct_fields__ if k != "trl" and f"`{k}`" not in page]
    assert missing == []


def test_a_bare_model_name_of_the_prepared_model_follows_the_data_dir(tmp_path, monkeypatch):
    """The shipped configs name SmolLM2 by its bare name: it loads from <data_dir>/models, where `farm
    policy prepare` and `scripts/run` (FARM_DATA_DIR) made it; before, a path under ~/.cache was
    written in the configs, and a second copy was prepared there after `scripts/run`."""
    monkeypatch.chdir(tmp_path)  # a directory of that name in the working directory would be taken as it is
    assert model_path("smollm2-135m-instruct", tmp_path) == str(tmp_path / "models" / "smollm2-135m-instruct")
    (tmp_path / "models" / "mine").mkdir(parents=True)
    assert model_path("mine", tmp_path) == str(tmp_path / "models" / "mine")  # any model prepared there
    assert model_path("gpt2", tmp_path) == "gpt2"  # not there: a hub id
    assert model_path("HuggingFaceTB/SmolLM2-135M", tmp_path) == "HuggingFaceTB/SmolLM2-135M"
    assert model_path(str(tmp_path), tmp_path / "x") == str(tmp_path)  # a directory, as it is


def test_the_shipped_configs_name_the_model_by_its_bare_name():
    for path in sorted((ROOT / "configs").glob("grpo_smollm2_*.yaml")):
        assert load_train_config(path).model_name == "smollm2-135m-instruct", path


@pytest.mark.parametrize("value", [0, -5, float("nan")])
def test_results_ttl_s_must_be_a_positive_number_of_seconds(tmp_path, value):
    from farm.errors import ConfigError

    path = tmp_path / "c.yaml"
    path.write_text(f"model_name: m\ndataset_path: d.jsonl\nresults_ttl_s: {value if value == value else '.nan'}\n")
    with pytest.raises(ConfigError, match="results_ttl_s"):
        load_train_config(path)


def test_policy_port_without_embedded_is_a_usage_error(tmp_path, capsys):
    from farm.cli import main

    path = tmp_path / "c.yaml"
    path.write_text("model_name: m\ndataset_path: d.jsonl\n")
    assert main(["train", "--config", str(path), "--policy-port", "8123"]) == 2
    err = capsys.readouterr().err
    assert "--policy-port" in err and "--embedded" in err and re.search(r"\n.", err.strip()) is None


def test_the_mcqa_lora_config_is_bench_learns_run():
    """configs/grpo_smollm2_mcqa_lora.yaml reproduces bench/learn.py's defaults (the learning figure
    in docs/training.md): read from bench/learn.py's text, since tests import no benchmark."""
    import json

    from envs.sdk import load_env

    bench = (ROOT / "bench" / "learn.py").read_text()

    def default(flag: str) -> str:
        return re.search(rf'"--{flag}", type=\w+, default=([^,)]+)', bench).group(1)

    cfg = load_train_config(ROOT / "configs" / "grpo_smollm2_mcqa_lora.yaml")
    assert cfg.learning_rate == float(default("lr")) and cfg.lora_r == int(default("lora-r"))
    assert cfg.num_generations == int(default("num-generations"))
    assert cfg.per_device_train_batch_size == int(default("prompts")) * cfg.num_generations
    assert cfg.max_completion_length == int(default("max-tokens")) and cfg.seed == int(default("seed"))
    assert cfg.torch_threads == int(default("threads")) and cfg.weight_sync_steps == 1
    assert cfg.max_steps == int(default("steps"))
    easy = json.loads(re.search(r"^EASY = (\{.*\})$", bench, re.M).group(1))
    rows = load_env("mcqa", easy).generate(int(default("rows")), seed=cfg.seed)
    shipped = [json.loads(line) for line in (ROOT / cfg.dataset_path).read_text().splitlines()]
    assert [r["responses_create_params"] for r in shipped] == [r["responses_create_params"] for r in rows]
