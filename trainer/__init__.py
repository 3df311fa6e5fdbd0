"""TRL integration: GRPO on rollouts from the farm. The public face:

    from farm import load_settings
    from trainer import build_trainer, load_train_config

    cfg = load_train_config("configs/grpo_smollm2_multi_env.yaml")
    trainer, rollout, sync = build_trainer(load_settings(), cfg)  # GRPOTrainer, its FarmRollout, the weight sync
    trainer.train()

or the pieces for a TRL script of one's own (docs/train-your-own-script.md): `FarmRollout` (the
`rollout_func`), `FarmGRPOTrainer`, `env_reward`, `WeightSyncCallback`, `VllmReload`, and
`farm_dataset` (TRL's dataset for an `environment_factory`, routed to a farm agent). The names
are imported on first use, so `import trainer` loads neither torch nor TRL.

    config.py         TrainConfig: the reference TRL + NeMo Gym keys and the farm's trainer-side knobs
    rollout.py        FarmRollout, GRPOTrainer's rollout_func (Tasks out, token traces and rewards back)
    weights.py        weight sync into running vLLM servers (reload_weights) and policy versions
    sampling.py       over-sampling and dynamic sampling: which groups a step takes, cancels and refills
    batch.py          a step's Batch in TRL's layout and its logged farm/* metrics
    grpo.py           FarmGRPOTrainer: TRL's truncated importance sampling from the farm's sampler logprobs
    train.py          build_trainer / run_train / main: `farm train --config CONFIG.yaml`
    preflight.py      the checks before the model loads: live workers, policy servers that take weights
    stops.py          SIGINT / SIGTERM: cancel the run, one line, exit 130 / 143
    launch.py         `farm train --embedded`: Redis, vLLM and the worker pools for one run
    async_adapter.py  FarmRolloutWorker, a RolloutWorkerProtocol for TRL's AsyncGRPOTrainer

Nothing here is imported by workers: torch and TRL stay in the trainer's process.
"""

from typing import TYPE_CHECKING

from farm.lazy import lazy_exports

if TYPE_CHECKING:  # what the lazy names below are, for type checkers and editors
    from trainer.async_adapter import FarmRolloutWorker
    from trainer.config import TrainConfig, load_train_config
    from trainer.grpo import FarmGRPOTrainer
    from trainer.rollout import FarmRollout, env_reward
    from trainer.train import WeightSyncCallback, build_trainer, farm_dataset, run_train
    from trainer.weights import VllmReload

_EXPORTS = {
    "TrainConfig": "trainer.config",
    "load_train_config": "trainer.config",
    "FarmRollout": "trainer.rollout",
    "env_reward": "trainer.rollout",
    "FarmGRPOTrainer": "trainer.grpo",
    "build_trainer": "trainer.train",
    "farm_dataset": "trainer.train",
    "run_train": "trainer.train",
    "WeightSyncCallback": "trainer.train",
    "VllmReload": "trainer.weights",
    "FarmRolloutWorker": "trainer.async_adapter",
}

__all__ = [
    "FarmGRPOTrainer",
    "FarmRollout",
    "FarmRolloutWorker",
    "TrainConfig",
    "VllmReload",
    "WeightSyncCallback",
    "build_trainer",
    "env_reward",
    "farm_dataset",
    "load_train_config",
    "run_train",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
