"""Redis connections: one place that turns Settings into a client.

redis-py's own Retry is switched off (zero retries): retrying is farm.transport.Outage's job
alone, with a time bound, so two retry layers never multiply into minutes of attempts.
`redis://`, `rediss://` (TLS; `?ssl_cert_reqs=none` and friends are honoured by redis-py) and
passwords / ACL users in the URL (`redis://user:password@host:6379/0`) all work; a URL without a
password takes $FARM_REDIS_PASSWORD, so the secret need not sit in the URL at all.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import redis
import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.retry import Retry

from farm.errors import RedisUnavailable
from farm.settings import Settings, read_password
from farm.transport import redact


def _url(settings: Settings) -> str:
    """The configured redis_url; with none, the embedded Redis on 127.0.0.1:embedded_port (where
    `farm redis` and the commands' --embedded put it), as the command line finds it."""
    return settings.redis_url or f"redis://127.0.0.1:{settings.embedded_port}/0"


def _options(settings: Settings) -> dict:
    extra = {}
    password = read_password(None) if urlsplit(_url(settings)).password is None else None
    if password:
        extra["password"] = password  # FARM_REDIS_PASSWORD, for URLs that carry none
    return dict(
        **extra,
        socket_timeout=settings.socket_timeout_s,
        socket_connect_timeout=min(settings.socket_timeout_s, 10.0),
        health_check_interval=30,
        decode_responses=False,
        retry=Retry(NoBackoff(), 0),
    )


def connect(settings: Settings) -> aioredis.Redis:
    """An asyncio client for workers and consumers."""
    return aioredis.Redis.from_url(_url(settings), **_options(settings))


def connect_sync(settings: Settings) -> redis.Redis:
    """A blocking client for the CLI (status, admin)."""
    return redis.Redis.from_url(_url(settings), **_options(settings))


def answers(settings: Settings, timeout_s: float = 1.0) -> bool:
    """Whether Redis answers a PING now (one try, short timeouts): a supervisor's outage probe.

    With no redis_url, the embedded Redis on 127.0.0.1:embedded_port. A refusal (wrong password,
    denied command) is an answer: Redis is there, and the caller's own clients will say what is wrong.
    """
    url = settings.redis_url or f"redis://127.0.0.1:{settings.embedded_port}/0"
    options = {**_options(settings.replace(redis_url=url)), "socket_timeout": timeout_s}
    options["socket_connect_timeout"] = timeout_s
    client = redis.Redis.from_url(url, **options)
    try:
        client.ping()
        return True
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        return isinstance(exc, redis.AuthenticationError)
    except redis.RedisError:
        return True
    finally:
        client.close()


def reached(settings: Settings, timeout_s: float = 3.0) -> None:
    """Raise RedisUnavailable at once, with the `farm redis` hint, when Redis does not answer now: for a
    command that would otherwise print its start-up lines first and fail on its first Redis call."""
    if not answers(settings, timeout_s):
        raise RedisUnavailable(
            f"Redis at {redact(_url(settings))} unreachable, and it has not answered since this process "
            "started: is it running, and is redis_url right? (`farm redis` starts one)"
        )
