"""GRPOTrainer with TRL's importance-sampling correction applied to the farm's rollouts.

The tokens TRL trains on come from the farm's vLLM servers, a policy that is not exactly the
learner: the servers' kernels and precision differ from the trainer's, and a rollout may span
a weight sync (farm/policy_version.py). TRL 1.16 corrects for that with truncated (or masked)
importance sampling: `vllm_importance_sampling_correction` weights each token's loss by the
ratio of the learner's probability at generation time to the sampler's, bounded by
`vllm_importance_sampling_clip_max` / `_clip_min` in the `vllm_importance_sampling_mode` it
names, and logs `sampling/importance_sampling_ratio/{min,mean,max}`. FarmRollout already
returns the sampler's per-token logprobs as `logprobs`. But TRL computes and applies the ratio
only when `use_vllm` is set, and `use_vllm` also makes TRL connect to a vLLM server of its own
at construction and push weights to it before every rollout.

So FarmGRPOTrainer is built with `use_vllm` off (TRL creates no vLLM client), then sets it on
with `FarmSampler` standing in for TRL's vLLM backend. With a rollout_func, the rest of TRL
1.16 reads `use_vllm` only to push weights before calling the rollout_func (a no-op here: the
farm's servers are synced by trainer.train's WeightSyncCallback) and, in TRL's tool loop, to
generate itself (refused: the farm's environments run their own tools, and only the farm
samples). Overriding the methods that hold the correction instead would copy some 400 lines
of TRL; flipping the flag keeps TRL's own code, cap and metrics. tests/test_trainer_is.py
fails if a TRL upgrade moves the gate.

The ratio is only right if both sides use one distribution: the farm's servers return
processed logprobs (after temperature, `--logprobs-mode processed_logprobs`) and FarmRollout
samples at the trainer's temperature, which TRL's learner side divides by.
"""

from __future__ import annotations

from trl import GRPOTrainer

from farm.errors import ConfigError

__all__ = [
    "FarmGRPOTrainer",
    "FarmSampler",
]


class FarmSampler:
    """Stands in for TRL's VLLMGeneration: the farm samples, WeightSyncCallback syncs its servers."""

    def sync_weights(self) -> None:
        return None

    def generate(self, *args, **kwargs):
        raise RuntimeError("FarmGRPOTrainer samples only through its rollout_func (the farm)")


class FarmGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that treats the rollout_func's `logprobs` as the sampler's, for TRL's IS correction."""

    def __init__(self, *args, **kwargs):
        config = kwargs.get("args", args[2] if len(args) > 2 else None)
        if getattr(config, "use_vllm", False):  # before TRL builds a vLLM client of its own
            raise ConfigError(
                "use_vllm: the farm samples and syncs the weights itself; remove it (FarmGRPOTrainer takes its "
                "rollouts from its rollout_func)"
            )
        super().__init__(*args, **kwargs)
        # With the correction off TRL is left as it is.
        self.farm_importance_sampling = self.vllm_importance_sampling_correction
        if not self.farm_importance_sampling:
            return
        if self.rollout_func is None or self.tools:
            raise ValueError(
                "vllm_importance_sampling_correction without use_vllm needs a rollout_func that returns the "
                "sampler's logprobs (the farm's FarmRollout) and no GRPOTrainer tools"
            )
        if self.loss_type == "vespo" and self.vllm_importance_sampling_mode not in ("token_truncate", "token_mask"):
            raise ValueError(  # TRL's own check, which its __init__ skipped with use_vllm off
                "VESPO loss requires vllm_importance_sampling_mode 'token_truncate' or 'token_mask', "
                f"got {self.vllm_importance_sampling_mode!r}"
            )
        self.use_vllm = True
        self.vllm_generation = FarmSampler()
        self._last_loaded_step = -1
