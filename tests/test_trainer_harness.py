"""A short GRPO run whose batches mix a harness agent (the plain openai SDK loop through the
gateway) with the farm's own loop, on the embedded vLLM: both kinds of rollout reach TRL with
their env reward and sampled ids, and the step trains on them."""

from __future__ import annotations

import json
import os
import time

import pytest
from helpers.processes import stop
from helpers.trainer import even_tokens, one_step_config
from helpers.workers import spawn_worker

from farm.schema import unpack_i32

torch = pytest.importorskip("torch")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_grpo_trains_on_a_batch_of_harness_and_native_rollouts(settings, vllm, model_dir, tmp_path):
    from envs import single_tool_call
    from trainer.rollout import env_reward
    from trainer.train import build_trainer

    torch.set_num_threads(1)
    short = {"env": "single_tool_call", "max_steps": 2, "sampling": {"max_tokens": 24}}
    agents = {"native": short, "sdk": {**short, "harness": "examples.harnesses.plain_sdk:run"}}
    (tmp_path / "workers.yaml").write_text(json.dumps({"agents": agents}))
    env = {
        "FARM_POLICY_URLS": vllm.url,
        "FARM_POLICY_MODEL": vllm.served_model_name,
        "FARM_POLICY_TOKENIZER": str(model_dir),
        "FARM_CONFIG": str(tmp_path / "workers.yaml"),
    }
    procs = [spawn_worker(settings, "--agent", a, "--concurrency", "4", **env) for a in agents]
    rows = []
    for i, agent in enumerate(["native", "sdk", "sdk"]):
        row = single_tool_call.generate(1, seed=10 + i)[0]
        row["agent_ref"] = {"type": "responses_api_agents", "name": agent}
        rows.append(row)
    cfg = one_step_config(
        tmp_path,
        model_dir,
        rows,
        max_steps=2,
        per_device_train_batch_size=6,
        learning_rate=1e-4,
        max_completion_length=48,
        temperature=1.0,
        rollout_timeout_s=150,
    )

    started = time.monotonic()
    try:
        trainer, rollout, _ = build_trainer(settings, cfg, reward_funcs=[env_reward, even_tokens])
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.train()
        rollout.close()
    finally:
        outs = [stop(p, timeout=60) for p in procs]
    elapsed = time.monotonic() - started
    assert all(p.returncode == 0 for p in procs), outs

    assert sum(not torch.equal(before[n], p.detach()) for n, p in trainer.model.named_parameters()) > 0
    assert len(rollout.batches) == 2
    rewards: dict[str, list] = {"native": [], "sdk": []}
    for batch in rollout.batches:
        assert sorted(t.agent_ref.name for t in batch.tasks) == ["native", "native", "sdk", "sdk", "sdk", "sdk"]
        for t, s, r in zip(batch.tasks, batch.samples, batch.rollouts):
            assert r.status.value in ("ok", "truncated"), r.error
            assert s.reward in (0.0, 1.0) and sum(s.env_mask) > 0, (t.agent_ref.name, s)
            rewards[t.agent_ref.name].append(s.reward)
            if t.agent_ref.name == "sdk":
                # One segment, nothing re-tokenized: TRL trains on exactly the ids the model sampled.
                assert r.metrics["segments"] == 1 and r.metrics["retokenized_tokens"] == 0 and not r.segments
                assert s.completion_ids == list(unpack_i32(r.trace.completion_ids))
                assert s.env_mask == list(r.trace.env_mask)
                if r.metrics["turns"] > 1:  # a tool result between turns is in the trace, not trained
                    assert 0 in s.env_mask
    print(
        f"2 GRPO steps on mixed batches in {elapsed:.0f}s; mean reward native "
        f"{sum(rewards['native']) / len(rewards['native']):.2f} ({len(rewards['native'])} samples), harness "
        f"{sum(rewards['sdk']) / len(rewards['sdk']):.2f} ({len(rewards['sdk'])} samples)"
    )
