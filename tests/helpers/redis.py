"""The test Redis: settings with short timeouts, a namespace's keys deleted, the settle scripts by hand.

Every test runs in a namespace of its own (conftest's `namespace` fixture), so tests never see
each other's streams.
"""

from __future__ import annotations

import redis

from farm.settings import Settings, load_settings

# Timeouts short enough that reclaims, retries and drains happen within a test's seconds.
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


def answers(url: str) -> bool:
    """Whether a Redis answers PING at `url` within a second."""
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


def make_settings(url: str, namespace: str, **overrides) -> Settings:
    return load_settings(env={}, overrides={"redis_url": url, "namespace": namespace, **FAST, **overrides})


def cleanup(url: str, namespace: str) -> None:
    r = redis.Redis.from_url(url)
    keys = list(r.scan_iter(match=f"{namespace}:*", count=1000))
    if keys:
        r.delete(*keys)


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
