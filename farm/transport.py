"""The one boundary between the farm and redis-py: error mapping and the one retry layer.

redis-py raises a dozen exception types, some of them subclasses of others in surprising
ways (an AuthenticationError *is* a ConnectionError). Everything above this module sees only
the farm's own errors, mapped once here:

    redis-py                                      farm
    AuthenticationError, NOAUTH, WRONGPASS        RedisAuthError     at once, never retried
    NoPermissionError, NOPERM                     RedisAuthError     at once
    OOM command not allowed                       RedisOutOfMemory   at once
    WRONGTYPE                                     RedisWrongType     at once
    error inside a Lua script                     RedisScriptError   at once
    ConnectionError, TimeoutError, OSError,       retried by Outage, then RedisUnavailable
      BusyLoadingError, ReadOnlyError, TryAgain,
      READONLY inside a script (failover)

Retrying lives in exactly one place, `Outage`: jittered exponential backoff whose bound is
time (settings.redis_down_max_s, counted from the first failure of the outage and shared by
every caller in the process), not a count. The bound is for outages: a process whose Redis has
never answered (refused, unreachable, timed out before its first reply) is pointed at the wrong
place or started before Redis, and waiting two minutes would only hide that, so it gets
RedisUnavailable at once, with the `farm redis` hint. A Redis still loading its data answers
(BusyLoadingError) and is waited for. redis-py's own Retry is switched off in
farm.connection, so the bound is real: a process whose Redis is gone gives up within
redis_down_max_s plus one socket timeout at most, and says so at most once a second.

A process that stops (a worker told SIGTERM) calls `Outage.stop(deadline)`: from then on a failed
call is not retried (a backoff sleep in progress ends at once) and no attempt runs past the
deadline, so a stop is bounded by the stop's own clock, never by redis_down_max_s.

Messages name the Redis URL with its password replaced by `***`, and what to check.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from contextlib import contextmanager
from typing import Any, Awaitable, Callable, Iterator, Optional, TypeVar
from urllib.parse import urlsplit, urlunsplit

from redis import exceptions as rx

from farm.errors import (
    RedisAuthError,
    RedisOutOfMemory,
    RedisScriptError,
    RedisUnavailable,
    RedisWrongType,
    TransportError,
)

log = logging.getLogger("farm.transport")

T = TypeVar("T")

# Worth another try after a pause: the server is away, starting, read-only for a moment.
_TRANSIENT = (
    rx.ConnectionError,
    rx.TimeoutError,
    rx.BusyLoadingError,
    rx.ReadOnlyError,
    rx.TryAgainError,
    ConnectionError,
    TimeoutError,
    OSError,
)
_AUTH_MARKERS = ("NOAUTH", "WRONGPASS", "invalid password", "invalid username-password")


def backoff_delay(base_s: float, cap_s: float, failures: int) -> float:
    """Jittered exponential backoff: the delay before the next try after `failures` failed ones (from 0)."""
    return min(cap_s, base_s * 2 ** min(failures, 30)) * random.uniform(0.5, 1.0)


def redact(url: Optional[str]) -> str:
    """The URL with its password (if any) replaced by ***, for messages and logs."""
    if not url:
        return "<no redis_url>"
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable redis_url>"
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if not at or ":" not in userinfo:  # no password (a Sentinel URL's hosts are a list: kept as written)
        return url
    netloc = f"{userinfo.partition(':')[0]}:***@{hosts}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, (rx.AuthenticationError, rx.AuthenticationWrongNumberOfArgsError)):
        return False
    # READONLY inside a script (a demoted master after a failover) arrives as a script's ResponseError.
    return isinstance(exc, _TRANSIENT) or (isinstance(exc, rx.ResponseError) and "-READONLY " in str(exc))


def mapped(exc: BaseException, url: str) -> TransportError:
    """The farm's error for a redis-py (or socket) exception. `url` is already redacted."""
    text = str(exc)
    if isinstance(exc, (rx.AuthenticationError, rx.AuthenticationWrongNumberOfArgsError)) or (
        isinstance(exc, rx.ResponseError) and any(m in text for m in _AUTH_MARKERS)
    ):
        return RedisAuthError(
            f"Redis at {url} refused the credentials ({text}): check the password and user "
            "in redis_url (FARM_REDIS_URL or the settings file)"
        )
    if isinstance(exc, rx.NoPermissionError) or text.startswith("NOPERM"):
        return RedisAuthError(
            f"Redis at {url} denied a command ({text}): the ACL user needs the stream, "
            "hash, set, sorted set, string and scripting commands on the farm's keys"
        )
    if isinstance(exc, rx.OutOfMemoryError) or text.startswith("OOM"):
        return RedisOutOfMemory(
            f"Redis at {url} is out of memory ({text}): raise maxmemory, or consume "
            "results faster (result streams are trimmed as they are read)"
        )
    if text.startswith("WRONGTYPE") or "WRONGTYPE" in text:
        return RedisWrongType(
            f"Redis at {url}: a key the farm writes holds another type ({text}); "
            "is another application using the farm's namespace?"
        )
    scripted = "script" in text.lower() or "user_function" in text
    if isinstance(exc, rx.ResponseError) and scripted and not is_transient(exc):
        return RedisScriptError(f"Redis at {url}: a farm script failed ({text})")
    if is_transient(exc):
        return RedisUnavailable(
            f"cannot reach Redis at {url} ({type(exc).__name__}: {text}): is it running, "
            "and is redis_url right? (`farm redis` starts one)"
        )
    return TransportError(f"Redis at {url}: {type(exc).__name__}: {text}")


@contextmanager
def errors(url: Optional[str]) -> Iterator[None]:
    """Map anything redis-py raises inside the block (one-shot calls: the CLI, admin commands)."""
    try:
        yield
    except TransportError:
        raise
    except (rx.RedisError, OSError) as exc:
        raise mapped(exc, redact(url)) from exc


class Outage:
    """The process's one retry layer for Redis, shared by every loop that talks to it.

    `await outage.call(lambda: r.xadd(...), "submitting tasks")` runs the call; a transient
    error is retried with jittered exponential backoff until Redis answers again or the
    outage (counted from its first failure, whichever caller saw it) has lasted
    `give_up_s`, when RedisUnavailable is raised. Any other error is mapped and raised at once.
    Warnings are rate-limited to one a second, with the count of the ones held back.
    After `stop(deadline)` nothing is retried and no attempt outlives the deadline.
    """

    def __init__(self, url: Optional[str], base_s: float, cap_s: float, give_up_s: float, *, warn_every_s: float = 1.0):
        self.url = redact(url)
        self.base_s, self.cap_s, self.give_up_s, self.warn_every_s = base_s, cap_s, give_up_s, warn_every_s
        self.failures = 0
        self.since: Optional[float] = None
        # Whether Redis has answered this process at least once: until it has, a connection
        # failure is a wrong redis_url or a Redis never started, not an outage to wait out.
        self.reached = os.environ.get("FARM_REDIS_REACHED") == "1"  # set by a pool for a restarted child
        self._last_warning = float("-inf")
        self._held_back = 0
        self.deadline: Optional[float] = None  # set by stop(): the monotonic time no attempt may outlive
        self._sleepers: set[asyncio.Future] = set()  # backoff sleeps in progress, which stop() ends

    @classmethod
    def for_settings(cls, settings: Any) -> "Outage":
        return cls(
            settings.redis_url, settings.connect_backoff_s, settings.connect_backoff_max_s, settings.redis_down_max_s
        )

    def ok(self) -> None:
        if self.since is not None:
            log.info("Redis at %s answers again after %.1fs", self.url, time.monotonic() - self.since)
        self.failures, self.since, self._held_back = 0, None, 0

    def left_s(self) -> float:
        return self.give_up_s if self.since is None else self.give_up_s - (time.monotonic() - self.since)

    def stop(self, deadline: float) -> None:
        """The process is stopping: retry nothing from now on, end every backoff sleep at once, and let
        no attempt run past `deadline` (time.monotonic()); an earlier deadline replaces a later one."""
        self.deadline = deadline if self.deadline is None else min(self.deadline, deadline)
        for sleeper in self._sleepers:
            if not sleeper.done():
                sleeper.set_result(None)

    def _attempt_s(self) -> Optional[float]:
        """How long the next attempt may take: unbounded (the socket timeout) while all is well; during an
        outage, what is left of redis_down_max_s; once stopping, what is left before the deadline."""
        bounds = [self.left_s()] if self.since is not None else []
        if self.deadline is not None:
            bounds.append(self.deadline - time.monotonic())
        return max(0.05, min(bounds)) if bounds else None

    async def call(self, fn: Callable[[], Awaitable[T]], what: str) -> T:
        while True:
            try:
                timeout = self._attempt_s()
                result = await (fn() if timeout is None else asyncio.wait_for(fn(), timeout=timeout))
            except asyncio.TimeoutError as exc:
                await self.wait(exc, what)
                continue
            except TransportError:
                raise
            except (rx.RedisError, OSError) as exc:
                if not is_transient(exc):
                    raise mapped(exc, self.url) from exc
                await self.wait(exc, what)
                continue
            self.reached = True
            if self.since is not None:
                self.ok()
            return result

    async def once(self, fn: Callable[[], Awaitable[T]], what: str) -> T:
        """One attempt, errors mapped: for shutdown steps, which must not wait out an outage."""
        with errors(self.url):
            result = await fn()
        self.reached = True
        return result

    async def wait(self, exc: BaseException, what: str) -> None:
        """Sleep before the next attempt, or raise RedisUnavailable once the outage has lasted too long."""
        reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if isinstance(exc, (rx.BusyLoadingError, rx.ReadOnlyError, rx.TryAgainError)):
            self.reached = True  # Redis answered, it is only not ready yet
        if not self.reached:
            raise RedisUnavailable(
                f"Redis at {self.url} unreachable while {what} ({reason}), and it has not answered since "
                "this process started: is it running, and is redis_url right? (`farm redis` starts one)"
            ) from exc
        if self.deadline is not None:
            raise RedisUnavailable(
                f"Redis at {self.url}: {what} failed ({reason}); not retried: the process is stopping"
            ) from exc
        now = time.monotonic()
        if self.since is None:
            self.since = now
        elapsed = now - self.since
        if elapsed >= self.give_up_s:
            raise RedisUnavailable(
                f"Redis at {self.url} unreachable for {elapsed:.0f}s "
                f"(redis_down_max_s={self.give_up_s:g}) while {what}: {reason}"
            ) from exc
        delay = min(backoff_delay(self.base_s, self.cap_s, self.failures), self.give_up_s - elapsed)
        self.failures += 1
        if now - self._last_warning >= self.warn_every_s:
            more = f" (+{self._held_back} more failures)" if self._held_back else ""
            log.warning(
                "Redis at %s: %s failed (%s)%s; retrying for up to %.0fs more",
                self.url,
                what,
                reason,
                more,
                self.give_up_s - elapsed,
            )
            self._last_warning, self._held_back = now, 0
        else:
            self._held_back += 1
        await self._sleep(delay)
        if self.deadline is not None:  # stop() ended the sleep: no further attempt
            raise RedisUnavailable(
                f"Redis at {self.url}: {what} failed ({reason}); not retried: the process is stopping"
            ) from exc

    async def _sleep(self, delay: float) -> None:
        """asyncio.sleep(delay), ended early by stop(). A future of the running loop, not an Event, so
        one Outage may serve several event loops one after another (a sync client's asyncio.run calls)."""
        sleeper = asyncio.get_running_loop().create_future()
        self._sleepers.add(sleeper)
        try:
            await asyncio.wait([sleeper], timeout=delay)
        finally:
            self._sleepers.discard(sleeper)
