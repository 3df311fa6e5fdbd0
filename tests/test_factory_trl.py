"""Parity with TRL itself: the same `environment_factory` class, rows and model replies through TRL
1.16's GRPOTrainer and through the farm's agent loop give the same prompt ids, the same completion
ids (the sampled ones and the tool results the chat template inserts) and the same rewards.

TRL's side is its own code path: `GRPOTrainer(model=..., environment_factory=..., reward_funcs=...)`
on the CPU, then `_generate_and_score_completions` on a batch (its pool, `reset`, the prompt with
the observation, `_tokenize_prompts` with the environment's tools, its tool loop, its
`_calculate_rewards`). Only the model's sampling is replaced (`_generate_single_turn`), by the same
scripted replies the farm's scripted policy gives, so both sides see the same completions.

The model directory is SmolLM2-135M-Instruct with TRL's own Qwen2.5 chat template: SmolLM2's
template renders no tools, and TRL refuses it. Slow: it loads the model (TRL's trainer needs one).
"""

from __future__ import annotations

import math
import os

import pytest
from helpers import trl_envs
from helpers.policies import ScriptedPolicy

from envs.sdk import load_env
from farm.rows import normalize_row
from farm.schema import Status, Task
from workers.loops.context import AgentContext
from workers.loops.loop import AgentLoop
from workers.policy.chat import ChatTokenizer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

COUNTER = [  # a turn of two sync calls (one raises), a turn of an async call, the answer
    '<tool_call>\n{"name": "increment", "arguments": {"by": 2}}\n</tool_call>\n'
    '<tool_call>\n{"name": "fail", "arguments": {"reason": "x"}}\n</tool_call>',
    '<tool_call>\n{"name": "double", "arguments": {}}\n</tool_call>',
    "The count is 4.",
]
ECHO = ['<tool_call>\n{"name": "echo", "arguments": {"text": "4"}}\n</tool_call>', "I said 4."]
REWARDS = ["exact", "shape", "ids"]  # the answer; how many prompt/completion messages and ids TRL passed
WEIGHTS = [0.5, 1.0, 1.0]


def row(content: str, target: int, environment: str | None = None) -> dict:
    out = {"prompt": [{"role": "user", "content": content}], "target": target}
    return out if environment is None else {**out, "environment": environment}


CASES = {
    # one class; two rows (the counter reaches 4: right for the first, wrong for the second), G = 2
    "single": (
        {"factory": "helpers.trl_envs:Counter"},
        [row("Bring the counter to the target.", 4)] * 2 + [row("Bring the counter to the target.", 5)] * 2,
    ),
    # a dict of classes, chosen by the `environment` column; Echo has no get_reward (TRL: None there)
    "dict": (
        {"factory": {"counter": "helpers.trl_envs:Counter", "echo": "helpers.trl_envs:Echo"}},
        [row("Bring the counter to the target.", 4, "counter")] * 2 + [row("Say the target.", 4, "echo")] * 2,
    ),
}


def script_of(r: dict) -> list[str]:
    return ECHO if r.get("environment") == "echo" else COUNTER


def trl_side(model: str, case: str, out_dir) -> dict:
    """TRL's prompt ids, completion ids and rewards per function for the case's batch."""
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    options, rows = CASES[case]
    factory = options["factory"]
    classes = (
        {name: getattr(trl_envs, path.rpartition(":")[2]) for name, path in factory.items()}
        if isinstance(factory, dict)
        else trl_envs.Counter
    )
    args = GRPOConfig(
        output_dir=str(out_dir),
        use_cpu=True,
        num_generations=2,
        per_device_train_batch_size=4,
        max_completion_length=256,
        reward_weights=WEIGHTS,
        report_to="none",
    )
    trainer = GRPOTrainer(
        model=model,
        environment_factory=classes,
        reward_funcs=[getattr(trl_envs, f) for f in REWARDS],
        args=args,
        train_dataset=Dataset.from_list(rows),
    )
    tok = trainer.processing_class
    seen: dict = {}

    def generate(prompt_ids, images, multimodal_fields, num_generations, **kw):
        """The model's turn: the scripted reply for the row the prompt is of, at the turn it is at."""
        replies = []
        for ids in prompt_ids:
            text = tok.decode(ids)
            script = ECHO if '"name": "echo"' in text and '"name": "increment"' not in text else COUNTER
            turn = text.count("<|im_start|>assistant") - 1
            replies.append(tok.encode(script[turn], add_special_tokens=False) + [tok.eos_token_id])
        return replies, [[0.0] * len(r) for r in replies]

    tokenize, calculate = trainer._tokenize_prompts, trainer._calculate_rewards

    def tokenize_prompts(prompts):
        out = tokenize(prompts)
        seen["prompt_ids"] = [list(map(int, p)) for p in out[0]]
        return out

    def calculate_rewards(inputs, prompts, completions, completion_ids):
        rewards = calculate(inputs, prompts, completions, completion_ids)
        seen.update(completion_ids=[list(map(int, c)) for c in completion_ids], rewards=rewards.tolist())
        seen["weights"] = trainer.reward_weights.tolist()
        return rewards

    trainer._generate_single_turn = generate
    trainer._tokenize_prompts = tokenize_prompts
    trainer._calculate_rewards = calculate_rewards
    trainer.model.train()
    trainer._generate_and_score_completions(list(rows))
    seen["names"] = list(trainer.reward_func_names)
    seen["tools"] = {name: [t.__name__ for t in tools] for name, tools in trainer._env_tools.items()}
    return seen


async def farm_side(model: str, case: str) -> list:
    options, rows = CASES[case]
    env = load_env(
        "environment_factory",
        {**options, "reward_funcs": [f"helpers.trl_envs:{f}" for f in REWARDS], "reward_weights": WEIGHTS},
    )
    tok = ChatTokenizer(model)
    rollouts = []
    for r in rows:
        loop = AgentLoop.over_tokens(env, ScriptedPolicy(tok, script_of(r)), tok)
        task = Task.new(run_id="parity", agent="trl", row=normalize_row(r), reply_to="x")
        rollouts.append(await loop.run(task, AgentContext(worker_id="parity", settings=None)))
    return rollouts


@pytest.mark.parametrize("case", list(CASES))
async def test_prompt_ids_completion_ids_and_rewards_equal_trls(model_dir, tmp_path, case):
    model = str(trl_envs.tool_template_dir(model_dir, tmp_path / "model"))
    trl = trl_side(model, case, tmp_path / "trl")
    farm = await farm_side(model, case)
    assert trl["names"] == [*REWARDS, "Counter"]  # TRL adds the class's get_reward, weight 1
    for i, rollout in enumerate(farm):
        assert rollout.status is Status.ok, rollout.error
        assert list(rollout.trace.prompt()) == trl["prompt_ids"][i], f"prompt {i}"
        assert list(rollout.trace.completion()) == trl["completion_ids"][i], f"completion {i}"
        theirs = {n: v for n, v in zip(trl["names"], trl["rewards"][i]) if not math.isnan(v)}
        assert rollout.reward_components == theirs, i
        total = sum(w * v for w, v in zip(trl["weights"], trl["rewards"][i]) if not math.isnan(v))  # TRL's nansum
        assert rollout.reward == pytest.approx(total), i
    rewards = [r.reward for r in farm]
    assert len(set(rewards)) > 1, "the batch holds right and wrong answers"
    text = ChatTokenizer(model).decode(trl["prompt_ids"][0])
    assert text.count("Bring the counter to the target. The counter is at 0.") == 1  # reset's text, in TRL's too
    if case == "dict":
        assert trl["tools"] == {"counter": ["double", "fail", "increment"], "echo": ["echo"]}
