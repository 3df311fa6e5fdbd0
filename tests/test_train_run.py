"""The training run a user starts: refused keys, pre-flight, steps that cannot train on nothing,
the start weights, clean stops. Real Redis, real `farm worker` processes of the noop agent and
real `farm train` processes; the policy server the trainer pushes weights to is `WeightsServer`
below, a recording HTTP server (the real vLLM's reload of the start weights is checked in
test_trainer.py, and `farm train --embedded` in test_train_run_vllm.py: minutes on this CPU, where
these take seconds).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import ROOT
from helpers.data import trainer_row
from helpers.processes import stop
from helpers.trainer import one_step_config, tiny_model
from helpers.waiting import wait_for
from helpers.workers import spawn_worker, worker_env

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


class WeightsServer:
    """Answers /health and records every POST /collective_rpc (a weight push); `dev` False answers 404
    there, as vLLM without VLLM_SERVER_DEV_MODE does."""

    def __init__(self, dev: bool = True):
        self.pushes: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                return None

            def _reply(self, code: int) -> None:
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def do_GET(self):
                if self.path == "/health":
                    return self._reply(200)
                self._reply(405 if self.path == "/collective_rpc" and dev else 404)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)) or 0)
                if self.path == "/collective_rpc" and dev:
                    outer.pushes.append(json.loads(body))
                    return self._reply(200)
                self._reply(200 if self.path == "/reset_prefix_cache" and dev else 404)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def small_model(model_dir, tmp_path_factory):
    """tiny_model saved as a directory with SmolLM2's tokenizer: `farm train` loads it in a second."""
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("tiny")
    tiny_model(model_dir).save_pretrained(path)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(path)
    return path


@pytest.fixture
def weights_server():
    server = WeightsServer()
    yield server
    server.close()


@pytest.fixture
def noop_worker(settings):
    proc = spawn_worker(settings, "--agent", "noop", "--concurrency", "1")
    wait_for(lambda: _live(settings), timeout=30, what="the noop worker's heartbeat")
    yield proc
    stop(proc, timeout=30)


def _live(settings) -> bool:
    import redis

    from farm.state import live_workers

    r = redis.Redis.from_url(settings.redis_url)
    try:
        return "noop" in live_workers(r, settings.keys).agents()
    finally:
        r.close()


def write_config(tmp_path: Path, settings, rows: list[dict], model, **overrides) -> Path:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {
        "model_name": str(model),
        "dataset_path": str(data),
        "output_dir": str(tmp_path / "out"),
        "max_steps": 2,
        "num_generations": 2,
        "per_device_train_batch_size": 4,
        "max_completion_length": 8,
        "rollout_timeout_s": 60,
        "save_steps": 1000,
        "torch_threads": 1,
        "worker_wait_s": 3,
        "run_id": "run1",
        **overrides,
        "farm": {"redis_url": settings.redis_url, "namespace": settings.namespace},
    }
    path = tmp_path / "train.yaml"
    path.write_text(json.dumps(config))
    return path


def farm_train(path: Path, settings, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in worker_env(settings).items() if k not in ("FARM_REDIS_URL", "FARM_NAMESPACE")}
    return subprocess.Popen(
        [sys.executable, "-m", "farm", "train", "--config", str(path), *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def farm_lines(err: str) -> list[str]:
    """The lines of stderr that are the command's own (logging goes there too, as JSON or `[...]`)."""
    return [line for line in err.splitlines() if line.startswith("farm:")]


# -- keys the farm replaces ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("key, value", [("use_vllm", True), ("vllm_mode", "colocate"), ("vllm_server_host", "0.0.0.0")])
def test_a_key_the_farm_replaces_exits_2_in_one_line_before_the_model_loads(tmp_path, settings, key, value):
    # model_name names no model: loading it would fail otherwise, and later, so the one line naming
    # the key says it came first (no wall-clock bound: a loaded machine's imports alone take 20-30 s).
    path = write_config(tmp_path, settings, [trainer_row(0)], "no/such-model", **{key: value})
    proc = farm_train(path, settings)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert err.strip().count("\n") == 0 and "Traceback" not in err, err
    assert key in err and "the farm samples" in err and "remove it" in err


def test_use_vllm_false_and_the_ignored_keys_are_accepted(tmp_path, caplog):
    from trainer.config import grpo_args, load_train_config

    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({"model_name": "m", "dataset_path": "d", "use_vllm": False, "top_k": 5}))
    cfg = load_train_config(path)
    assert "top_k" in caplog.text and "change nothing" in caplog.text
    assert grpo_args(cfg, output_dir=str(tmp_path), use_cpu=True).use_vllm is False


def test_farm_grpo_trainer_refuses_use_vllm(small_model, tmp_path):
    from trl import GRPOConfig

    from farm.errors import ConfigError
    from trainer.grpo import FarmGRPOTrainer

    args = GRPOConfig(output_dir=str(tmp_path), use_vllm=True, use_cpu=True, report_to="none")
    with pytest.raises(ConfigError, match="use_vllm"):
        FarmGRPOTrainer(model=str(small_model), reward_funcs=[lambda **_: [0.0]], args=args)


# -- pre-flight --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_agent_without_a_live_worker_exits_5_with_no_step_and_no_push(
    tmp_path, settings, noop_worker, weights_server, small_model, sync_redis
):
    rows = [trainer_row(0, tokens=4), {**trainer_row(1), "agent_ref": {"type": "x", "name": "mcqa"}}]
    path = write_config(tmp_path, settings, rows, small_model, sync_urls=[weights_server.url])
    proc = farm_train(path, settings)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 5, err
    # The pre-flight said it (after worker_wait_s = 3), not a rollout's 60 s timeout: no wall-clock
    # bound needed, which a loaded machine's torch import alone (20-30 s) could break.
    assert farm_lines(err) == [farm_lines(err)[0]] and "no live worker for agent mcqa (waited 3s" in err
    assert "Traceback" not in err
    assert weights_server.pushes == [] and not (tmp_path / "out").exists()
    assert sync_redis.get(settings.keys.policy_version()) is None


@pytest.mark.slow
def test_a_policy_server_that_cannot_take_weights_exits_2(tmp_path, settings, noop_worker, small_model):
    server = WeightsServer(dev=False)
    try:
        path = write_config(tmp_path, settings, [trainer_row(0, tokens=4)], small_model, sync_urls=[server.url])
        proc = farm_train(path, settings)
        out, err = proc.communicate(timeout=60)
    finally:
        server.close()
    assert proc.returncode == 2, err
    assert len(farm_lines(err)) == 1 and "VLLM_SERVER_DEV_MODE=1" in err and "Traceback" not in err
    assert server.pushes == [] and not (tmp_path / "out").exists()


# -- no step on nothing ----------------------------------------------------------------------------


def _build(settings, tmp_path, model_dir, rows, **overrides):
    from trainer.train import build_trainer
    from trainer.weights import NoSync

    cfg = one_step_config(tmp_path, model_dir, rows, **overrides)
    sync = NoSync()
    return build_trainer(settings, cfg, model=tiny_model(model_dir), weight_sync=sync)


@pytest.mark.slow
def test_a_batch_whose_rollouts_all_failed_is_never_trained_on(settings, noop_worker, model_dir, tmp_path):
    """Every rollout fails: the step's prompts go out again, twice, then the run stops; no optimizer
    step, no weight sync, the parameters as they were (before the fix, TRL stepped on the masked batch)."""
    from trainer.rollout import UnusableBatches

    rows = [trainer_row(0, fail="fatal"), trainer_row(1, fail="fatal")]
    trainer, rollout, sync_cb = _build(settings, tmp_path, model_dir, rows, max_unusable_batches=2)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    try:
        with pytest.raises(UnusableBatches, match="2 batches in a row"):
            trainer.train()
    finally:
        rollout.close()
    assert trainer.state.global_step == 0 and sync_cb.syncs == [] and rollout.version == 0
    assert all(torch.equal(before[n], p.detach()) for n, p in trainer.model.named_parameters())
    assert rollout.unusable_batches == 2 and len(rollout.batches) == 2
    assert all(b.metrics["farm/usable_groups"] == 0 for b in rollout.batches)


@pytest.mark.slow
def test_a_batch_under_the_floor_of_usable_groups_is_not_trained_on(settings, noop_worker, model_dir, tmp_path):
    from trainer.rollout import UnusableBatches

    rows = [trainer_row(0, tokens=3, reward=1.0), trainer_row(1, fail="fatal")]
    trainer, rollout, _ = _build(settings, tmp_path, model_dir, rows, min_usable_groups=2, max_unusable_batches=1)
    try:
        with pytest.raises(UnusableBatches, match="1 of 2 groups"):
            trainer.train()
    finally:
        rollout.close()
    assert trainer.state.global_step == 0


@pytest.mark.slow
def test_a_batch_at_the_floor_trains(settings, noop_worker, model_dir, tmp_path):
    rows = [trainer_row(0, tokens=3, reward=1.0), trainer_row(1, fail="fatal")]
    trainer, rollout, sync_cb = _build(settings, tmp_path, model_dir, rows, min_usable_groups=1)
    try:
        trainer.train()
    finally:
        rollout.close()
    assert trainer.state.global_step == 1 and rollout.unusable_batches == 0
    assert rollout.batches[-1].metrics["farm/usable_groups"] == 1


@pytest.mark.slow
def test_failures_from_an_agent_that_lost_its_workers_stop_at_once_with_exit_5(settings, model_dir, tmp_path):
    """No worker at all (no pre-flight here): the first all-deadline batch stops the run, no retry."""
    from trainer.rollout import NoLiveWorker

    rows = [trainer_row(0), trainer_row(1)]
    trainer, rollout, _ = _build(settings, tmp_path, model_dir, rows, rollout_timeout_s=1)
    try:
        with pytest.raises(NoLiveWorker, match="no live worker for agent noop") as exc:
            trainer.train()
    finally:
        rollout.close()
    assert exc.value.exit_code == 5 and len(rollout.batches) == 1 and trainer.state.global_step == 0


# -- the start weights ------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_start_weights_are_pushed_as_version_0_before_the_first_rollout(
    tmp_path, settings, noop_worker, weights_server, small_model, sync_redis
):
    """An earlier run left version 3 live: this run pushes its own weights, announces 0, and its first
    rollouts carry version 0 (before, they carried 3: staleness -3)."""
    from farm.policy_version import announce_live

    announce_live(sync_redis, settings.keys, 3)
    old = tmp_path / "out" / "policy" / "v3"  # an earlier run's weights in the same weights_dir
    old.mkdir(parents=True)
    rows = [trainer_row(i, tokens=4, reward=1.0) for i in range(2)]
    path = write_config(tmp_path, settings, rows, small_model, max_steps=1)
    path.write_text(path.read_text().replace('"run_id"', f'"sync_urls": ["{weights_server.url}"], "run_id"'))
    proc = farm_train(path, settings)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    paths = [p["kwargs"]["weights_path"] for p in weights_server.pushes]
    assert [Path(p).name for p in paths] == ["v0", "v1"]  # the start, then after step 1
    assert "policy v0 = the trainer's start weights, pushed to the servers" in err
    assert not old.exists() and sorted(p.name for p in (tmp_path / "out" / "policy").iterdir()) == ["v1"]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["policy_version"] == 1 and summary["global_step"] == 1
    assert "staleness 0.0 (max 0)" in err and "rollouts v0" in err
    # Where things are: the run id said at start, one metrics line per step (no TRL dict, no blank
    # line), the final weights named (the last sync's: no second copy, and no TRL checkpoint, which
    # save_steps 1000 does not ask for), and the run's result stream set to expire.
    final = tmp_path / "out" / "policy" / "v1"
    assert "run run1 (the run id of `farm status` and the dashboard): 1 steps" in err
    assert [line.split(":")[0] for line in out.splitlines()] == ["[train] step 1 of 1", '{"run_id"']
    assert summary["run_id"] == "run1" and summary["final_weights"] == str(final)
    assert f"run run1 done: 1 steps, policy v1; final weights at {final}" in err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["farm_summary.json", "policy"]
    assert 0 < sync_redis.ttl(settings.keys.results("run1")) <= 3600


# -- clean stops -----------------------------------------------------------------------------------


def _open_for(sync_redis, settings, run_id: str) -> int:
    """The run's tasks submitted and not yet settled (queued or running)."""
    return int(sync_redis.hget(settings.keys.open_runs(), run_id) or 0)


def _queued_for(sync_redis, settings, run_id: str) -> int:
    keys = [k for k in sync_redis.scan_iter(match=f"{settings.namespace}:queue:*") if k.decode().endswith(run_id)]
    return sum(sync_redis.llen(k) for k in keys)


def _nothing_left(sync_redis, settings, run_id: str) -> bool:
    return _open_for(sync_redis, settings, run_id) == 0 and _queued_for(sync_redis, settings, run_id) == 0


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_while_waiting_for_rollouts_cancels_the_run_and_says_where_in_one_line(
    tmp_path, settings, noop_worker, weights_server, small_model, sync_redis, sig, code
):
    """Four slow rollouts for a worker of one slot: one running, three queued when the signal comes."""
    rows = [trainer_row(i, tokens=4, sleep_s=60) for i in range(2)]
    path = write_config(tmp_path, settings, rows, small_model)
    path.write_text(path.read_text().replace('"run_id"', f'"sync_urls": ["{weights_server.url}"], "run_id"'))
    proc = farm_train(path, settings)
    try:
        wait_for(lambda: _open_for(sync_redis, settings, "run1") == 4, timeout=120, what="the step's 4 tasks")
        wait_for(lambda: _queued_for(sync_redis, settings, "run1") == 3, timeout=30, what="one running, 3 queued")
    except BaseException:
        proc.kill()
        raise
    started = time.monotonic()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert time.monotonic() - started < 20
    assert "Traceback" not in err and "destroyed but it is pending" not in err and "aclose()" not in err, err
    weights = tmp_path / "out" / "policy" / "v0"
    assert farm_lines(err) == [f"farm: interrupted at step 1 of 2; last weights at {weights}, policy version 0"]
    wait_for(lambda: _nothing_left(sync_redis, settings, "run1"), timeout=20, what="no task of the run left")
    assert not (tmp_path / "out" / "farm_summary.json").exists()


@pytest.mark.slow
def test_the_async_adapter_stops_with_nothing_of_its_run_left(settings, noop_worker, sync_redis):
    from trainer.async_adapter import FarmRolloutWorker

    rows = [trainer_row(0, tokens=4, sleep_s=60)]
    worker = FarmRolloutWorker(settings, rows, num_generations=2, max_groups_in_flight=2, run_id="async1")
    worker.start()
    try:
        wait_for(lambda: _open_for(sync_redis, settings, "async1") == 4, timeout=30, what="4 tasks submitted")
    finally:
        worker.stop()
    wait_for(lambda: _nothing_left(sync_redis, settings, "async1"), timeout=20, what="no task of the run left")
    metrics = {}
    while not worker.metrics_queue.empty():
        metrics.update(worker.metrics_queue.get())
    assert metrics["farm/cancelled_on_stop"] == 4


# -- the docs' own-script page --------------------------------------------------------------------


def _page_command(text: str, script: str) -> tuple[dict[str, str], list[str]]:
    """The page's bash command that runs `script`: (the variables it sets, its words after them)."""
    import re
    import shlex

    blocks = [b.replace("\\\n", " ") for b in re.findall(r"```bash\n(.*?)```", text, re.S)]
    (line,) = [ln for b in blocks for ln in b.splitlines() if script in ln]
    words = shlex.split(line)
    assigned = {}
    while words and "=" in words[0]:
        name, value = words.pop(0).split("=", 1)
        assigned[name] = value
    return assigned, words


def _rollout_versions(sync_redis, settings, agent: str) -> dict[int, int]:
    """How many scored rollouts of each policy version the agent's history counts (every run)."""
    from farm.history import run_versions

    counts: dict[int, int] = {}
    for key in sync_redis.scan_iter(match=f"{settings.namespace}:hist:{agent}:*"):
        bucket = {k.decode(): float(v) for k, v in sync_redis.hgetall(key).items()}
        for versions in run_versions(bucket).values():
            for version, stats in versions.items():
                counts[version] = counts.get(version, 0) + int(stats["n"])
    return counts


@pytest.mark.slow
def test_the_docs_script_runs_as_written(tmp_path, settings, noop_worker, weights_server, small_model, sync_redis):
    """docs/train-your-own-script.md's script and command, cut out verbatim: two GRPO steps on the noop
    agent, the start weights and each step's pushed to the (recording) policy server. The command sets
    FARM_POLICY_URLS alone, so the script's redis_url is None: the Redis is the embedded default
    (127.0.0.1:embedded_port, here the test's Redis), and the weight-sync callback must announce each
    version on it. An earlier run left version 3 live there: before the fix the callback, given no
    redis_url, announced nothing, and every rollout of the run said v3 (v0 after a `farm train`)."""
    import re
    from urllib.parse import urlsplit

    from farm.policy_version import announce_live

    url = urlsplit(settings.redis_url)
    if url.scheme != "redis" or url.hostname != "127.0.0.1" or url.path not in ("", "/0") or url.password:
        pytest.skip("the embedded default is redis://127.0.0.1:PORT/0, and the test's Redis is elsewhere")
    text = (ROOT / "docs" / "train-your-own-script.md").read_text()
    name, code = re.search(r"<!-- script-example: (\S+) -->\n```python\n(.*?)```", text, re.S).groups()
    assigned, words = _page_command(text, name)
    assert sorted(assigned) == ["FARM_POLICY_URLS"] and words[:2] == ["python", name]
    script = tmp_path / name
    script.write_text(code)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(trainer_row(i, tokens=4, reward=float(i))) + "\n" for i in range(2)))
    announce_live(sync_redis, settings.keys, 3)
    # The page's variables, with the test's policy server; the namespace and port say which Redis
    # "the embedded default" is here (no FARM_REDIS_URL, no FARM_CONFIG: redis_url stays None).
    env = {k: v for k, v in worker_env(settings).items() if k not in ("FARM_REDIS_URL", "FARM_CONFIG")}
    env.update(FARM_POLICY_URLS=weights_server.url, FARM_EMBEDDED_PORT=str(url.port or 6379))
    proc = subprocess.run(
        [sys.executable, str(script), str(small_model), str(rows), str(tmp_path / "out")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [Path(p["kwargs"]["weights_path"]).name for p in weights_server.pushes] == ["v0", "v1", "v2"]
    assert sorted(p.name for p in (tmp_path / "out" / "policy").iterdir()) == ["v2"]
    assert int(sync_redis.get(settings.keys.policy_version())) == 2
    # Step 1 samples from v0, step 2 from v1 (after the first sync): 4 rollouts each.
    wait_for(lambda: sum(_rollout_versions(sync_redis, settings, "noop").values()) >= 8, timeout=20, what="history")
    assert _rollout_versions(sync_redis, settings, "noop") == {0: 4, 1: 4}


@pytest.mark.slow
def test_a_stop_during_training_says_where_and_a_sync_in_progress_finishes_first(
    tmp_path, settings, noop_worker, small_model, monkeypatch
):
    """SIGINT at the end of step 1, while the weight sync of step 1 runs: the sync finishes (policy
    version 1), then the run stops before step 2 with its one line; exit code 130 from Interrupted."""
    from trainer import train as train_mod
    from trainer.config import load_train_config
    from trainer.stops import Interrupted
    from trainer.weights import NoSync

    class SignalledSync(NoSync):
        def sync(self, model, tokenizer, version):
            if version == 1:
                os.kill(os.getpid(), signal.SIGINT)  # held until the sync and its announcement are done
                time.sleep(0.2)
            return super().sync(model, tokenizer, version)

    built = train_mod.build_trainer
    monkeypatch.setattr(train_mod, "build_trainer", lambda s, c: built(s, c, weight_sync=SignalledSync()))
    rows = [trainer_row(i, tokens=4, reward=float(i)) for i in range(2)]
    cfg = load_train_config(write_config(tmp_path, settings, rows, small_model, weight_sync="none"))
    with pytest.raises(Interrupted) as exc:
        train_mod.run_train(settings, cfg)
    assert exc.value.exit_code == 130
    assert str(exc.value) == "interrupted at step 2 of 2; no weights saved (weight_sync: none), policy version 1"


def test_held_signals_deliver_the_signal_after_the_block(settings):
    from trainer.stops import StopRun, StopSignals, held_signals

    done = []
    with pytest.raises(StopRun) as exc, StopSignals():
        with held_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)
            done.append(True)  # not cut short
    assert done and exc.value.signum == signal.SIGTERM
