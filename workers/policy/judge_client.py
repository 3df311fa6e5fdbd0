"""One judge of the pool (workers/policy/judges.py): its openai client over its own URLs, its
slots, its deadline and its counts.

Apart from the pool because it needs the policy extra's HTTP clients (openai, aiohttp), which a
core install (noop workers) has not: every worker makes a pool, and the pool imports this module
when a verifier first asks a judge.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from envs.sdk.judge import JudgeFailure
from farm import judge_stats
from farm.errors import RolloutFailure
from farm.settings import JudgeConfig
from workers.policy.config import PolicyConfig
from workers.policy.openai_convo import ChatConversation
from workers.policy.openai_pool import OpenAIPolicy
from workers.policy.replicas import Session


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


class Judge:
    """One judge: its openai client over its own URLs, its slots and its counts."""

    def __init__(self, name: str, config: JudgeConfig, key: Optional[str]):
        self.name = name
        self.config = config
        policy_config = PolicyConfig(
            urls=list(config.urls),
            model=config.model,
            timeout_s=config.deadline_s,
            max_connections=config.max_concurrency,
            routing="least_outstanding",
            api_key=key,
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
