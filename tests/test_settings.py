"""Settings: precedence of file, environment and overrides, and clear errors (pure unit tests)."""

import pytest

from farm.errors import ConfigError
from farm.keys import Keys
from farm.settings import load_settings


def test_defaults_are_valid_and_embedded():
    s = load_settings(env={})
    assert s.redis_url is None and s.namespace == "farm" and s.max_attempts == 3


def test_file_then_env_then_overrides(tmp_path):
    cfg = tmp_path / "farm.yaml"
    cfg.write_text("farm:\n  namespace: fromfile\n  max_attempts: 5\n  concurrency: 8\n")
    s = load_settings(
        cfg,
        env={"FARM_MAX_ATTEMPTS": "7", "FARM_REDIS_URL": "rediss://u:p@host:6380/1"},
        overrides={"concurrency": 16, "block_ms": None},
    )
    assert (s.namespace, s.max_attempts, s.concurrency) == ("fromfile", 7, 16)
    assert s.redis_url == "rediss://u:p@host:6380/1"
    assert s.block_ms == 500


def test_config_path_from_env(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("namespace: viaenv\n")
    assert load_settings(env={"FARM_CONFIG": str(cfg)}).namespace == "viaenv"


@pytest.mark.parametrize(
    "env, match",
    [
        ({"FARM_MAX_ATTEMPTS": "three"}, "FARM_MAX_ATTEMPTS"),
        ({"FARM_MAX_ATTEMPTS": "0"}, "max_attempts must be > 0"),
        ({"FARM_REDIS_URL": "http://localhost"}, "redis://"),
        ({"FARM_NAMESPACE": "bad name"}, "namespace"),
        ({"FARM_LOG_FORMAT": "xml"}, "log_format"),
        ({"FARM_LEASE_RENEW_S": "100"}, "lease_renew_s"),
    ],
)
def test_bad_values_name_their_source(env, match):
    with pytest.raises(ConfigError, match=match):
        load_settings(env=env)


def test_unknown_key_and_bad_file(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max_atempts: 3\n")
    with pytest.raises(ConfigError, match="unknown setting.*max_atempts"):
        load_settings(cfg, env={})
    cfg.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_settings(cfg, env={})
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "missing.yaml", env={})


def test_keys_are_namespaced_and_checked():
    k = Keys("ns1")
    assert k.tasks("math") == "ns1:tasks:math"
    assert k.results("run-1") == "ns1:results:run-1"
    assert k.dead("math") == "ns1:dead:math"
    with pytest.raises(ValueError):
        k.tasks("has:colon")
    with pytest.raises(ValueError):
        Keys("")


def test_routing_settings_from_the_environment_and_their_errors():
    s = load_settings(env={"FARM_POLICY_ROUTE_HEADERS": "X-SMG-Routing-Key=group, x-session-id=session"})
    assert s.policy_routing == "group" and s.policy_spill_ratio == 1.5
    assert s.policy_route_headers == {"X-SMG-Routing-Key": "group", "x-session-id": "session"}
    with pytest.raises(ConfigError, match="FARM_POLICY_ROUTE_HEADERS: 'nope' is not NAME=VALUE"):
        load_settings(env={"FARM_POLICY_ROUTE_HEADERS": "nope"})
    with pytest.raises(ConfigError, match="not an HTTP header name"):
        load_settings(env={"FARM_POLICY_ROUTE_HEADERS": "a b=group"})
    with pytest.raises(ConfigError, match="policy_routing"):
        load_settings(env={"FARM_POLICY_ROUTING": "round_robin"})
    with pytest.raises(ConfigError, match="policy_spill_ratio must be >= 1"):
        load_settings(env={"FARM_POLICY_SPILL_RATIO": "0.5"})
