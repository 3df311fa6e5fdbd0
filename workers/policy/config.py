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
    # In-flight limits per replica from its /metrics (workers/policy/load.py); off: no limits.
    adaptive_load: bool = False
    load_poll_s: float = 0.5  # how often each replica's /metrics is read while requests are in flight
    load_floor: int = 4  # a replica's limit never drops below this
    load_kv_high: float = 0.9  # no growth while the replica's KV cache is this full
    extra: dict[str, Any] = field(default_factory=dict)  # extra request fields for every call
    # The openai-client backend only: its key (never printed) and the client's own retries.
    api_key: Optional[str] = field(default=None, repr=False)
    max_retries: int = 4
    stream: bool = False  # the tokens backend streams completions (policy_stream: partial rollouts keep them)

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
            adaptive_load=settings.policy_adaptive_load,
            load_poll_s=settings.policy_load_poll_s,
            load_floor=settings.policy_load_floor,
            load_kv_high=settings.policy_load_kv_high,
            stream=settings.policy_stream,
        )
