"""`farm train --config CONFIG.yaml`: GRPO with TRL, rollouts from the farm, weights synced back.

The flow of one step: TRL samples prompts (NeMo Gym rows as JSON, possibly of several
environments), FarmRollout turns them into Tasks on each agent's stream and waits for the
rollouts, TRL computes the GRPO loss on the returned token traces with the environments'
rewards, and every `weight_sync_steps` steps WeightSyncCallback saves the weights, has the
workers' vLLM servers reload them and bumps the policy version the next Tasks carry. The loss
is corrected for the gap between the farm's sampler and the learner with TRL's importance
sampling, from the logprobs the rollouts carry (trainer/grpo.py).

Under `accelerate launch` every process runs this; each rank submits its own share of the
batch to the farm (TRL hands each rank its own prompts), and only the main process syncs
weights (the others wait at the next step's barrier inside TRL).
"""

from __future__ import annotations

import json
import logging
import os
import reprlib
import time
import uuid
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

from farm.errors import ConfigError
from farm.policy_version import announce_live, announce_loading
from farm.rows import normalize_row
from farm.settings import Settings
from farm.transport import redact
from trainer.config import TrainConfig, grpo_args, model_path
from trainer.flat import FlatSteps
from trainer.rollout import FarmRollout, env_reward
from trainer.stops import Interrupted, StopRun, StopSignals, held_signals, stop_line
from trainer.weights import NoSync, SyncResult, VllmReload, WeightSync

__all__ = [
    "ConsoleMetrics",
    "SaveAsAsked",
    "WeightSyncCallback",
    "build_trainer",
    "farm_dataset",
    "load_rows",
    "lora_config",
    "run_train",
    "to_dataset",
]

log = logging.getLogger("farm.trainer")


def load_rows(path: str | os.PathLike) -> list[dict]:
    """The dataset's rows; a row in TRL's shape (`prompt` + columns) as a farm row (farm.rows)."""
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = normalize_row(json.loads(line))
            if not isinstance(row.get("agent_ref"), dict) or "name" not in row["agent_ref"]:
                raise ValueError(
                    f"{path}:{n}: row lacks agent_ref.name (which agent serves it; "
                    "`farm data prepare --agent NAME` adds one)"
                )
            rows.append(row)
    return rows


def to_dataset(rows: list[dict]):
    """A datasets.Dataset whose `prompt` is each whole row as JSON (as in TRL's NeMo Gym example)."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [json.dumps(r) for r in rows], "agent": [r["agent_ref"]["name"] for r in rows]})


def farm_dataset(dataset: Iterable[Mapping], agent: Optional[str] = None):
    """TRL's dataset for an `environment_factory` (each row a `prompt`, chat messages or a text, and
    the columns `reset` and the reward functions read) as the farm's: `to_dataset` of the rows read
    as farm rows (normalize_row), each routed to `agent`, the farm agent whose config names the class
    and the reward functions by import path; a row's own agent_ref is kept. A row it cannot take is
    a ValueError naming its index and columns."""
    rows = []
    for n, given in enumerate(dataset):
        row = normalize_row(dict(given)) if isinstance(given, Mapping) else given
        problem = _unfit(row, agent)
        if problem:
            columns = f"columns {', '.join(given) or 'none'}" if isinstance(given, Mapping) else type(given).__name__
            raise ValueError(f"dataset row {n} ({columns}): {problem}")
        rows.append({"agent_ref": {"type": "responses_api_agents", "name": agent}, **row})
    return to_dataset(rows)


def _unfit(row: Any, agent: Optional[str]) -> Optional[str]:
    """What keeps a dataset row from the farm, for a person; None when it fits."""
    if not isinstance(row, dict):
        return "a row must be a mapping of columns"
    params = row.get("responses_create_params")
    if params is None:
        return "no `prompt` (TRL's shape: chat messages or a text) and no `responses_create_params` (a farm row)"
    prompt = params.get("input") if isinstance(params, dict) else params
    chat = isinstance(prompt, list) and all(isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in prompt)
    if not isinstance(prompt, str) and not chat:
        return f"the prompt must be chat messages ({{'role': ..., ...}}) or a text, not {reprlib.repr(prompt)}"
    ref = row.get("agent_ref", {"name": agent})
    if not isinstance(ref, dict) or not isinstance(ref.get("name"), str) or not ref["name"]:
        return "no agent_ref.name to route it by: pass agent=NAME, the farm agent whose config names the class"
    return None


def _callback_base():
    from transformers import TrainerCallback

    return TrainerCallback


class WeightSyncCallback(_callback_base()):
    """At the start, policy version 0: the trainer's own weights pushed to the servers. Then every K
    optimizer steps: push the weights to the servers, then bump the policy version.

    Each version is announced on the Redis and namespace the rollout's own client uses (its settings,
    the embedded default included when redis_url is unset), so the workers that run its tasks tag
    their rollouts with it. `redis_url` and `namespace` may only repeat those: naming another Redis
    would tag the rollouts from a version nobody announced there (ConfigError). The announcement of
    version 0 that fails ends the run before its first step; a later one that fails is a warning."""

    def __init__(
        self,
        rollout: FarmRollout,
        sync: WeightSync,
        every: int,
        redis_url: Optional[str] = None,
        namespace: Optional[str] = None,
    ):
        self.rollout, self.sync, self.every = rollout, sync, every
        self.settings = _announcing(rollout.settings, redis_url, namespace)
        self.trainer = None
        self.start: Optional[SyncResult] = None  # the push of the start weights (version 0)
        self.syncs: list[Any] = []

    @property
    def last_weights(self) -> Optional[str]:
        """The directory holding the weights of the live policy version (None when none was saved)."""
        last = self.syncs[-1] if self.syncs else self.start
        return last.path if last is not None else None

    def on_train_begin(self, args, state, control, **kwargs):
        """The servers may still serve what an earlier run pushed: the first step samples from ours."""
        if self.trainer is None:
            return
        version = self.rollout.version
        self.start, seconds = self._publish(version, must=True)
        pushed = "pushed to the servers" if self.start.path else "not pushed (weight_sync: none)"
        log.info("policy v%d = the trainer's start weights, %s (%.1fs)", version, pushed, seconds)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every or self.trainer is None:
            return
        result, seconds = self._publish(self.rollout.version + 1)
        self.syncs.append(result)
        self.trainer._log_metric("farm/weight_sync_s", seconds)
        log.info("step %d: policy v%d published (sync %.1fs)", state.global_step, result.version, seconds)

    def _publish(self, version: int, must: bool = False) -> tuple[SyncResult, float]:
        """Sync the servers to `version` and announce it (main process); every rank then moves to it.
        A stop signal waits until the servers and Redis agree on which version is live."""
        accelerator = self.trainer.accelerator
        t0 = time.perf_counter()
        result = SyncResult(version=version)
        with held_signals():
            if accelerator.is_main_process:
                self._announce(announce_loading, version, must)  # rollouts from here on may span two versions
                result = self.sync.sync(
                    accelerator.unwrap_model(self.trainer.model), self.trainer.processing_class, version
                )
                self._announce(announce_live, version, must)
            self.rollout.version = version
        accelerator.wait_for_everyone()  # no rank submits tasks of the new version before its weights are live
        return result, time.perf_counter() - t0

    def _announce(self, announce, version: int, must: bool) -> None:
        """Tell the workers (farm/policy_version.py) that `version` is loading, or live."""
        from farm.connection import connect_sync
        from farm.errors import TransportError
        from farm.transport import errors

        # farm.connection's client: Sentinel URLs and the password settings work here as everywhere.
        r = connect_sync(self.settings)
        try:
            with errors(self.settings.redis_url or f"redis://127.0.0.1:{self.settings.embedded_port}/0"):
                announce(r, self.settings.keys, version)
        except TransportError as exc:
            if must:
                raise TransportError(f"could not announce policy version {version}: {exc}") from None
            log.warning("could not announce policy version %d: %s", version, exc)
        finally:
            r.close()


def _announcing(settings: Settings, redis_url: Optional[str], namespace: Optional[str]) -> Settings:
    """The rollout's settings, which the callback announces on; a redis_url or namespace that names
    another Redis than the rollout's client uses is refused."""
    if redis_url is not None and redis_url != settings.redis_url:
        raise ConfigError(
            f"WeightSyncCallback: redis_url {redact(redis_url)} is not the rollout's ({redact(settings.redis_url)}): "
            "leave it out, the callback announces on the Redis the rollout's client uses"
        )
    if namespace is not None and namespace != settings.namespace:
        raise ConfigError(
            f"WeightSyncCallback: namespace {namespace!r} is not the rollout's ({settings.namespace!r}): leave it out"
        )
    return settings


class SaveAsAsked(_callback_base()):
    """Transformers saves a checkpoint (weights and optimizer state: 1.6 GB for a 135M model) at the
    last step whatever save_steps says; this keeps to save_steps: checkpoints at its multiples only."""

    def on_step_end(self, args, state, control, **kwargs):
        every = args.save_steps
        if control.should_save and args.save_strategy == "steps" and every >= 1 and state.global_step % int(every):
            control.should_save = False


class ConsoleMetrics(_callback_base()):
    """One line per step on stdout: the farm's numbers with TRL's loss, grad norm and reward, whatever
    the reporter is. `farm train` removes TRL's own printers (a dict per step, and a progress bar
    whose redraws split the log lines), so this is the one."""

    PREFIXES = ("farm/", "reward", "loss", "grad_norm", "rewards/", "kl", "sampling/importance_sampling_ratio/mean")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or not state.is_world_process_zero:
            return
        keep = {k: v for k, v in logs.items() if k.startswith(self.PREFIXES)}
        if keep:
            print(
                f"[train] step {state.global_step} of {state.max_steps}: "
                + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(keep.items())),
                flush=True,
            )


def build_trainer(
    settings: Settings,
    cfg: TrainConfig,
    *,
    reward_funcs: Optional[list] = None,
    weight_sync: Optional[WeightSync] = None,
    model=None,
    tokenizer=None,
    callbacks: Sequence = (),
    **grpo_overrides,
):
    """The GRPOTrainer, its FarmRollout and its WeightSyncCallback, ready to `.train()`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.grpo import FarmGRPOTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    run_id = cfg.run_id or f"{cfg.task}-{uuid.uuid4().hex[:8]}"
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # one result stream per rank: readers delete what they read
        run_id += f"-r{os.environ.get('RANK', '0')}"
    name = model_path(cfg.model_name, settings.data_path)  # a local directory, or a hub id
    log.info("run %s (the run id of `farm status` and the dashboard): %d steps of %s", run_id, cfg.max_steps, name)
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(name)
    model = model or AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16 if cfg.bf16 else torch.float32)
    args = grpo_args(cfg, **grpo_overrides)
    train_rows = load_rows(os.path.expanduser(cfg.dataset_path))
    train_ds = to_dataset(train_rows)
    eval_ds = to_dataset(load_rows(os.path.expanduser(cfg.eval_dataset_path))) if cfg.eval_dataset_path else None
    rollout = FarmRollout(
        settings,
        tokenizer=tokenizer,
        run_id=run_id,
        timeout_s=cfg.rollout_timeout_s,
        num_generations=cfg.num_generations,
        # Over-sampling and dynamic sampling draw their extra groups from the training rows
        # (trainer/sampling.py); each rank from its own shuffled order.
        oversample=cfg.oversample,
        drop_zero_variance_groups=cfg.drop_zero_variance_groups,
        max_refills=cfg.max_refills,
        share=cfg.share,
        max_in_flight=cfg.max_in_flight,
        partial_rollouts=cfg.partial_rollouts,
        mask_stale_tokens=cfg.mask_stale_tokens,
        min_usable_groups=cfg.min_usable_groups,
        max_unusable_batches=cfg.max_unusable_batches,
        spare_rows=train_rows,
        spare_seed=cfg.seed + int(os.environ.get("RANK", "0")),
    )
    if weight_sync is None:
        urls = cfg.sync_urls or list(settings.policy_urls)
        weight_sync = VllmReload(urls, cfg.weights_path) if cfg.weight_sync == "reload" and urls else NoSync()
        if cfg.weight_sync == "reload" and not urls:
            log.warning(
                "weight_sync is 'reload' but no policy_urls/sync_urls are set: the servers keep "
                "their weights; only the policy version advances"
            )
    sync_cb = WeightSyncCallback(rollout, weight_sync, cfg.weight_sync_steps)
    trainer = FarmGRPOTrainer(
        model=model,
        reward_funcs=reward_funcs or [env_reward],
        args=args,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        processing_class=tokenizer,
        rollout_func=rollout,
        callbacks=[sync_cb, ConsoleMetrics(), FlatSteps(rollout), SaveAsAsked(), *callbacks],
        peft_config=lora_config(cfg),
    )
    sync_cb.trainer = trainer
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for printer in (ProgressCallback, PrinterCallback):  # ConsoleMetrics prints each step's one line instead
        trainer.remove_callback(printer)
    return trainer, rollout, sync_cb


def lora_config(cfg: TrainConfig):
    """peft's LoraConfig for this run, or None when LoRA is off."""
    if cfg.lora_r is None:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.lora_target_modules),
        task_type="CAUSAL_LM",
    )


def run_train(settings: Settings, cfg: TrainConfig) -> dict:
    """Train; returns a small summary (steps, last metrics, policy version). On SIGINT or SIGTERM the
    run's outstanding tasks are cancelled and it ends with Interrupted (trainer/stops.py)."""
    built = None
    try:
        with StopSignals():
            built = build_trainer(settings, cfg)
            trainer, rollout, sync_cb = built
            out = trainer.train()
            with held_signals():
                final = _final_weights(cfg, trainer, sync_cb)
    except StopRun as stop:
        raise _interrupted(settings, cfg, built, stop.signum) from None
    finally:
        if built is not None:
            built[1].close(cfg.results_ttl_s)
    summary = {
        "run_id": rollout.run_id,
        "global_step": trainer.state.global_step,
        "train_loss": out.training_loss,
        "policy_version": rollout.version,
        "syncs": len(sync_cb.syncs),
        "unusable_batches": rollout.unusable_batches,
        "final_weights": final,
    }
    Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
    (Path(cfg.output_dir) / "farm_summary.json").write_text(json.dumps(summary, indent=2))
    log.info(
        "run %s done: %d steps, policy v%d; final weights at %s",
        rollout.run_id,
        trainer.state.global_step,
        rollout.version,
        final,
    )
    return summary


def _final_weights(cfg: TrainConfig, trainer, sync_cb: WeightSyncCallback) -> str:
    """The directory holding the weights the run ended with: the last weight sync's when it pushed the
    last step's weights (LoRA merged in; no second copy is written), else TRL's save of the model in
    output_dir (with LoRA, its adapters)."""
    last = sync_cb.syncs[-1] if sync_cb.syncs else None
    if last is not None and last.path and trainer.state.global_step % cfg.weight_sync_steps == 0:
        return str(last.path)
    trainer.save_model(cfg.output_dir)
    return cfg.output_dir


def _interrupted(settings: Settings, cfg: TrainConfig, built: Optional[tuple], signum: int) -> Interrupted:
    """Cancel what the run still has queued or running; the one line that says where it stopped."""
    if built is None:  # stopped while the model loaded: nothing submitted, nothing pushed
        return Interrupted(stop_line(0, cfg.max_steps, None, None), signum)
    trainer, rollout, sync_cb = built
    with held_signals():
        log.info("%s", rollout.cancel_run())
    step = min(trainer.state.global_step + 1, cfg.max_steps)
    start = model_path(cfg.model_name, settings.data_path) if rollout.version == 0 else None
    weights = sync_cb.last_weights or start
    return Interrupted(stop_line(step, cfg.max_steps, weights, rollout.version), signum)
