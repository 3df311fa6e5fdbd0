"""GRPO on the arithmetic example: train_trl.py as TRL 1.16 runs it (TRL samples, Calculator in
this process), train_farm.py the same script with the rollouts on the farm's workers. How to run
each, and the diff between them: docs/trl-environments.md, "Your own TRL script".
"""

import sys
from pathlib import Path

from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig

from farm import load_settings
from trainer import FarmGRPOTrainer, FarmRollout, VllmReload, WeightSyncCallback, env_reward, farm_dataset

model_dir, rows_path, out = sys.argv[1:4]
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir)
dataset = load_dataset("json", data_files=rows_path, split="train")  # TRL's shape: prompt, a, b
args = GRPOConfig(
    out, max_steps=2, num_generations=2, per_device_train_batch_size=4, max_completion_length=64, bf16=False
)
settings = load_settings()  # Redis and the policy servers: FARM_REDIS_URL, FARM_POLICY_URLS
rollout = FarmRollout(settings, tokenizer=tokenizer, num_generations=args.num_generations)
sync = WeightSyncCallback(rollout, VllmReload(settings.policy_urls, Path(out) / "policy"), every=1)
trainer = FarmGRPOTrainer(
    model,
    reward_funcs=[env_reward],  # the workers' sum of correct_answer and Calculator.get_reward
    args=args,
    train_dataset=farm_dataset(dataset, agent="arithmetic"),  # the agent naming Calculator in farm.yaml
    processing_class=tokenizer,
    rollout_func=rollout,
    callbacks=[sync],
)
sync.trainer = trainer
trainer.train()
rollout.close()
