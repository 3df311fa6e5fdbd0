"""Off-policy correction: TRL's importance sampling from the farm sampler's logprobs.

The sync tests train one GRPO step through the real path: build_trainer, FarmRollout, Redis and
a `farm worker` process of the `noop` agent, whose rollouts carry the sampler logprob -0.5 on
every token. The learner is a tiny random Llama with SmolLM2's vocabulary (its tokens have
probability about 1/49152), so the two disagree by about 10 nats a token and the ratio TRL logs
must be far from 1; with the correction off it must not be logged at all. A model that small keeps
a step to seconds on a 2-core CPU. The async test checks the layout FarmRolloutWorker hands to
TRL's AsyncGRPOTrainer against TRL's own packer.
"""

from __future__ import annotations

import os

import pytest
from helpers.data import trainer_row
from helpers.processes import stop
from helpers.trainer import one_step_config, tiny_model
from helpers.workers import spawn_worker

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

RATIO = "sampling/importance_sampling_ratio/"
LOGP_DIFF = "sampling/sampling_logp_difference/"
NOOP_LOGPROB = -0.5  # what the noop agent reports for every sampled token


def noop_row(i: int, tokens: int = 6) -> dict:
    return trainer_row(i, tokens=tokens, reward=float(i))


@pytest.fixture
def noop_worker(settings):
    proc = spawn_worker(settings, "--agent", "noop", "--concurrency", "8")
    yield proc
    stop(proc)


def train_one_step(settings, model_dir, tmp_path, *, rollout_func=None, **overrides):
    """One GRPO step through build_trainer and the farm: the trainer, its logged metrics, and the
    names of the inputs each loss computation received."""
    from transformers import AutoTokenizer

    from trainer.train import build_trainer

    cfg = one_step_config(tmp_path, model_dir, [noop_row(i) for i in range(2)], **overrides)
    trainer, rollout, _ = build_trainer(
        settings, cfg, model=tiny_model(model_dir), tokenizer=AutoTokenizer.from_pretrained(model_dir)
    )
    if rollout_func is not None:
        trainer.rollout_func = rollout_func(rollout)
    seen: list[set] = []
    compute_loss = trainer._compute_loss

    def recorded(model, inputs):
        seen.append(set(inputs))
        return compute_loss(model, inputs)

    trainer._compute_loss = recorded
    try:
        trainer.train()
    finally:
        rollout.close()
    assert seen, "the loss was never computed"
    return trainer, {k: v for entry in trainer.state.log_history for k, v in entry.items()}, seen


def test_the_correction_is_on_by_default_and_needs_no_trl_vllm(tmp_path):
    from trainer.config import TrainConfig, grpo_args

    cfg = TrainConfig(model_name="m", dataset_path="d")
    args = grpo_args(cfg, output_dir=str(tmp_path), use_cpu=True)
    assert args.vllm_importance_sampling_correction and not args.use_vllm
    off = TrainConfig(model_name="m", dataset_path="d", vllm_importance_sampling_correction=False)
    assert not grpo_args(off, output_dir=str(tmp_path), use_cpu=True).vllm_importance_sampling_correction


@pytest.mark.slow
def test_is_ratio_from_the_farms_logprobs_is_logged_and_reaches_the_loss(settings, noop_worker, model_dir, tmp_path):
    """TRL's defaults (sequence_mask, cap 3): the sequences' ratios are about exp(-60), not 1."""
    from trainer.grpo import FarmSampler

    trainer, logs, loss_inputs = train_one_step(settings, model_dir, tmp_path)
    assert isinstance(trainer.vllm_generation, FarmSampler) and not trainer.args.use_vllm  # no TRL vLLM client
    assert logs[LOGP_DIFF + "mean"] > 5.0  # the learner's ~-10.8 against the sampler's -0.5
    assert logs[RATIO + "max"] < 1e-3
    assert all("importance_sampling_ratio" in keys for keys in loss_inputs)


@pytest.mark.slow
def test_is_mode_and_bounds_pass_through_to_trl(settings, noop_worker, model_dir, tmp_path):
    """token_truncate within [0.5, 2]: every token's ratio (about exp(-10)) is raised to the floor."""
    trl = {
        "vllm_importance_sampling_mode": "token_truncate",
        "vllm_importance_sampling_clip_min": 0.5,
        "vllm_importance_sampling_clip_max": 2.0,
    }
    _, logs, _ = train_one_step(settings, model_dir, tmp_path, trl=trl)
    assert logs[RATIO + "min"] == pytest.approx(0.5) and logs[RATIO + "max"] == pytest.approx(0.5)


@pytest.mark.slow
def test_no_is_ratio_when_the_correction_is_off(settings, noop_worker, model_dir, tmp_path):
    trainer, logs, loss_inputs = train_one_step(
        settings, model_dir, tmp_path, vllm_importance_sampling_correction=False
    )
    assert not trainer.use_vllm and not hasattr(trainer, "vllm_generation")
    assert not [k for k in logs if k.startswith(("sampling/importance", "sampling/sampling_logp"))]
    assert all("importance_sampling_ratio" not in keys for keys in loss_inputs)
    assert logs["farm/rollouts"] == 4  # the step did run on the farm's rollouts


class LearnerLogprobs:
    """The farm's rollouts with their logprobs replaced by the learner's own.

    No farm policy can serve the learner itself on this CPU in seconds (the vLLM test in
    test_trainer.py takes minutes), so the sampler is made to agree with the learner here: the
    ratio must then be 1, which shows that the ratio is the learner's over the rollouts' logprobs.
    """

    __name__ = "learner_logprobs"

    def __init__(self, farm):
        self.farm = farm

    def __call__(self, prompts, trainer):
        out = self.farm(prompts, trainer)
        with torch.no_grad():
            out["logprobs"] = [
                own_logprobs(trainer.model, p, c, trainer.temperature)
                for p, c in zip(out["prompt_ids"], out["completion_ids"])
            ]
        return out


def own_logprobs(model, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / temperature
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None])[:, 0].tolist()


@pytest.mark.slow
def test_is_ratio_is_one_when_the_sampler_is_the_learner(settings, noop_worker, model_dir, tmp_path):
    _, logs, _ = train_one_step(settings, model_dir, tmp_path, rollout_func=LearnerLogprobs)
    assert logs[LOGP_DIFF + "max"] < 1e-4
    for stat in ("min", "mean", "max"):
        assert logs[RATIO + stat] == pytest.approx(1.0, abs=1e-4)


def test_async_samples_pair_each_sampled_token_with_its_sampler_logprob():
    """AsyncGRPOTrainer's ratio is exp(learner logprob - old_log_probs) over the targets TRL's
    packer selects. A rollout built by hand (the noop agent reports one logprob for every token
    and inserts no environment tokens, so it could not show a shift) goes through
    FarmRolloutWorker's group_samples and TRL's TreeRow: every target must be a sampled
    completion token, paired with the sampler's logprob of that very token."""
    from trl.experimental.async_grpo.packing import TreeRow

    from farm.schema import Rollout, Status, Task, TokenTrace
    from trainer.async_adapter import group_samples

    prompt = [11, 12, 13]
    completion = [21, 22, 23, 31, 32, 24, 25]  # 31, 32: a tool result the environment inserted
    logprobs = [-0.1, -0.2, -0.3, 0.0, 0.0, -0.4, -0.5]
    mask = [1, 1, 1, 0, 0, 1, 1]
    row = noop_row(0)
    tasks = [Task.new(run_id="r", agent="noop", row=row, reply_to="x", sample_index=i) for i in range(2)]
    trace = TokenTrace.build(prompt, completion, logprobs, mask, [(0, 3), (5, 7)])
    rollouts = [Rollout.for_task(t, status=Status.ok, reward=float(i), trace=trace) for i, t in enumerate(tasks)]
    samples, _ = group_samples(tasks, rollouts, group_id=0)
    packed_row = TreeRow()
    for s in samples[:1]:
        packed_row.add(
            {
                "input_ids": s.input_ids,
                "completion_mask": s.completion_mask,
                "old_log_probs": s.old_log_probs,
                "advantage": s.advantage,
                "group_id": s.group_id,
            }
        )
    packed = packed_row.pack()
    targets = packed["shift_labels"][packed["token_index"]].tolist()
    sampled = [(t, lp) for t, lp, m in zip(completion, logprobs, mask) if m]
    assert targets == [t for t, _ in sampled]
    assert packed["old_log_probs"].tolist() == pytest.approx([lp for _, lp in sampled])


@pytest.mark.slow
async def test_an_agents_sampling_override_is_recorded_and_refused_for_training(tokenizer):
    """An agent whose `sampling` overrides the temperature samples at its own (the real agent loop,
    a scripted model that records what it was asked with): its rollout says so in
    metrics["sampling"], and both trainer paths refuse it in one error naming the agent and the
    override, instead of training on a biased importance-sampling ratio. Without the override the
    same rollout is trained on."""
    from helpers.policies import ScriptedPolicy

    from envs.math import Math
    from envs.sdk import AgentSettings
    from farm.errors import ConfigError
    from farm.schema import Sampling, Task
    from trainer.async_adapter import group_samples
    from trainer.batch import sample_of
    from workers.loops.agent import AgentContext
    from workers.loops.loop import AgentLoop

    asked: list = []

    class Recording(ScriptedPolicy):
        async def complete(self, prompt_ids, sampling, session):
            asked.append(sampling)
            return await super().complete(prompt_ids, sampling, session)

    row = {
        "responses_create_params": {"input": [{"role": "user", "content": "Compute 2 + 3."}]},
        "question": "Compute 2 + 3.",
        "expected_answer": "5",
    }
    env = Math()

    async def rollout_with(overrides: dict):
        agent = AgentLoop.over_tokens(
            env, Recording(tokenizer, ["\\boxed{5}"]), tokenizer, AgentSettings(loop="single_turn", sampling=overrides)
        )
        task = Task.new(
            run_id="is",
            agent="math",
            row=row,
            reply_to="farm:results:is",
            sampling=Sampling(temperature=1.0, top_p=1.0),
        )
        return task, await agent.run(task, AgentContext(worker_id="test", settings=None))

    try:
        task, hot = await rollout_with({"temperature": 0.6})
        assert asked[-1]["temperature"] == 0.6, asked
        assert hot.ok and hot.metrics["sampling"] == {"temperature": 0.6, "top_p": 1.0}
        refused = "agent 'math' sampled at temperature 0.6 .* the trainer trains at temperature 1.0"
        with pytest.raises(ConfigError, match=refused):
            sample_of(task, hot, tokenizer)
        with pytest.raises(ConfigError, match=refused):
            group_samples([task], [hot], 0)

        task, plain = await rollout_with({})
        assert asked[-1]["temperature"] == 1.0 and plain.metrics["sampling"] == {"temperature": 1.0, "top_p": 1.0}
        assert sample_of(task, plain, tokenizer).reward == 1.0
        assert len(group_samples([task], [plain], 0)[0]) == 1
    finally:
        env.pool.close()
