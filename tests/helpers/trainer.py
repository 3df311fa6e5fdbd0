"""The trainer's tests' run: a tiny random model with SmolLM2's vocabulary (a GRPO step takes
seconds), a stand-in tokenizer, and a one-step TrainConfig."""

from __future__ import annotations

import json


class CharTokenizer:
    """Stand-in tokenizer: the noop tests need only eos and a way to tokenize a placeholder prompt."""

    eos_token_id = 2

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 97 for c in text]}


def tiny_model(model_dir):
    """A 2-layer Llama with SmolLM2's vocabulary and random weights: one GRPO step takes seconds."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    config.update(
        {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
        }
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def one_step_config(tmp_path, model_dir, rows: list[dict], **overrides):
    """A TrainConfig for one GRPO step of 2 groups of 2 on `rows`, no weight sync: the trainer tests' run."""
    from trainer.config import TrainConfig

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    settings = dict(
        model_name=str(model_dir),
        dataset_path=str(data),
        output_dir=str(tmp_path / "out"),
        max_steps=1,
        num_generations=2,
        per_device_train_batch_size=4,
        max_completion_length=8,
        rollout_timeout_s=30,
        weight_sync="none",
        save_steps=1000,
        torch_threads=1,
    )
    return TrainConfig(**{**settings, **overrides})


def even_tokens(completions, completion_ids, env_reward, **_):
    """A shaping reward that differs between samples (the share of even token ids), so a tiny batch has
    an advantage and a gradient even when SmolLM2 scores the same everywhere and hits the length cap."""
    return [
        None if r is None else sum(i % 2 == 0 for i in ids) / len(ids) for r, ids in zip(env_reward, completion_ids)
    ]
