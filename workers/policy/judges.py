"""The judge pool: the model endpoints verifiers grade with (`ctx.judge`), one pool per worker process.

Each judge (`judges:` in the settings, farm.settings.JudgeConfig) is the openai backend
(workers/policy/openai_pool.py: its own rotation over the judge's own URLs, the client's retries,
errors mapped once, the API key scrubbed) with three things around it:

  limit      one asyncio.Semaphore per judge per process: every rollout of the process waits for
             one of `max_concurrency` slots, so a judge sees at most that many requests from it;
  deadline   `deadline_s` bounds one call, slot wait included; past it the call is cancelled and
             the rollout fails as `verifier` (JudgeFailure), never scored 0;
  cache      identical requests (judge, model, messages, sampling) are asked once: the first one
             asks, the others in flight await it, later ones read its answer (the last CACHE_SIZE
             answers are kept). The G samples of a GRPO group often give the same answer, so
             their grades cost one call. A call every awaiting rollout gave up on (cancelled,
             timed out) is cancelled, and its slot freed.

A judge's failure (past its deadline, refused, an HTTP error after the client's retries, a
reply without text) is JudgeFailure with the judge's name and the reason. The pool counts
calls, answers, failures, cache hits and latency per judge and adds them to Redis every
EXPORT_S (farm/judge_stats.py), where `farm status`, the dashboard and `/metrics` read them.

The pool belongs to the event loop it was made in (its clients and semaphores do);
`process_pool()` makes a new one, with the same judges, for another loop (tests run several).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Optional

from envs.sdk.judge import JudgeFailure, JudgeReply
from farm import judge_stats
from farm.errors import ConfigError, RolloutFailure
from farm.settings import JudgeConfig, Settings, read_secret
from workers.policy.config import PolicyConfig
from workers.policy.openai_convo import ChatConversation
from workers.policy.openai_pool import OpenAIPolicy
from workers.policy.rotation import Session

log = logging.getLogger("farm.judges")

CACHE_SIZE = 4096  # answers kept per process
EXPORT_S = 2.0


@dataclass
class JudgeStats:
    """One judge's counts in this process; `pending` holds what was not yet added to Redis."""

    calls: int = 0
    ok: int = 0
    failed: int = 0
    deadline: int = 0
    cache_hits: int = 0
    latency_s: float = 0.0  # the sum over answered requests
    in_flight: int = 0
    waiting: int = 0
    max_in_flight: int = 0
    pending: dict[str, float] = field(default_factory=dict)

    def add(self, **counts: float) -> None:
        for name, n in counts.items():
            setattr(self, name, getattr(self, name) + n)
            self.pending[name] = self.pending.get(name, 0) + n

    def answered(self, latency_s: float) -> None:
        self.add(ok=1, latency_s=latency_s)
        b = f"b{judge_stats.bucket(latency_s)}"
        self.pending[b] = self.pending.get(b, 0) + 1


def api_key(name: str, where: Optional[str]) -> Optional[str]:
    """The key `api_key` points at: a file (its first line) or an environment variable."""
    if where is None:
        return None
    if os.path.isfile(os.path.expanduser(where)):
        return read_secret(where, f"judge {name} API key")
    if where in os.environ and os.environ[where]:
        return os.environ[where]
    raise ConfigError(f"judge {name}: api_key {where!r} is neither a readable file nor a set environment variable")


class Judge:
    """One judge: its openai client over its own URLs, its slots and its counts."""

    def __init__(self, name: str, config: JudgeConfig):
        self.name = name
        self.config = config
        policy_config = PolicyConfig(
            urls=list(config.urls),
            model=config.model,
            timeout_s=config.deadline_s,
            max_connections=config.max_concurrency,
            routing="least_outstanding",
            api_key=api_key(name, config.api_key),
            max_retries=config.max_retries,
        )
        self.client = OpenAIPolicy(policy_config, "chat")
        self.slots = asyncio.Semaphore(config.max_concurrency)
        self.stats = JudgeStats()

    async def call(self, messages: list[dict], sampling: dict[str, Any]) -> tuple[str, float]:
        """The judge's text and the request's latency, within the deadline (slot wait included)."""
        stats, session = self.stats, Session()
        try:
            async with asyncio.timeout(self.config.deadline_s):
                stats.waiting += 1
                try:
                    await self.slots.acquire()
                finally:
                    stats.waiting -= 1
                try:
                    stats.in_flight += 1
                    stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
                    start = time.perf_counter()
                    convo = ChatConversation(messages, [])
                    turn = await self.client.turn(convo, {**self.config.sampling, **sampling}, session, 0)
                    latency = time.perf_counter() - start
                finally:
                    stats.in_flight -= 1
                    self.slots.release()
        except TimeoutError:
            stats.add(failed=1, deadline=1)
            raise JudgeFailure(self.name, f"no answer within its deadline of {self.config.deadline_s:g}s") from None
        except RolloutFailure as exc:
            stats.add(failed=1)
            raise JudgeFailure(self.name, exc.message.replace("the policy", "the judge")) from None
        except Exception as exc:  # noqa: BLE001 - e.g. a body that is not JSON, which the client does not map
            stats.add(failed=1)
            where = session.replica.url if session.replica is not None else self.config.urls[0]
            message = f"the judge at {where}/v1 sent an answer the client cannot read: {type(exc).__name__}: {exc}"
            raise JudgeFailure(self.name, self.client.scrub(message)) from None
        if not turn.text.strip():
            stats.add(failed=1)
            raise JudgeFailure(self.name, f"the judge at {self.config.urls[0]} answered without text")
        stats.answered(latency)
        return turn.text, latency

    async def aclose(self) -> None:
        await self.client.aclose()


class JudgePool:
    """The judges of one process (one event loop): `ask` is what `ctx.judge` calls."""

    def __init__(self, configs: Optional[dict[str, JudgeConfig]] = None, settings: Optional[Settings] = None):
        self.configs = dict(configs or {})
        self.settings = settings  # for the export to Redis; None: counted here only
        self.judges: dict[str, Judge] = {}
        self.cache: OrderedDict[str, str] = OrderedDict()
        self.asking: dict[str, asyncio.Task] = {}  # request -> the call in flight
        self.waiting: dict[str, int] = {}  # request -> rollouts awaiting that call
        self.loop = asyncio.get_running_loop()
        self._export: Optional[asyncio.Task] = None

    def judge(self, name: str, default: Optional[JudgeConfig] = None) -> Judge:
        judge = self.judges.get(name)
        if judge is None:
            config = self.configs.get(name) or default
            if config is None:
                known = ", ".join(sorted(self.configs)) or "none"
                raise JudgeFailure(name, f"no such judge; configured under `judges:`: {known}")
            judge = self.judges[name] = Judge(name, config)
        return judge

    async def ask(
        self, name: str, messages: list[dict], sampling: dict[str, Any], default: Optional[JudgeConfig] = None
    ) -> JudgeReply:
        judge = self.judge(name, default)
        judge.stats.add(calls=1)
        self._start_export()
        key = _cache_key(name, judge.config.model, messages, {**judge.config.sampling, **sampling})
        if key in self.cache:
            self.cache.move_to_end(key)
            judge.stats.add(cache_hits=1)
            return JudgeReply(name, self.cache[key], 0.0, cached=True)
        task = self.asking.get(key)
        cached = task is not None
        if task is None:
            task = self.asking[key] = asyncio.ensure_future(self._ask(judge, key, messages, sampling))
        else:
            judge.stats.add(cache_hits=1)
        self.waiting[key] = self.waiting.get(key, 0) + 1
        try:
            text, latency = await asyncio.shield(task)
        finally:
            left = self.waiting[key] = self.waiting[key] - 1
            if not left:
                del self.waiting[key]
                if not task.done():  # every rollout that wanted it was cancelled: free the slot
                    task.cancel()
        return JudgeReply(name, text, 0.0 if cached else latency, cached=cached)

    async def _ask(self, judge: Judge, key: str, messages: list[dict], sampling: dict) -> tuple[str, float]:
        try:
            text, latency = await judge.call(messages, sampling)
        finally:
            self.asking.pop(key, None)
        self.cache[key] = text
        if len(self.cache) > CACHE_SIZE:
            self.cache.popitem(last=False)
        return text, latency

    def _start_export(self) -> None:
        if self.settings is not None and (self._export is None or self._export.done()):
            self._export = asyncio.ensure_future(self._export_loop())

    async def _export_loop(self) -> None:
        from farm.connection import connect

        assert self.settings is not None
        r = connect(self.settings)
        try:
            while True:
                await asyncio.sleep(EXPORT_S)
                await self.export(r)
        finally:
            await asyncio.shield(self._final_export(r))

    async def _final_export(self, r: Any) -> None:
        try:
            await self.export(r)
        finally:
            await r.aclose()

    async def export(self, r: Any) -> None:
        """Add what each judge counted since the last export to Redis (farm/judge_stats.py)."""
        assert self.settings is not None
        keys = self.settings.keys
        minute = int(time.time() // 60)
        pipe = r.pipeline(transaction=False)
        taken = []
        for name, judge in self.judges.items():
            pending, judge.stats.pending = judge.stats.pending, {}
            taken.append((judge, pending))
            pipe.sadd(judge_stats.names_key(keys), name)
            for key in (judge_stats.totals_key(keys, name), judge_stats.minute_key(keys, name, minute)):
                for counter, n in pending.items():
                    if counter == "latency_s":
                        pipe.hincrbyfloat(key, counter, n)
                    else:
                        pipe.hincrby(key, counter, int(n))
            pipe.expire(judge_stats.minute_key(keys, name, minute), judge_stats.HISTORY_S)
            pipe.zadd(judge_stats.max_key(keys), {name: judge.stats.max_in_flight}, gt=True)
        try:
            await pipe.execute()
        except Exception as exc:  # noqa: BLE001 - figures are best effort: keep the counts for the next try
            for judge, pending in taken:
                for counter, n in pending.items():
                    judge.stats.pending[counter] = judge.stats.pending.get(counter, 0) + n
            log.warning("judge figures not written to Redis: %s: %s", type(exc).__name__, exc)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {
            name: {k: v for k, v in vars(j.stats).items() if k != "pending"} | {"limit": j.config.max_concurrency}
            for name, j in self.judges.items()
        }

    async def aclose(self) -> None:
        if self._export is not None:
            self._export.cancel()
            try:
                await self._export
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - logged by export itself
                pass
            self._export = None
        for judge in self.judges.values():
            await judge.aclose()
        self.judges.clear()


def _cache_key(name: str, model: str, messages: list[dict], sampling: dict) -> str:
    body = json.dumps([name, model, messages, sampling], sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()


_configs: dict[str, JudgeConfig] = {}
_settings: Optional[Settings] = None
_pool: Optional[JudgePool] = None


def install(settings: Optional[Settings], configs: Optional[dict[str, JudgeConfig]] = None) -> None:
    """The judges this process's pool serves: the settings' (AgentContext calls it with the
    worker's), or `configs`; figures go to the settings' Redis, none without settings."""
    global _configs, _settings, _pool
    _configs = dict(configs if configs is not None else settings.judges if settings is not None else {})
    for name, config in _configs.items():
        api_key(name, config.api_key)  # a key that cannot be read stops the worker at start, in one line
    _settings = settings
    _pool = None


def process_pool() -> JudgePool:
    """This process's pool for the running event loop (made on first use)."""
    global _pool
    loop = asyncio.get_running_loop()
    if _pool is None or _pool.loop is not loop:
        _pool = JudgePool(_configs, _settings)
    return _pool


async def close_pool() -> None:
    """Close this loop's pool (its clients, its last export); a later call makes a new one."""
    global _pool
    if _pool is not None and _pool.loop is asyncio.get_running_loop():
        pool, _pool = _pool, None
        await pool.aclose()
