"""The public face: `from farm import ...` names what a training script or collection job needs,
every public module says what it exports, and `async with FarmClient()` works from settings alone."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import farm

PUBLIC_MODULES = [
    "farm.client",
    "farm.schema",
    "farm.settings",
    "farm.errors",
    "envs.sdk",
    "envs.sdk.environment",
    "trainer.config",
    "trainer.rollout",
    "trainer.train",
    "trainer.weights",
    "trainer.preflight",
    "trainer.stops",
]


def test_the_package_exports_the_client_the_schema_the_settings_and_the_errors():
    from farm import ConfigError, FarmClient, FarmError, Rollout, RolloutFailure, Task, load_settings

    assert FarmClient.__module__ == "farm.client" and Task.__module__ == "farm.schema"
    assert issubclass(ConfigError, FarmError) and issubclass(RolloutFailure, FarmError)
    assert callable(load_settings) and Rollout.__name__ == "Rollout"
    for name in farm.__all__:
        assert getattr(farm, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        farm.nothing  # noqa: B018


@pytest.mark.slow
def test_the_trainer_exports_its_pieces_without_loading_torch():
    code = (
        "import sys, trainer; assert 'torch' not in sys.modules and 'trl' not in sys.modules; "
        "from trainer import FarmRollout, TrainConfig, build_trainer, env_reward, WeightSyncCallback; "
        "print(FarmRollout.__module__, TrainConfig.__module__, build_trainer.__module__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["trainer.rollout", "trainer.config", "trainer.train"]


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_every_public_module_lists_what_it_exports(module):
    mod = importlib.import_module(module)
    assert isinstance(mod.__all__, list) and mod.__all__, module
    missing = [name for name in mod.__all__ if not hasattr(mod, name)]
    assert not missing, f"{module}.__all__ names what it does not define: {missing}"


async def test_a_client_from_settings_alone_as_a_context_manager(redis_url, namespace, monkeypatch):
    from farm import FarmClient

    monkeypatch.setenv("FARM_REDIS_URL", redis_url)
    monkeypatch.setenv("FARM_NAMESPACE", namespace)
    monkeypatch.delenv("FARM_CONFIG", raising=False)
    closed = []
    async with FarmClient() as client:
        assert client.settings.namespace == namespace
        task = client.task(run_id="api", agent="noop", row={"x": 1})
        assert await client.submit([task]) == [task.task_id]
        aclose = client.aclose

        async def counted() -> None:
            closed.append(True)
            await aclose()

        client.aclose = counted  # type: ignore[method-assign]
    assert closed == [True]  # the block closed the client


def test_without_a_redis_url_the_client_uses_the_embedded_redis_as_the_cli_does(monkeypatch):
    from farm import FarmClient, load_settings

    settings = load_settings(env={}, overrides={"embedded_port": 6391})
    assert settings.redis_url is None
    client = FarmClient(settings)  # no connection is made until the first command
    kwargs = client.r.connection_pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"]) == ("127.0.0.1", 6391)
