"""GRPO on the arithmetic example: train_trl.py as TRL 1.16 runs it (TRL samples, Calculator in
this process), train_farm.py the same script with the rollouts on the farm's workers. How to run
each, and the diff between them: docs/trl-environments.md, "Your own TRL script".
"""

import sys

from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from examples.trl_envs.arithmetic import Calculator, correct_answer

model_dir, rows_path, out = sys.argv[1:4]
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir)
dataset = load_dataset("json", data_files=rows_path, split="train")  # TRL's shape: prompt, a, b
args = GRPOConfig(
    out, max_steps=2, num_generations=2, per_device_train_batch_size=4, max_completion_length=64, bf16=False
)
trainer = GRPOTrainer(
    model,
    reward_funcs=[correct_answer],
    args=args,
    train_dataset=dataset,
    processing_class=tokenizer,
    environment_factory=Calculator,
)
trainer.train()
