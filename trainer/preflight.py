"""Pre-flight: what must hold before the model loads, so a run that cannot train fails in seconds.

A training run that starts against a farm with no worker for one of its agents, or a policy
server that cannot take new weights, used to load the model, wait a whole rollout timeout, and
fail (or worse, train on nothing). `check` runs before anything heavy, in this order:

1. every agent the training (and evaluation) rows name has a live worker (a heartbeat in Redis),
   waiting up to `worker_wait_s` for workers still starting: else NoLiveWorker, exit 5;
2. with `weight_sync: reload`, every server the trainer syncs answers `/health` (else
   PolicyUnreachable, exit 1) and serves `/collective_rpc`, which vLLM mounts only with
   `VLLM_SERVER_DEV_MODE=1` (else ConfigError, exit 2). The probe is a GET, which the POST-only
   route answers 405 when present and 404 when not: nothing is loaded.

The keys of the training config that the farm replaces were refused when it loaded
(trainer.config). Each failure is one line naming what to start or fix.
"""

from __future__ import annotations

import logging
import os
import time

import httpx

from farm.connection import connect_sync
from farm.errors import ConfigError, FarmError
from farm.settings import Settings
from farm.state import live_workers
from farm.transport import errors
from trainer.config import TrainConfig
from trainer.rollout import NoLiveWorker

__all__ = [
    "PolicyUnreachable",
    "check",
    "check_policy",
    "check_workers",
    "data_agents",
    "sync_urls",
]

log = logging.getLogger("farm.trainer")


class PolicyUnreachable(FarmError):
    """A policy server the trainer syncs does not answer."""


def data_agents(cfg: TrainConfig) -> list[str]:
    """The agents the training and evaluation rows name, sorted."""
    from trainer.train import load_rows

    paths = [cfg.dataset_path] + ([cfg.eval_dataset_path] if cfg.eval_dataset_path else [])
    return sorted({r["agent_ref"]["name"] for p in paths for r in load_rows(os.path.expanduser(p))})


def sync_urls(settings: Settings, cfg: TrainConfig) -> list[str]:
    """The servers a `weight_sync: reload` run pushes its weights to."""
    return list(cfg.sync_urls or settings.policy_urls) if cfg.weight_sync == "reload" else []


def check_workers(settings: Settings, agents: list[str], wait_s: float, every_s: float = 0.2) -> None:
    """Every agent has a live worker within wait_s, else NoLiveWorker naming the ones without."""
    r = connect_sync(settings)
    deadline = time.monotonic() + wait_s
    try:
        while True:
            with errors(settings.redis_url):
                missing = sorted(set(agents) - live_workers(r, settings.keys).agents())
            if not missing or time.monotonic() >= deadline:
                break
            time.sleep(every_s)
    finally:
        r.close()
    if missing:
        raise NoLiveWorker(
            f"no live worker for agent {', '.join(missing)} (waited {wait_s:.0f}s, namespace "
            f"{settings.namespace!r}): start `farm worker --agent {missing[0]}`, or run `farm train --embedded`"
        )


def check_policy(urls: list[str], timeout_s: float = 5.0) -> None:
    """Every server answers and has the endpoint weight sync uses."""
    for url in urls:
        base = url.rstrip("/").removesuffix("/v1")
        try:
            health = httpx.get(f"{base}/health", timeout=timeout_s)
            rpc = httpx.get(f"{base}/collective_rpc", timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise PolicyUnreachable(
                f"policy server {base} does not answer ({type(exc).__name__}): start it (`farm policy serve`) "
                "or fix policy_urls / sync_urls"
            ) from None
        if health.status_code != 200:
            raise PolicyUnreachable(f"policy server {base} is not healthy (/health answered {health.status_code})")
        if rpc.status_code == 404:
            raise ConfigError(
                f"policy server {base} cannot take new weights (no /collective_rpc): start vLLM with "
                "VLLM_SERVER_DEV_MODE=1 (`farm policy serve` does), or set weight_sync: none"
            )


def check(settings: Settings, cfg: TrainConfig) -> list[str]:
    """All the checks above; the agents the data names."""
    agents = data_agents(cfg)
    check_workers(settings, agents, cfg.worker_wait_s)
    urls = sync_urls(settings, cfg)
    check_policy(urls)
    log.info(
        "pre-flight: live workers for %s; %s",
        ", ".join(agents),
        f"{len(urls)} policy server(s) take weights" if urls else f"weight_sync {cfg.weight_sync}, no server synced",
    )
    return agents
