"""TRL integration: GRPO on rollouts from the farm.

    config.py         TrainConfig: the reference TRL + NeMo Gym keys and the farm's trainer-side knobs
    rollout.py        FarmRollout, GRPOTrainer's rollout_func (Tasks out, token traces and rewards back)
    weights.py        weight sync into running vLLM servers (reload_weights) and policy versions
    sampling.py       over-sampling and dynamic sampling: which groups a step takes, cancels and refills
    batch.py          a step's Batch in TRL's layout and its logged farm/* metrics
    grpo.py           FarmGRPOTrainer: TRL's truncated importance sampling from the farm's sampler logprobs
    train.py          build_trainer / run_train / main: `farm train --config CONFIG.yaml`
    async_adapter.py  FarmRolloutWorker, a RolloutWorkerProtocol for TRL's AsyncGRPOTrainer

Nothing here is imported by workers: torch and TRL stay in the trainer's process.
"""
