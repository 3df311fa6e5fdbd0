"""Where the weight-sync callback announces policy versions: the Redis and namespace of the rollout's
own client, whatever the script passes, or the run does not start (tests/test_train_run.py runs the
documented script against it end to end)."""

from __future__ import annotations

import socket
from types import SimpleNamespace
from urllib.parse import urlsplit

import pytest

from farm.errors import ConfigError, TransportError
from farm.policy_version import announce_live
from farm.settings import load_settings

pytest.importorskip("transformers")


def _callback(settings, **kwargs):
    from trainer.train import WeightSyncCallback
    from trainer.weights import NoSync

    rollout = SimpleNamespace(settings=settings, version=0)
    return WeightSyncCallback(rollout, NoSync(), 1, **kwargs)  # type: ignore[arg-type]


def test_the_callback_announces_on_the_rollouts_redis_and_namespace(settings, sync_redis):
    cb = _callback(settings)
    cb._announce(announce_live, 4, must=True)
    assert int(sync_redis.get(settings.keys.policy_version())) == 4


def test_with_no_redis_url_it_announces_on_the_embedded_default_as_the_client_does(settings, sync_redis):
    """redis_url unset: the embedded Redis on 127.0.0.1:embedded_port, as farm.connection resolves it
    for the rollout's client (before, the callback announced nothing at all)."""
    url = urlsplit(settings.redis_url)
    if url.scheme != "redis" or url.hostname != "127.0.0.1" or url.path not in ("", "/0") or url.password:
        pytest.skip("the test's Redis is not where an embedded one would be")
    embedded = load_settings(env={}, overrides={"namespace": settings.namespace, "embedded_port": url.port})
    assert embedded.redis_url is None
    _callback(embedded)._announce(announce_live, 2, must=True)
    assert int(sync_redis.get(settings.keys.policy_version())) == 2


def test_another_redis_or_namespace_than_the_rollouts_is_refused(settings):
    with pytest.raises(ConfigError, match="not the rollout's"):
        _callback(settings, redis_url="redis://elsewhere:6379/0")
    with pytest.raises(ConfigError, match="not the rollout's"):
        _callback(settings, namespace="other")
    _callback(settings, redis_url=settings.redis_url, namespace=settings.namespace)  # the same: fine


def test_version_0_that_cannot_be_announced_stops_the_run_in_one_line():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = load_settings(env={}, overrides={"embedded_port": port, "socket_timeout_s": 1.0})
    with pytest.raises(TransportError, match="could not announce policy version 0") as exc:
        _callback(settings)._announce(announce_live, 0, must=True)
    assert "\n" not in str(exc.value) and exc.value.exit_code == 3
