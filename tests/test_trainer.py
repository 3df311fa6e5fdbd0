"""The trainer consumer: TRL's GRPOTrainer fed by the farm, weight sync, the AsyncGRPO adapter.

The fast tests run the rollout function against real Redis and a `farm worker` process of
the `noop` agent (synthetic token traces, rewards read from the row), so TRL's contract is
checked without a model server. The slow test trains SmolLM2 for two GRPO steps against a
vLLM server of its own (the shared one must never receive new weights), started with
VLLM_SERVER_DEV_MODE=1 so that weight sync can reload it in place.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from helpers.data import trainer_row
from helpers.trainer import CharTokenizer, even_tokens, one_step_config, tiny_model
from helpers.waiting import wait_for
from helpers.workers import spawn_worker

from farm.schema import Sampling

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def stop(proc, timeout: float = 30.0) -> str:
    proc.terminate()
    try:
        return proc.communicate(timeout=timeout)[0]
    except Exception:
        proc.kill()
        return proc.communicate()[0]


@pytest.fixture
def noop_worker(settings):
    proc = spawn_worker(settings, "--agent", "noop", "--concurrency", "16")
    yield proc
    stop(proc)


@pytest.mark.slow
def test_rollout_func_returns_one_masked_entry_per_prompt(settings, noop_worker):
    from trainer.rollout import FarmRollout, env_reward

    rows = [trainer_row(0, tokens=5, reward=1.0), trainer_row(1, fail="fatal"), trainer_row(2, tokens=3, reward=0.25)]
    prompts = [json.dumps(r) for r in rows for _ in range(2)]  # TRL repeats each prompt num_generations times
    rollout = FarmRollout(
        settings,
        tokenizer=CharTokenizer(),
        run_id="unit",
        timeout_s=30,
        num_generations=2,
        sampling=Sampling(max_tokens=8),
    )
    rollout.version = 3
    try:
        out = rollout(prompts)
    finally:
        rollout.close()
    assert {k: len(v) for k, v in out.items()} == {k: 6 for k in out}
    assert out["completion_ids"][0] == [i % 32000 for i in range(5)] and out["env_mask"][0] == [1] * 5
    assert out["env_reward"] == [1.0, 1.0, None, None, 0.25, 0.25]
    # The failed group: one placeholder token, masked out of the loss, reward None (no advantage).
    assert out["completion_ids"][2] == [2] and out["env_mask"][2] == [0] and out["logprobs"][2] == [0.0]
    assert out["farm_status"][2:4] == ["verifier", "verifier"]
    assert env_reward(out["completion_ids"], env_reward=out["env_reward"]) == out["env_reward"]
    batch = rollout.batches[-1]
    groups = {}
    for t in batch.tasks:
        groups.setdefault(t.group_id, []).append(t.sample_index)
        assert t.policy_version == 3 and t.sampling.max_tokens == 8
    assert list(groups.values()) == [[0, 1]] * 3
    m = batch.metrics
    assert m["farm/failed"] == 2 and m["farm/failed/verifier"] == 2 and m["farm/reward/noop/mean"] == 0.625
    assert m["farm/staleness/max"] == 0 and m["farm/tokens/sampled"] == 16


def test_rollout_func_rejects_rows_without_agent_ref_and_split_groups(settings):
    from trainer.rollout import FarmRollout

    rollout = FarmRollout(settings, tokenizer=CharTokenizer(), timeout_s=5, num_generations=2)
    try:
        with pytest.raises(ValueError, match="agent_ref"):
            rollout.tasks_for(["hello", "hello"], 2, Sampling())
        with pytest.raises(ValueError, match="differ"):
            rollout.tasks_for([json.dumps(trainer_row(0)), json.dumps(trainer_row(1))], 2, Sampling())
    finally:
        rollout.close()


def test_missing_rollouts_become_deadline_failures(settings):
    """No worker serves the agent: an evaluation batch comes back at the deadline, all masked, counted;
    a training batch is never handed to TRL (test_train_run.py: no step on nothing)."""
    from trainer.rollout import FarmRollout, NoLiveWorker

    rollout = FarmRollout(settings, tokenizer=CharTokenizer(), timeout_s=1.0, num_generations=2)
    try:
        batch = rollout.generate([json.dumps(trainer_row(0))] * 2, select=False)
        with pytest.raises(NoLiveWorker):
            rollout([json.dumps(trainer_row(0))] * 2)
    finally:
        rollout.close()
    assert [s.reward for s in batch.samples] == [None, None] and [s.env_mask for s in batch.samples] == [[0], [0]]
    assert batch.metrics["farm/failed/deadline"] == 2


def test_a_training_run_carries_its_share_and_cap_to_the_farm(settings, model_dir, tmp_path, sync_redis):
    """The config's `share` and `max_in_flight` reach the run's record in Redis (the agent's runs
    hash, farm.fairness) through build_trainer's FarmRollout and through the async adapter."""
    from transformers import AutoTokenizer

    from trainer.async_adapter import FarmRolloutWorker
    from trainer.train import build_trainer

    cfg = one_step_config(tmp_path, model_dir, [trainer_row(0)], share=2.5, max_in_flight=3, run_id="capped")
    tok = AutoTokenizer.from_pretrained(model_dir)
    _, rollout, _ = build_trainer(settings, cfg, model=tiny_model(model_dir), tokenizer=tok)
    rollout.timeout_s = 0.5  # no worker: the batch comes back at the deadline, the run's record stays
    try:
        rollout.generate([json.dumps(trainer_row(0))] * 2, select=False)
    finally:
        rollout.close()
    runs = settings.keys.runs("noop")
    assert sync_redis.hget(runs, "cap:capped") == b"3" and float(sync_redis.hget(runs, "share:capped")) == 2.5

    worker = FarmRolloutWorker(
        settings, [trainer_row(1)], num_generations=2, timeout_s=5, run_id="async-capped", share=0.5, max_in_flight=2
    )
    worker.start()
    try:  # read while the tasks are queued: stop() cancels them and the run's record goes with them
        wait_for(lambda: sync_redis.hget(runs, "cap:async-capped") is not None, what="the async run's record")
        cap, share = sync_redis.hmget(runs, ["cap:async-capped", "share:async-capped"])
    finally:
        worker.stop()
    assert cap == b"2" and float(share) == 0.5
    with pytest.raises(ValueError, match="max_in_flight"):
        one_step_config(tmp_path, model_dir, [trainer_row(0)], max_in_flight=-1)


REFERENCE_YAML = """
model_name: "Qwen/Qwen2.5-1.5B-Instruct"
dataset_path: "data/workplace_assistant/train.jsonl"
eval_dataset_path: "data/workplace_assistant/validation.jsonl"
task: 'workplace'
output_dir: "outputs/nemo_gym"
report_to: "none"
project_name: "trl-nemo-gym"
learning_rate: 1.0e-5
max_steps: 1000
num_generations: 8
per_device_train_batch_size: 8
gradient_accumulation_steps: 4
max_seq_length: 16384
temperature: 1.0
top_p: 0.999
save_steps: 10
eval_strategy: "steps"
eval_steps: 10
vllm_importance_sampling_correction: true
rollout_timeout_s: 120
weight_sync_steps: 4
farm:
  redis_url: redis://127.0.0.1:6379/0
  namespace: rl
  policy_urls: [http://127.0.0.1:8000]
"""


def test_config_accepts_the_reference_keys_and_the_farm_section(tmp_path):
    from farm.settings import load_settings
    from trainer.config import grpo_args, load_train_config

    path = tmp_path / "config.yaml"
    path.write_text(REFERENCE_YAML)
    cfg = load_train_config(path)
    settings = load_settings(path, env={})
    assert cfg.max_steps == 1000 and cfg.completion_limit == 16384 and cfg.weight_sync_steps == 4
    assert settings.namespace == "rl" and settings.policy_urls == ["http://127.0.0.1:8000"]
    args = grpo_args(cfg, output_dir=str(tmp_path / "out"))
    assert args.num_generations == 8 and args.max_completion_length == 16384 and args.top_p == 0.999
    assert args.eval_strategy == "steps" and args.eval_steps == 10 and args.use_vllm is False
    path.write_text(REFERENCE_YAML + "\nbogus_key: 1\n")
    from farm.errors import ConfigError

    cfg = load_train_config(path)  # not the farm's: it goes to TRL, which checks it
    assert cfg.trl == {"bogus_key": 1}
    with pytest.raises(ConfigError, match="bogus_key"):
        grpo_args(cfg, output_dir=str(tmp_path / "out"))


def test_embedded_workers_stream_when_the_run_keeps_partial_rollouts(tmp_path, monkeypatch):
    """`farm train --embedded` with partial_rollouts starts its workers with policy_stream, so an
    interrupted turn keeps its tokens; without it, the workers' own settings decide."""
    import contextlib

    from farm.settings import Settings
    from trainer import launch
    from trainer.config import TrainConfig
    from workers.supervise import stack

    seen, ports = [], []

    @contextlib.contextmanager
    def local_stack(settings, pools, policy, env, log_prefix):
        seen.append(env)
        ports.append(policy.port)
        yield type("Started", (), {"settings": settings})()

    monkeypatch.setattr(stack, "LocalStack", local_stack)
    monkeypatch.setattr(launch, "served_model", lambda cfg, settings: "m")
    base = dict(model_name="m", dataset_path=str(tmp_path / "rows.jsonl"), output_dir=str(tmp_path))
    for partial in (True, False):
        cfg = TrainConfig(**base, partial_rollouts=partial)
        with launch.embedded_farm(Settings(), cfg, ["noop"], launch.Embedded(policy_port=8123 if partial else 0)):
            pass
    assert seen == [{"FARM_POLICY_STREAM": "1"}, {}]
    assert ports == [8123, 0]  # `farm train --embedded --policy-port 8123` pins vLLM's port; 0 takes a free one


def test_example_configs_load():
    from pathlib import Path

    from farm.settings import load_settings
    from trainer.config import load_train_config

    examples = sorted((Path(__file__).resolve().parents[1] / "configs").glob("grpo_*.yaml"))
    assert examples
    for path in examples:
        cfg = load_train_config(path)
        assert cfg.model_name and cfg.dataset_path and load_settings(path, env={}).policy_urls


def test_farm_train_reports_a_bad_config(tmp_path, capsys):
    from farm.cli import main

    path = tmp_path / "c.yaml"
    path.write_text("model_name: m\ndataset_path: d.jsonl\nnum_generations: 0\n")
    assert main(["train", "--config", str(path)]) == 2
    assert "num_generations" in capsys.readouterr().err


# -- the AsyncGRPOTrainer adapter -------------------------------------------------------------


@pytest.mark.slow
def test_async_worker_adapter_streams_scored_groups(settings, noop_worker):
    """RolloutWorkerProtocol over the farm: samples land in rollout_buffer, tagged and scored."""
    from trainer.async_adapter import FarmRolloutWorker

    rows = [trainer_row(0, tokens=4, reward=1.0), trainer_row(1, fail="fatal"), trainer_row(2, tokens=6, reward=0.0)]
    worker = FarmRolloutWorker(settings, rows, num_generations=2, max_groups_in_flight=2, timeout_s=20)
    for attr in ("rollout_buffer", "metrics_queue", "start", "stop", "update_model_version", "check_health"):
        assert hasattr(worker, attr)
    worker.update_model_version(7)
    worker.start()
    try:
        samples = [worker.rollout_buffer.get(timeout=30) for _ in range(4)]
        worker.check_health(stale_after_s=60)
    finally:
        worker.stop()
    for s in samples:
        n = len(s.input_ids)
        assert len(s.completion_mask) == n and len(s.old_log_probs) == n
        assert s.model_version == 7 and s.advantage == 0.0  # noop rewards are equal within a group
        assert s.completion_mask.sum() in (4, 6) and s.completion_mask[:16].sum() == 0
    metrics = []
    while not worker.metrics_queue.empty():
        metrics.append(worker.metrics_queue.get())
    assert any(m.get("farm/failed/verifier") for m in metrics)  # the failed group is counted, not trained on


def _drain_metrics(worker) -> list[dict]:
    out = []
    while not worker.metrics_queue.empty():
        out.append(worker.metrics_queue.get())
    return out


@pytest.mark.slow
@pytest.mark.parametrize("on_stale", ["requeue", "drop"])
def test_async_worker_bounds_staleness(settings, noop_worker, on_stale):
    """Weights change while a group's rollouts are generating (each takes 1.5 s): with
    max_staleness=1, a group that started 3 versions behind is re-queued at the current version
    (or dropped), and no sample older than the bound reaches the buffer."""
    from trainer.async_adapter import FarmRolloutWorker

    rows = [trainer_row(0, tokens=4, reward=1.0, sleep_s=1.5)]
    worker = FarmRolloutWorker(
        settings, rows, num_generations=2, max_groups_in_flight=1, timeout_s=30, max_staleness=1, on_stale=on_stale
    )
    worker.start()
    try:
        time.sleep(0.5)  # the first group is in flight at version 0
        worker.update_model_version(3)
        samples = [worker.rollout_buffer.get(timeout=30) for _ in range(2)]
    finally:
        worker.stop()
    metrics = _drain_metrics(worker)
    assert all(s.model_version == 3 for s in samples)  # only rollouts generated at the current version
    key = "farm/stale_requeued" if on_stale == "requeue" else "farm/stale_dropped"
    stale = [m for m in metrics if key in m]
    assert stale and stale[0][key] == 2.0 and stale[0]["farm/staleness"] == 3.0
    assert all(m.get("farm/staleness", 0.0) <= 1.0 for m in metrics if "farm/rollouts" in m)


@pytest.mark.slow
def test_async_worker_without_a_bound_keeps_stale_samples_tagged_with_their_version(settings, noop_worker):
    from trainer.async_adapter import FarmRolloutWorker

    worker = FarmRolloutWorker(
        settings, [trainer_row(0, tokens=4, sleep_s=1.5)], num_generations=2, max_groups_in_flight=1, timeout_s=30
    )
    worker.start()
    try:
        time.sleep(0.5)
        worker.update_model_version(3)
        first = [worker.rollout_buffer.get(timeout=30) for _ in range(2)]
    finally:
        worker.stop()
    assert [s.model_version for s in first] == [0, 0]  # generated at version 0: the trainer filters on this
    assert any(m.get("farm/staleness") == 3.0 for m in _drain_metrics(worker))


def test_lora_weights_are_synced_merged_under_the_base_names(model_dir, tmp_path):
    """What the servers reload from a LoRA run: the full model with the adapters merged in, under
    the base model's parameter names; the adapters stay unmerged in the training model."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from trainer.config import TrainConfig
    from trainer.train import lora_config
    from trainer.weights import save_full_weights

    torch.manual_seed(0)
    cfg = TrainConfig(model_name=str(model_dir), dataset_path="x", lora_r=4)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), lora_config(cfg))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)  # a trained adapter (lora_B starts at zero)
    ids = torch.tensor([[1, 504, 3458, 314, 260, 3575, 282, 4649, 47]])
    with torch.no_grad():
        want = model(ids).logits
        base = model.get_base_model()
        with model.disable_adapter():
            plain = model(ids).logits
    assert (want - plain).abs().max() > 0.05  # the adapter changes the output
    save_full_weights(model, tmp_path / "v1")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "v1", dtype=torch.float32)
    with torch.no_grad():
        got = loaded(ids).logits
        again = model(ids).logits
    assert (got - want).abs().max() < 1e-3  # the saved model is the merged one (float rounding apart)
    assert (again - want).abs().max() < 1e-3  # and training goes on with the adapters unmerged
    assert set(loaded.state_dict()) == {k for k in AutoModelForCausalLM.from_pretrained(model_dir).state_dict()}
    assert base is model.get_base_model()


def test_async_worker_health_check_raises_when_dead(settings):
    from trainer.async_adapter import FarmRolloutWorker

    worker = FarmRolloutWorker(settings, [trainer_row(0, tokens=2)], num_generations=2, timeout_s=1)
    with pytest.raises(RuntimeError, match="not started"):
        worker.check_health(stale_after_s=1)


# -- the real thing: GRPO steps of SmolLM2 through Redis, workers and vLLM ----------------------


@pytest.fixture(scope="module")
def reloadable_vllm(vllm, model_dir):
    """The session's vLLM (started with the dev endpoints weight sync needs), or
    FARM_TEST_RELOAD_VLLM_URL; the original weights are loaded back afterwards, so the tests
    that run later see the model they expect."""
    from urllib.parse import urlsplit

    from workers.policy.serving import PolicyServer

    if os.environ.get("FARM_TEST_RELOAD_VLLM_URL"):
        url = urlsplit(os.environ["FARM_TEST_RELOAD_VLLM_URL"])
        server = PolicyServer(model_dir, host=url.hostname, port=url.port, max_model_len=1024)
    else:
        server = vllm
    yield server
    import httpx

    httpx.post(
        f"{server.url}/collective_rpc",
        json={"method": "reload_weights", "kwargs": {"weights_path": str(model_dir)}},
        timeout=120,
    ).raise_for_status()
    httpx.post(f"{server.url}/reset_prefix_cache", timeout=30).raise_for_status()


def _prompt_logprobs(server, ids: list[int]) -> list[float]:
    import httpx

    body = {"model": server.served_model_name, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
    resp = httpx.post(server.openai_url + "/completions", json=body, timeout=120)
    resp.raise_for_status()
    return [next(iter(d.values()))["logprob"] for d in resp.json()["choices"][0]["prompt_logprobs"][1:]]


@pytest.mark.vllm
@pytest.mark.slow
def test_rollouts_record_a_weight_reload_announced_mid_generation(
    settings, reloadable_vllm, model_dir, sync_redis, tmp_path
):
    """A real worker generating with real vLLM while the trainer's weight sync (a real in-place
    reload of changed weights) is announced: the rollout in flight records both versions; one
    generated after the sync records only the new one."""
    import asyncio

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envs import mcqa
    from farm.client import FarmClient
    from farm.policy_version import announce_live, announce_loading
    from trainer.weights import VllmReload

    torch.set_num_threads(1)
    server, keys = reloadable_vllm, settings.keys
    announce_live(sync_redis, keys, 0)
    proc = spawn_worker(
        settings,
        "--agent",
        "mcqa",
        "--concurrency",
        "2",
        FARM_POLICY_URLS=server.url,
        FARM_POLICY_MODEL=server.served_model_name,
        FARM_POLICY_TOKENIZER=str(model_dir),
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(1.01)  # different weights, same shapes
    sync = VllmReload([server.url], tmp_path / "weights")
    rows = mcqa.generate(2, seed=4)

    def delivered() -> int:  # tasks the worker pool has read
        groups = sync_redis.xinfo_groups(keys.tasks("mcqa"))
        return sum(g["entries-read"] or 0 for g in groups if g["name"] in (b"workers", "workers"))

    async def main():
        client = FarmClient(settings)
        try:
            # A rollout in flight at the announcement: up to 600 sampled tokens, about 10 s here. A
            # sample that ends within half a second (an early end of sequence) is set aside and the
            # next seed tried, so the check below is about the versions, not about one sample's length.
            for attempt in range(4):
                long = Sampling(max_tokens=600, temperature=1.0, seed=1 + attempt)
                first = client.task(run_id="pv", agent="mcqa", row=rows[0], sampling=long, policy_version=0)
                await client.submit([first])
                results = asyncio.ensure_future(client.collect([first], timeout_s=240))
                deadline = time.monotonic() + 120
                while delivered() <= attempt:  # the worker has the task
                    assert time.monotonic() < deadline, "the worker never read the task"
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.5)
                if not results.done():
                    break
                await results
            in_flight = not results.done()
            announce_loading(sync_redis, keys, 1)
            await asyncio.to_thread(sync.sync, model, AutoTokenizer.from_pretrained(model_dir), 1)
            announce_live(sync_redis, keys, 1)
            spanning = (await results)[first.task_id]
            second = client.task(
                run_id="pv", agent="mcqa", row=rows[1], sampling=Sampling(max_tokens=16), policy_version=1
            )
            after = (await client.run_batch([second], timeout_s=240))[second.task_id]
            return in_flight, spanning, after
        finally:
            await client.aclose()

    try:
        in_flight, spanning, after = asyncio.run(main())
    finally:
        out = stop(proc, timeout=60)
    assert proc.returncode == 0, out
    assert in_flight, "the first rollout finished before the sync was announced"
    assert spanning.status.value in ("ok", "truncated"), spanning.error
    assert (spanning.policy_version, spanning.policy_version_end) == (0, 1)
    assert after.status.value in ("ok", "truncated"), after.error
    assert (after.policy_version, after.policy_version_end) == (1, None)


@pytest.mark.vllm
@pytest.mark.slow
def test_grpo_steps_through_the_farm_with_weight_sync(settings, reloadable_vllm, model_dir, tmp_path, sync_redis):
    from envs import session_state, single_tool_call
    from trainer.config import TrainConfig
    from trainer.rollout import env_reward
    from trainer.train import build_trainer
    from trainer.weights import VllmReload

    torch.set_num_threads(1)  # on a busy 2-core box one thread trains ~4x faster than two
    server = reloadable_vllm
    # Short rollouts: the agents' own sampling overrides (96/128 tokens) are lowered here.
    (tmp_path / "workers.yaml").write_text(
        json.dumps(
            {
                "agents": {
                    "single_tool_call": {"env": "single_tool_call", "max_steps": 2, "sampling": {"max_tokens": 24}},
                    "session_state": {"env": "session_state", "max_steps": 2, "sampling": {"max_tokens": 24}},
                }
            }
        )
    )
    env = {
        "FARM_POLICY_URLS": server.url,
        "FARM_POLICY_MODEL": server.served_model_name,
        "FARM_POLICY_TOKENIZER": str(model_dir),
        "FARM_CONFIG": str(tmp_path / "workers.yaml"),
    }
    procs = [
        spawn_worker(settings, "--agent", a, "--concurrency", "4", **env) for a in ("single_tool_call", "session_state")
    ]
    rows = [
        single_tool_call.generate(1, seed=5)[0],
        session_state.generate(1, seed=5)[0],
        {"agent_ref": {"type": "responses_api_agents", "name": "single_tool_call"}, "broken": True},
    ]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = TrainConfig(
        model_name=str(model_dir),
        dataset_path=str(data),
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        num_generations=2,
        per_device_train_batch_size=6,
        learning_rate=1e-4,
        max_completion_length=24,
        temperature=1.0,
        rollout_timeout_s=150,
        weight_sync_steps=1,
        save_steps=1000,
        torch_threads=1,
    )
    seen: list[dict] = []

    def recorded_env_reward(completions, **kw):
        seen.append({"env_reward": list(kw["env_reward"]), "agent": list(kw["agent"])})
        return env_reward(completions, **kw)

    probe = list(range(100, 120))
    before_served = _prompt_logprobs(server, probe)
    sync = VllmReload([server.url], tmp_path / "weights")
    started = time.monotonic()
    try:
        trainer, rollout, sync_cb = build_trainer(
            settings, cfg, reward_funcs=[recorded_env_reward, even_tokens], weight_sync=sync
        )
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.train()
        rollout.close()
    finally:
        outs = [stop(p, timeout=60) for p in procs]
    elapsed = time.monotonic() - started
    assert all(p.returncode == 0 for p in procs), outs

    # Parameters changed.
    changed = sum(not torch.equal(before[n], p.detach()) for n, p in trainer.model.named_parameters())
    assert changed > 0
    # Every batch mixed both environments, in groups of 2 consecutive samples of one row.
    assert len(rollout.batches) == 2
    for k, batch in enumerate(rollout.batches):
        by_group: dict[str, list] = {}
        for t in batch.tasks:
            by_group.setdefault(t.group_id, []).append(t)
        assert len(by_group) == 3 and all([t.sample_index for t in g] == [0, 1] for g in by_group.values())
        assert all(len({json.dumps(t.row, sort_keys=True) for t in g}) == 1 for g in by_group.values())
        assert {t.agent_ref.name for t in batch.tasks} == {"single_tool_call", "session_state"}
        # The broken row failed as `malformed`, and was masked and counted, not scored 0.
        for t, s, r in zip(batch.tasks, batch.samples, batch.rollouts):
            if "broken" in t.row:
                assert r.error.kind == "malformed" and s.reward is None and s.env_mask == [0]
            else:
                assert r.status.value in ("ok", "truncated"), r.error
                assert s.reward in (0.0, 1.0) and sum(s.env_mask) > 0
        assert batch.metrics["farm/failed/malformed"] == 2
        # The env rewards reached the reward function, in order.
        assert seen[k]["env_reward"] == [s.reward for s in batch.samples]
        assert seen[k]["agent"] == [t.agent_ref.name for t in batch.tasks]
        # Tasks carried the version published before them; rollouts echo it.
        assert {t.policy_version for t in batch.tasks} == {k}
        assert {r.policy_version for r in batch.rollouts} == {k}
    # Weight sync ran after each step: the version advanced and the server serves new weights.
    assert rollout.version == 2 and [s.version for s in sync_cb.syncs] == [1, 2]
    assert int(sync_redis.get(settings.keys.policy_version())) == 2
    after_served = _prompt_logprobs(server, probe)
    assert max(abs(a - b) for a, b in zip(before_served, after_served)) > 1e-5
    print(
        f"2 GRPO steps in {elapsed:.0f}s; syncs: "
        + ", ".join(f"save {s.save_s:.1f}s reload {s.reload_s:.1f}s" for s in sync_cb.syncs)
    )


@pytest.mark.vllm
@pytest.mark.slow
def test_a_second_run_samples_from_its_own_start_weights(settings, reloadable_vllm, model_dir, tmp_path, sync_redis):
    """An earlier run left other weights on the server and version 3 live. The next run pushes the
    weights it starts from as version 0 before its first rollout: the server serves them again (the
    model's own logprobs, not the earlier run's) and the first rollouts carry version 0."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from envs import mcqa
    from farm.policy_version import announce_live
    from trainer.config import TrainConfig
    from trainer.train import build_trainer
    from trainer.weights import VllmReload

    torch.set_num_threads(1)
    server, probe = reloadable_vllm, list(range(100, 120))
    VllmReload([server.url], tmp_path)._reload(server.url, str(model_dir))  # the model as prepared
    original = _prompt_logprobs(server, probe)
    earlier = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        earlier.lm_head.weight.mul_(1.01)
    VllmReload([server.url], tmp_path / "earlier").sync(earlier, AutoTokenizer.from_pretrained(model_dir), 3)
    announce_live(sync_redis, settings.keys, 3)
    left = _prompt_logprobs(server, probe)
    assert max(abs(a - b) for a, b in zip(original, left)) > 1e-3  # the earlier run's weights differ

    served: list[list[float]] = []

    class Probe(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):  # after WeightSyncCallback's push
            served.append(_prompt_logprobs(server, probe))

    proc = spawn_worker(
        settings,
        "--agent",
        "mcqa",
        "--concurrency",
        "2",
        FARM_POLICY_URLS=server.url,
        FARM_POLICY_MODEL=server.served_model_name,
        FARM_POLICY_TOKENIZER=str(model_dir),
    )
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in mcqa.generate(1, seed=3)))
    cfg = TrainConfig(
        model_name=str(model_dir),
        dataset_path=str(data),
        output_dir=str(tmp_path / "out"),
        max_steps=1,
        num_generations=2,
        per_device_train_batch_size=2,
        max_completion_length=16,
        rollout_timeout_s=150,
        weight_sync_steps=1000,
        save_steps=1000,
        torch_threads=1,
    )
    try:
        trainer, rollout, sync_cb = build_trainer(
            settings, cfg, weight_sync=VllmReload([server.url], tmp_path / "weights"), callbacks=[Probe()]
        )
        trainer.train()
        rollout.close()
    finally:
        out = stop(proc, timeout=60)
    assert proc.returncode == 0, out
    assert sync_cb.start is not None and sync_cb.start.version == 0 and sync_cb.syncs == []
    assert max(abs(a - b) for a, b in zip(original, served[0])) < 1e-4
    first = rollout.batches[0]
    assert {t.policy_version for t in first.tasks} == {0}
    assert {r.policy_version for r in first.rollouts} == {0}, [r.error for r in first.rollouts]
    assert first.metrics["farm/staleness/max"] == 0
    assert int(sync_redis.get(settings.keys.policy_version())) == 0


@pytest.mark.slow
def test_farm_train_runs_from_a_yaml_file(settings, noop_worker, model_dir, tmp_path):
    """`farm train --config`: one step on noop rollouts."""
    from farm.cli import main

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(trainer_row(i, tokens=4, reward=float(i))) + "\n" for i in range(2)))
    config = tmp_path / "train.yaml"
    config.write_text(
        json.dumps(
            {
                "model_name": str(model_dir),
                "dataset_path": str(data),
                "output_dir": str(tmp_path / "out"),
                "max_steps": 1,
                "num_generations": 2,
                "per_device_train_batch_size": 4,
                "max_completion_length": 8,
                "rollout_timeout_s": 30,
                "weight_sync": "none",
                "torch_threads": 1,
                "save_steps": 1000,
                "farm": {"redis_url": settings.redis_url, "namespace": settings.namespace},
            }
        )
    )
    assert main(["train", "--config", str(config)]) == 0
    summary = json.loads((tmp_path / "out" / "farm_summary.json").read_text())
    assert summary["global_step"] == 1 and summary["policy_version"] == 1 and summary["unusable_batches"] == 0
    assert (tmp_path / "out" / "model.safetensors").is_file()
