"""How a worker reaches its policy: one config for both backends and for the rotation they share.

A module of its own so that the rotation (workers/policy/rotation.py), both backends and the
agent registry all import it and none of them imports another for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from farm.settings import Settings


@dataclass
class PolicyConfig:
    urls: list[str]
    model: str
    timeout_s: float = 300.0  # one request
    retry_budget_s: float = 120.0  # one model call, retries and waits for a replica included
    backoff_s: float = 0.5
    backoff_max_s: float = 8.0
    unhealthy_after: int = 3  # consecutive errors before a replica leaves the rotation
    probe_interval_s: float = 2.0  # how often replicas out of rotation are probed
    health_interval_s: float = 15.0  # how often replicas in rotation are health-checked
    max_connections: int = 64  # per replica: set it to the worker's concurrency
    keepalive_s: float = 60.0
    routing: Literal["group", "least_outstanding"] = "group"  # how new rollouts are placed (rotation.py)
    spill_ratio: float = 1.5  # a group's samples leave its crowded home beyond this x the mean load
    route_headers: dict[str, str] = field(default_factory=dict)  # header -> "group" | "session", for routers
    extra: dict[str, Any] = field(default_factory=dict)  # extra request fields for every call
    # The openai-client backend only: its key (never printed) and the client's own retries.
    api_key: Optional[str] = field(default=None, repr=False)
    max_retries: int = 4

    @classmethod
    def from_settings(cls, settings: Settings) -> PolicyConfig:
        return cls(
            urls=list(settings.policy_urls),
            model=settings.policy_model,
            timeout_s=settings.policy_timeout_s,
            retry_budget_s=settings.policy_retry_budget_s,
            max_connections=max(8, settings.concurrency),
            api_key=settings.policy_api_key,
            max_retries=settings.policy_max_retries,
            routing=settings.policy_routing,
            spill_ratio=settings.policy_spill_ratio,
            route_headers=dict(settings.policy_route_headers),
        )
