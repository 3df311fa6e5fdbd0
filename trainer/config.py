"""The training configuration: the reference TRL + NeMo Gym keys, plus the farm's own.

One YAML file drives a run. Any top-level key that is not one of the farm's below is passed to
TRL's GRPOConfig as it is, and TRL checks it. Its top level holds the keys of TRL's NeMo Gym example
(`model_name`, `dataset_path`, `learning_rate`, `num_generations`, ...), so a config written
for that script loads unchanged; the farm's part (Redis URL, namespace, policy URLs) lives
under `farm:` and is read by farm.settings, the same way every other farm process reads it.
The trainer-side farm knobs (rollout timeout, weight sync) sit at the top level next to
the TRL keys they interact with.

`max_seq_length` in the reference configs bounds the whole sequence; here it is the fallback
for `max_completion_length` when that is not given (rollouts are bounded per call by the
agent loop and by the server's max_model_len anyway).

`vllm_importance_sampling_correction` is on by default, unlike the reference script (which
needs TRL's own vLLM for it): every farm rollout carries its sampler's logprobs, and
trainer.grpo applies TRL's correction to them without TRL's vLLM. Its mode and bounds are TRL's
keys, passed through as they are (`vllm_importance_sampling_mode`, default `sequence_mask`;
`vllm_importance_sampling_clip_max`, default 3.0; `vllm_importance_sampling_clip_min`).

The farm samples and syncs the weights, so the TRL keys that would have TRL do either are refused
(`use_vllm: true`, `vllm_mode`, `vllm_server_*`, `vllm_group_port`: ConfigError, exit 2, before the
model loads), and those that tune TRL's own generation (`top_k`, `vllm_gpu_memory_utilization`,
...) are accepted with a warning that they change nothing. The sampling the farm's tasks carry
comes from `temperature`, `top_p` and `max_completion_length`.

A step whose batch has fewer than `min_usable_groups` groups holding a trainable rollout is not
trained on: its prompts are submitted again, and after `max_unusable_batches` such batches in a
row the run stops (trainer/rollout.py).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Literal, Optional

import msgspec

from farm.errors import ConfigError
from farm.settings import read_yaml_mapping

__all__ = [
    "TrainConfig",
    "check_trl_keys",
    "grpo_args",
    "load_train_config",
    "model_path",
    "refused_key",
]

log = logging.getLogger("farm.trainer")

# TRL keys that would start TRL's own vLLM client (server mode, NCCL weight pushes): refused.
REFUSED = frozenset({"vllm_mode", "vllm_group_port"})
# TRL keys for TRL's own generation, which never runs here: accepted, with a warning.
IGNORED = frozenset(
    {
        "vllm_model_impl",
        "vllm_enable_sleep_mode",
        "vllm_structured_outputs_regex",
        "vllm_gpu_memory_utilization",
        "vllm_max_model_length",
        "vllm_tensor_parallel_size",
        "top_k",
        "min_p",
        "repetition_penalty",
        "generation_kwargs",
        "use_transformers_paged",
        "cache_implementation",
    }
)


class TrainConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # The reference keys (TRL examples/scripts/nemo_gym).
    model_name: str
    dataset_path: str
    eval_dataset_path: Optional[str] = None
    task: str = "farm"  # names the run (wandb run name, the farm's run_id prefix)
    output_dir: str = "outputs/farm_grpo"
    report_to: str = "none"
    project_name: Optional[str] = None
    learning_rate: float = 1.0e-5
    max_steps: int = 100
    num_generations: int = 8
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    max_seq_length: Optional[int] = None
    max_completion_length: Optional[int] = None
    temperature: float = 1.0
    top_p: float = 1.0
    save_steps: int = 500
    eval_strategy: Literal["no", "steps", "epoch"] = "no"
    eval_steps: Optional[int] = None
    vllm_importance_sampling_correction: bool = True  # TRL's IS correction, from the farm's sampler logprobs
    # A few more TRL knobs worth having in the file.
    beta: float = 0.0
    logging_steps: int = 1
    seed: int = 0
    num_train_epochs: float = 1.0
    bf16: bool = False
    torch_threads: Optional[int] = None  # torch.set_num_threads; 1 is fastest on a busy 2-core CPU
    # LoRA through peft (off unless lora_r is set): only the adapters train; weight sync merges them.
    lora_r: Optional[int] = None
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: list[str] = msgspec.field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    # The farm's trainer-side knobs.
    rollout_timeout_s: float = 600.0  # wait this long for a batch; missing rollouts become failures
    run_id: Optional[str] = None  # the result stream; default: <task>-<random>
    results_ttl_s: float = 3600.0  # the run's result stream expires this long after the run ends
    weight_sync: Literal["reload", "none"] = "reload"  # reload: push weights into the farm's vLLM servers
    weight_sync_steps: int = 1  # sync (and bump the policy version) every K optimizer steps
    weights_dir: Optional[str] = None  # where synced weights are saved (default <output_dir>/policy)
    sync_urls: list[str] = []  # servers to reload (default: the farm's policy_urls)
    oversample: float = 1.0  # submit this many times the groups a step needs; keep the first done, cancel the rest
    drop_zero_variance_groups: bool = False  # a group whose rewards are all equal is dropped and replaced
    max_refills: int = 4  # at most this many rounds of replacement groups per step
    partial_rollouts: bool = False  # interrupt the groups a step does not take and resume them the next step
    mask_stale_tokens: Optional[int] = None  # mask tokens sampled more than this many versions before the step's
    min_usable_groups: int = 1  # a batch with fewer groups holding a trainable rollout is not trained on
    max_unusable_batches: int = 3  # submit a step's prompts again this many times, then stop the run
    worker_wait_s: float = 10.0  # pre-flight: how long every agent the data names may take to show a live worker
    share: float = 1.0  # this run's share of the farm's workers while other runs have a backlog (farm.fairness)
    max_in_flight: int = 0  # the most of this run's tasks in flight per agent, whatever its share (0: no cap)
    # Any other top-level key is one of TRL's GRPOConfig arguments, passed to it as it is (TRL checks it).
    trl: dict[str, Any] = {}

    def __post_init__(self) -> None:
        for name in (
            "max_steps",
            "num_generations",
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
            "weight_sync_steps",
            "logging_steps",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.mask_stale_tokens is not None and self.mask_stale_tokens < 0:
            raise ValueError(f"mask_stale_tokens must be >= 0 (versions), got {self.mask_stale_tokens}")
        if self.rollout_timeout_s <= 0:
            raise ValueError("rollout_timeout_s must be > 0")
        if not self.results_ttl_s >= 1:  # NaN included
            raise ValueError(f"results_ttl_s must be >= 1 (seconds), got {self.results_ttl_s}")
        if not self.oversample >= 1.0:  # NaN included
            raise ValueError(f"oversample must be >= 1.0, got {self.oversample}")
        if not 0 < self.share <= 1e6:  # NaN included
            raise ValueError(f"share must be above 0 and at most 1e6, got {self.share}")
        if self.max_in_flight < 0:
            raise ValueError(f"max_in_flight must be >= 0 (0: no cap), got {self.max_in_flight}")
        if self.max_refills < 0:
            raise ValueError(f"max_refills must be >= 0, got {self.max_refills}")
        if self.min_usable_groups < 1 or self.max_unusable_batches < 1:
            raise ValueError("min_usable_groups and max_unusable_batches must be >= 1")
        if not self.worker_wait_s >= 0:
            raise ValueError(f"worker_wait_s must be >= 0, got {self.worker_wait_s}")
        if self.lora_r is not None and self.lora_r < 1:
            raise ValueError(f"lora_r must be >= 1, got {self.lora_r}")
        if self.eval_strategy != "no" and not self.eval_dataset_path:
            raise ValueError(f"eval_strategy {self.eval_strategy!r} needs eval_dataset_path")

    @property
    def completion_limit(self) -> Optional[int]:
        return self.max_completion_length or self.max_seq_length

    @property
    def weights_path(self) -> Path:
        return Path(self.weights_dir or Path(self.output_dir) / "policy")


def model_path(model_name: str, data_path: Path) -> str:
    """Where model_name loads from: a local directory as it is (~ expanded); a bare name (no `/`) that
    is the model the farm prepares, or a directory under <data_dir>/models, is that directory there,
    so FARM_DATA_DIR moves it as it moves `farm policy serve`'s; anything else is a hub id."""
    name = os.path.expanduser(model_name)
    if os.path.isdir(name) or "/" in model_name or model_name.startswith("~"):
        return name
    from workers.policy.serving import MODEL_NAME

    prepared = data_path / "models" / model_name
    return str(prepared) if model_name == MODEL_NAME or prepared.is_dir() else model_name


def load_train_config(path: str | Path, overrides: Optional[dict[str, Any]] = None) -> TrainConfig:
    """The TrainConfig in a YAML file (its `farm:` section is left to farm.settings)."""
    data = read_yaml_mapping(path)
    data.pop("farm", None)
    data.update(overrides or {})
    ours = set(TrainConfig.__struct_fields__) - {"trl"}
    data["trl"] = {k: data.pop(k) for k in list(data) if k not in ours}
    check_trl_keys(data["trl"], str(path))
    try:
        return msgspec.convert(data, TrainConfig, strict=False)
    except (msgspec.ValidationError, ValueError) as exc:
        raise ConfigError(f"invalid training config {path}: {exc}") from None


def refused_key(key: str, value: Any) -> bool:
    """A TRL key that would make TRL sample or sync weights itself: the farm does both."""
    return (key == "use_vllm" and bool(value)) or key in REFUSED or key.startswith("vllm_server_")


def check_trl_keys(keys: dict[str, Any], where: str = "training config", warn: bool = True) -> None:
    """Refuse the keys the farm replaces (one line, exit 2), and say which ones change nothing."""
    refused = sorted(k for k, v in keys.items() if refused_key(k, v))
    if refused:
        raise ConfigError(
            f"{where}: {', '.join(refused)}: the farm samples and syncs the weights itself; remove "
            f"{'it' if len(refused) == 1 else 'them'} (the policy servers are the farm's policy_urls)"
        )
    ignored = sorted(k for k in keys if k in IGNORED)
    if ignored and warn:
        log.warning("%s: %s change nothing here (the farm's workers sample, not TRL)", where, ", ".join(ignored))


def grpo_args(cfg: TrainConfig, **extra: Any):
    """TRL's GRPOConfig for this run."""
    from trl import GRPOConfig

    kwargs: dict[str, Any] = dict(
        output_dir=cfg.output_dir,
        report_to=cfg.report_to,
        learning_rate=cfg.learning_rate,
        max_steps=cfg.max_steps,
        num_generations=cfg.num_generations,
        per_device_train_batch_size=cfg.per_device_train_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        save_steps=cfg.save_steps,
        eval_strategy=cfg.eval_strategy,
        logging_steps=cfg.logging_steps,
        seed=cfg.seed,
        beta=cfg.beta,
        num_train_epochs=cfg.num_train_epochs,
        bf16=cfg.bf16,
        run_name=f"{cfg.task}",
        remove_unused_columns=False,
        vllm_importance_sampling_correction=cfg.vllm_importance_sampling_correction,
    )
    if cfg.completion_limit:
        kwargs["max_completion_length"] = cfg.completion_limit
    if cfg.eval_steps:
        kwargs["eval_steps"] = cfg.eval_steps
    check_trl_keys({**cfg.trl, **extra}, warn=False)
    kwargs.update(cfg.trl)
    kwargs.update(extra)
    try:
        return GRPOConfig(**kwargs)
    except TypeError as exc:  # a key GRPOConfig does not take: name it, as TRL would
        raise ConfigError(
            f"training config: {exc} (a top-level key that is neither the farm's nor one of TRL's GRPOConfig arguments)"
        ) from None
