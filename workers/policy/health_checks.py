"""The rotation's health checks (workers/policy/rotation.py): each replica's GET /health.

Replicas out of rotation are probed every `probe_interval_s` until they answer, then put back;
every `health_interval_s` all of them are. The checks use a small session of their own, and a
replica that answered a request within the last health interval is alive whatever a check says,
so a saturated connection pool or event loop never takes a working replica out. Hosted APIs have no
/health: a rotation without `probes` makes no checks.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Optional

import aiohttp

from workers.policy.config import PolicyConfig
from workers.policy.replicas import Replica

__all__ = ["HealthChecks"]


class HealthChecks:
    """Probes `replicas`; tells the rotation which to `put_back` and which to `take_out`."""

    def __init__(
        self,
        config: PolicyConfig,
        replicas: list[Replica],
        put_back: Callable[[Replica], None],
        take_out: Callable[[Replica, str], None],
    ):
        self.config, self.replicas = config, replicas
        self.put_back, self.take_out = put_back, take_out
        self._session: Optional[aiohttp.ClientSession] = None

    async def run(self) -> None:
        """Probe replicas out of rotation often, and the ones in rotation now and then."""
        next_check = time.monotonic() + self.config.health_interval_s
        while True:
            await asyncio.sleep(self.config.probe_interval_s)
            now = time.monotonic()
            check_all = now >= next_check
            if check_all:
                next_check = now + self.config.health_interval_s
            for r in self.replicas:
                if r.healthy and not check_all:
                    continue
                alive = await self.alive(r)
                if alive and not r.healthy:
                    self.put_back(r)
                elif not alive and r.healthy and time.monotonic() - r.last_ok > self.config.health_interval_s:
                    # A replica that answered a request lately is alive, whatever a check that
                    # timed out behind a saturated event loop says.
                    self.take_out(r, "health check failed")

    async def alive(self, r: Replica) -> bool:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=8), timeout=aiohttp.ClientTimeout(total=5.0)
            )
        try:
            async with self._session.get(f"{r.url}/health") as resp:
                return resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return False

    async def check_all(self) -> None:
        """Probe every replica now; take the dead ones out of rotation, bring back the live ones."""
        for r in self.replicas:
            alive = await self.alive(r)
            if alive and not r.healthy:
                self.put_back(r)
            elif not alive and r.healthy:
                self.take_out(r, "health check failed")

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
