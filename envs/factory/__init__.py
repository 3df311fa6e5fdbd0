"""TRL `environment_factory` classes, run unchanged on the farm's workers.

A class written for TRL 1.16's `GRPOTrainer(environment_factory=...)` (a `reset(**row)` that may
return text for the prompt, public methods as tools, an optional `get_reward`) and TRL-style reward
functions are served by the environment registered as `environment_factory`; an agent names them
in farm.yaml (`environment_factory:`, `reward_funcs:`, `reward_weights:`). See
docs/trl-environments.md.

- `env`: the environment (rows, pooled instances, tools dispatched to them, the verifier);
- `loading`: import paths and the checks TRL and transformers would make, as one line each;
- `rewards`: the reward as TRL's `_calculate_rewards` computes it, from the rollout's transcript.
"""

from envs.factory.env import FactoryEnvironment, FactoryRow, FactoryState, FactoryTool
from envs.factory.loading import TRL_REWARD_KWARGS, EnvSpec, RewardFunc, import_path, load_env_spec, load_reward
from envs.factory.rewards import completion_messages

__all__ = [
    "TRL_REWARD_KWARGS",
    "EnvSpec",
    "FactoryEnvironment",
    "FactoryRow",
    "FactoryState",
    "FactoryTool",
    "RewardFunc",
    "completion_messages",
    "import_path",
    "load_env_spec",
    "load_reward",
]
