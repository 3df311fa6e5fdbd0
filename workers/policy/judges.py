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

The pool is a per-process object, not module state: the worker's AgentContext makes it from the
settings (`JudgePool.from_settings`) and the worker closes it when it stops; `farm reverify` makes
and closes its own the same way. Its judges' clients and semaphores belong to the event loop that
first asked them; `aclose()` lets them go (a later call makes new ones). Verifiers reach it through
`ctx.judge` while it is `serving()`: the worker serves its context's pool to each agent run.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
import logging
import os
import time
from collections import OrderedDict
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Optional

from envs.sdk.judge import JudgeFailure, JudgeReply
from farm import judge_stats
from farm.errors import ConfigError
from farm.settings import JudgeConfig, Settings, read_secret

if TYPE_CHECKING:
    from workers.policy.judge_client import Judge

log = logging.getLogger("farm.judges")

CACHE_SIZE = 4096  # answers kept per process
EXPORT_S = 2.0


def api_key(name: str, where: Optional[str]) -> Optional[str]:
    """The key `api_key` points at: a file (its first line) or an environment variable."""
    if where is None:
        return None
    if os.path.isfile(os.path.expanduser(where)):
        return read_secret(where, f"judge {name} API key")
    if where in os.environ and os.environ[where]:
        return os.environ[where]
    raise ConfigError(f"judge {name}: api_key {where!r} is neither a readable file nor a set environment variable")


class JudgePool:
    """The judges of one process (one event loop): `ask` is what `ctx.judge` calls."""

    def __init__(self, configs: Optional[dict[str, JudgeConfig]] = None, settings: Optional[Settings] = None):
        self.configs = dict(configs if configs is not None else settings.judges if settings is not None else {})
        for name, config in self.configs.items():
            api_key(name, config.api_key)  # a key that cannot be read stops the worker at start, in one line
        self.settings = settings  # for the export to Redis; None: counted here only
        self.judges: dict[str, Judge] = {}
        self.cache: OrderedDict[str, str] = OrderedDict()
        self.asking: dict[str, asyncio.Task] = {}  # request -> the call in flight
        self.waiting: dict[str, int] = {}  # request -> rollouts awaiting that call
        self._export: Optional[asyncio.Task] = None

    @classmethod
    def from_settings(cls, settings: Optional[Settings]) -> JudgePool:
        """The judges the settings name (`judges:`); figures go to the settings' Redis, none without settings."""
        return cls(settings=settings)

    def judge(self, name: str, default: Optional[JudgeConfig] = None) -> Judge:
        judge = self.judges.get(name)
        if judge is None:
            from workers.policy.judge_client import Judge  # the policy extra's clients: see its docstring

            config = self.configs.get(name) or default
            if config is None:
                known = ", ".join(sorted(self.configs)) or "none"
                raise JudgeFailure(name, f"no such judge; configured under `judges:`: {known}")
            judge = self.judges[name] = Judge(name, config, api_key(name, config.api_key))
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


_serving: contextvars.ContextVar[Optional[JudgePool]] = contextvars.ContextVar("farm_judges", default=None)


@contextmanager
def serving(pool: JudgePool) -> Iterator[JudgePool]:
    """Verifiers run inside (and in the tasks started inside) ask `pool` through `ctx.judge`."""
    token = _serving.set(pool)
    try:
        yield pool
    finally:
        _serving.reset(token)


async def ask_serving(
    name: str, messages: list[dict], sampling: dict[str, Any], default: Optional[JudgeConfig] = None
) -> JudgeReply:
    """`ctx.judge` inside a verifier: the pool being served (`serving`), or a JudgeFailure without one."""
    pool = _serving.get()
    if pool is None:
        raise JudgeFailure(name, "no judge pool here (judges are asked inside a worker, or under judging())")
    return await pool.ask(name, messages, sampling, default)
