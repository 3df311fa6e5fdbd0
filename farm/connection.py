"""Redis connections: one place that turns Settings into a client.

redis-py's own Retry is switched off (zero retries): retrying is farm.transport.Outage's job
alone, with a time bound, so two retry layers never multiply into minutes of attempts.
`redis://`, `rediss://` (TLS; `?ssl_cert_reqs=none` and friends are honoured by redis-py) and
passwords / ACL users in the URL (`redis://user:password@host:6379/0`) all work; a URL without a
password takes $FARM_REDIS_PASSWORD, so the secret need not sit in the URL at all.

`redis+sentinel://host:port[,host:port...]/SERVICE[/DB]` asks those Sentinels which server is the
master of SERVICE and connects there (redis-py's Sentinel, `master_for`); the password (URL
userinfo or $FARM_REDIS_PASSWORD) is the master's, the Sentinels are asked without one. After a
failover the old master's connections fail (a refused connection, or READONLY once it is
demoted, which redis-py turns into a ConnectionError and a new look-up): the Outage retries the
call, and the pool's next connection goes to the master the Sentinels name then (docs/failover.md).

`Durability` is the WAIT that makes an acknowledgement survive a failover: queued at the end of
a pipeline of writes (a submit's chunk, a settler's batch), it holds the reply until
redis_wait_replicas replicas have the writes, one round trip per batch. WAIT counts the writes of
its own connection, so it belongs to the client: `connect` returns one that carries the
Durability its settings ask for (`durability_of(r)`), and whatever pipelines writes on it queues
that WAIT with them.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional, Union, cast
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as aiosentinel
import redis.sentinel
from redis.backoff import NoBackoff
from redis.retry import Retry

from farm.errors import ConfigError, RedisUnavailable
from farm.settings import Settings, read_password
from farm.transport import redact

log = logging.getLogger("farm.connection")

SENTINEL_SCHEME = "redis+sentinel"


@dataclass(frozen=True)
class SentinelURL:
    """A parsed `redis+sentinel://[user:password@]host:port[,host:port...]/SERVICE[/DB]`."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: Optional[str] = None
    password: Optional[str] = None


def is_sentinel(url: Optional[str]) -> bool:
    return bool(url) and str(url).lower().startswith(SENTINEL_SCHEME + "://")


def parse_sentinel(url: str) -> SentinelURL:
    """The Sentinels, service and db of a Sentinel URL; ConfigError (one line, password hidden) when malformed."""
    shown = redact(url)
    if not is_sentinel(url):
        raise ConfigError(f"redis_url {shown} is not a {SENTINEL_SCHEME}:// URL")
    rest = url[len(SENTINEL_SCHEME) + 3 :]
    netloc, _, path = rest.partition("/")
    path = path.split("?", 1)[0].split("#", 1)[0]
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    sentinels = []
    for item in hosts.split(","):
        host, colon, port = item.strip().rpartition(":")
        host = host.strip("[]")
        if not colon or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ConfigError(
                f"redis_url {shown}: {item.strip() or 'an empty entry'!r} is not host:port "
                f"(a Sentinel URL is {SENTINEL_SCHEME}://host:port[,host:port...]/SERVICE[/DB])"
            )
        sentinels.append((host, int(port)))
    parts = [p for p in path.split("/") if p]
    if len(parts) > 2:
        raise ConfigError(
            f"redis_url {shown}: {'/'.join(parts[2:])!r} after /SERVICE/DB: a Sentinel URL is "
            f"{SENTINEL_SCHEME}://host:port[,host:port...]/SERVICE[/DB]"
        )
    if not parts:
        raise ConfigError(
            f"redis_url {shown} names no service: a Sentinel URL is "
            f"{SENTINEL_SCHEME}://host:port[,host:port...]/SERVICE[/DB] (SERVICE: the master name Sentinel monitors)"
        )
    db = 0
    if len(parts) == 2:
        if not parts[1].isdigit():
            raise ConfigError(f"redis_url {shown}: the database {parts[1]!r} is not a number")
        db = int(parts[1])
    return SentinelURL(tuple(sentinels), unquote(parts[0]), db, username, password)


def _no_master(service: str, sentinels: Any) -> str:
    where = ",".join(f"{host}:{port}" for host, port in sentinels)
    return (
        f"no Sentinel at {where} names a master for {service!r} now (Sentinels unreachable, "
        "a wrong SERVICE name, or a failover in progress)"
    )


class _Sentinel(redis.sentinel.Sentinel):
    """redis-py's Sentinel, whose MasterNotFoundError names the Sentinels (not their clients' reprs)."""

    def __init__(self, sentinels: Any, **kwargs: Any):
        super().__init__(sentinels, **kwargs)
        self.addresses = tuple(sentinels)

    def discover_master(self, service_name: str) -> Any:
        try:
            return super().discover_master(service_name)
        except redis.sentinel.MasterNotFoundError:
            raise redis.sentinel.MasterNotFoundError(_no_master(service_name, self.addresses)) from None


class _AsyncSentinel(aiosentinel.Sentinel):
    """The asyncio Sentinel, with the same MasterNotFoundError as _Sentinel."""

    def __init__(self, sentinels: Any, **kwargs: Any):
        super().__init__(sentinels, **kwargs)
        self.addresses = tuple(sentinels)

    async def discover_master(self, service_name: str) -> Any:
        try:
            return await super().discover_master(service_name)
        except aiosentinel.MasterNotFoundError:
            raise aiosentinel.MasterNotFoundError(_no_master(service_name, self.addresses)) from None


def _url(settings: Settings) -> str:
    """The configured redis_url; with none, the embedded Redis on 127.0.0.1:embedded_port (where
    `farm redis` and the commands' --embedded put it), as the command line finds it."""
    return settings.redis_url or f"redis://127.0.0.1:{settings.embedded_port}/0"


def _password_in(url: str) -> Optional[str]:
    if is_sentinel(url):
        return parse_sentinel(url).password
    return urlsplit(url).password


def _options(settings: Settings) -> dict:
    extra = {}
    password = read_password(None) if _password_in(_url(settings)) is None else None
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


def _sentinel_args(url: str, options: dict) -> tuple[SentinelURL, dict, dict]:
    """The parsed URL, the master's connection options and the Sentinels' own (no password, no retries)."""
    parsed = parse_sentinel(url)
    master = {**options, "db": parsed.db}
    if parsed.username:
        master["username"] = parsed.username
    if parsed.password is not None:
        master["password"] = parsed.password
    asked = {k: options[k] for k in ("socket_timeout", "socket_connect_timeout")}
    return parsed, master, {**asked, "retry": Retry(NoBackoff(), 0)}


class DurableRedis(aioredis.Redis):
    """redis-py's asyncio client, carrying the Durability (WAIT) its settings ask of acknowledgements."""

    durability: "Durability"

    async def aclose(self, close_connection_pool: Optional[bool] = None) -> None:
        """Close the client, and with a Sentinel-backed one the connections to the Sentinels too."""
        await super().aclose(close_connection_pool)
        for sentinel in getattr(getattr(self.connection_pool, "sentinel_manager", None), "sentinels", ()):
            await sentinel.aclose()


def durability_of(r: Any) -> "Durability":
    """The Durability a client from `connect` carries; none (no WAIT) for any other client."""
    return getattr(r, "durability", None) or Durability(0, 0)


def connect(settings: Settings) -> aioredis.Redis:
    """An asyncio client for workers and consumers."""
    url = _url(settings)
    client: DurableRedis
    if is_sentinel(url):
        parsed, master, asked = _sentinel_args(url, _options(settings))
        sentinel = _AsyncSentinel(parsed.sentinels, sentinel_kwargs=asked, **master)
        client = cast(DurableRedis, sentinel.master_for(parsed.service, redis_class=DurableRedis))
    else:
        client = cast(DurableRedis, DurableRedis.from_url(url, **_options(settings)))
    client.durability = Durability.of(settings)
    return client


def connect_sync(settings: Settings) -> redis.Redis:
    """A blocking client for the CLI (status, admin)."""
    url = _url(settings)
    if is_sentinel(url):
        parsed, master, asked = _sentinel_args(url, _options(settings))
        sentinel = _Sentinel(parsed.sentinels, sentinel_kwargs=asked, **master)
        return sentinel.master_for(parsed.service)
    return redis.Redis.from_url(url, **_options(settings))


def answers(settings: Settings, timeout_s: float = 1.0) -> bool:
    """Whether Redis answers a PING now (one try, short timeouts): a supervisor's outage probe.

    With no redis_url, the embedded Redis on 127.0.0.1:embedded_port; with a Sentinel URL, the
    master the Sentinels name now (none named: no answer). A refusal (wrong password, denied
    command) is an answer: Redis is there, and the caller's own clients will say what is wrong.
    """
    url = _url(settings)
    options = {**_options(settings.replace(redis_url=url)), "socket_timeout": timeout_s}
    options["socket_connect_timeout"] = timeout_s
    client: redis.Redis
    if is_sentinel(url):
        parsed, master, asked = _sentinel_args(url, options)
        client = _Sentinel(parsed.sentinels, sentinel_kwargs=asked, **master).master_for(parsed.service)
    else:
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
        for sentinel in getattr(getattr(client.connection_pool, "sentinel_manager", None), "sentinels", ()):
            sentinel.close()


def reached(settings: Settings, timeout_s: float = 3.0) -> None:
    """Raise RedisUnavailable at once, with the `farm redis` hint, when Redis does not answer now: for a
    command that would otherwise print its start-up lines first and fail on its first Redis call."""
    if not answers(settings, timeout_s):
        raise RedisUnavailable(
            f"Redis at {redact(_url(settings))} unreachable, and it has not answered since this process "
            "started: is it running, and is redis_url right? (`farm redis` starts one)"
        )


Pipe = Union[redis.client.Pipeline, aioredis.client.Pipeline]


class Durability:
    """The WAIT that holds an acknowledgement until `replicas` replicas have its writes (0: none).

    Replication is asynchronous: a master that dies may take its last writes with it, and the
    replica Sentinel promotes never had them. `queue(pipe)` adds `WAIT replicas timeout_ms` as the
    pipeline's last command, on the same connection as its writes (WAIT counts the writes of its
    own connection), so a batch pays one round trip more at most, and no round trip at all when
    the replicas are quick. `check(reply, what)` takes WAIT's answer (the replicas that have the
    writes): fewer than asked is counted (`short`) and logged once per kind of batch, and the
    batch is acknowledged all the same. WAIT does not roll the writes back, so failing the batch
    would only make the caller write it again; what a short WAIT means is written in
    docs/failover.md.
    """

    def __init__(self, replicas: int, timeout_ms: int):
        self.replicas, self.timeout_ms = replicas, timeout_ms
        self.short: Counter = Counter()

    @classmethod
    def of(cls, settings: Settings) -> "Durability":
        return cls(settings.redis_wait_replicas, settings.redis_wait_timeout_ms)

    def __bool__(self) -> bool:
        return self.replicas > 0

    def queue(self, pipe: Any) -> None:
        if self.replicas > 0:
            pipe.execute_command("WAIT", self.replicas, self.timeout_ms)

    def check(self, reply: Any, what: str) -> bool:
        """Whether WAIT's reply says enough replicas have the batch; counts and logs (once per `what`) when not."""
        if self.replicas <= 0:
            return True
        if isinstance(reply, int) and reply >= self.replicas:
            return True
        if not self.short[what]:
            log.warning(
                "%s: %s of redis_wait_replicas=%d replicas acknowledged within %d ms; acknowledged anyway, "
                "and a failover now may lose it (counted; logged once)",
                what,
                reply if isinstance(reply, int) else f"none ({reply})",
                self.replicas,
                self.timeout_ms,
            )
        self.short[what] += 1
        return False
