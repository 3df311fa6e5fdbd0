"""Which policy replica takes the next request: the rotation, cooling, health checks, affinity.

Both policy backends (the token client, workers/policy/tokens.py, and the openai client,
workers/policy/openai_pool.py) ask the rotation for a replica before every request and report
back how it answered; the rotation alone decides who is in rotation, so the request path never
holds that state, and both backends have the same `ready()`:

  in rotation   takes requests;
  cooling       answered 429 or 503: no requests until its Retry-After (or a doubling backoff)
                has passed, then back on its next good answer;
  out           refused a connection, errored `unhealthy_after` times in a row or failed its
                /health check; probed every `probe_interval_s` until it answers, then back in.

Placement (`pick`, the one place a rollout's replica is chosen). A rollout (a `Session`) stays
on its replica for its whole conversation, so each turn's prefix is in that server's KV cache.
With `routing = "group"` (the default) the G samples of one GRPO group (one `group_id`) also
start on one replica, the group's home, so their shared prompt (system prompt, tool schemas,
the row) is prefilled once instead of on up to G replicas. The key is the group, not the
prompt's first blocks: groups often differ only in a user message after a long shared prefix.
A new group goes to a ready replica with few rollouts assigned (live sessions, not requests:
a rollout between turns still holds its cache there): among those within NEAR x the mean load of
the least loaded, the one its group id hashes to first, so that worker processes, which each
keep their own rotation, mostly choose the same home for a group whose samples they share. A group's later sample spills
to the least-loaded replica only when its home holds more than `spill_ratio` times the mean
rollouts assigned plus the group's own samples there, so an idle farm never splits its first
group while one replica filled by long sessions stops taking new groups' samples. A home that
leaves rotation (or cools) hands its group to the replica the next sample lands on, at that
sample's pick. `routing = "least_outstanding"` is the placement without groups: each new
rollout goes where fewest requests are outstanding. Homes are kept for the last
`GROUPS_KEPT` groups, so memory stays bounded however many groups pass through.

`ready()` / `wait_ready()` say whether any replica can take work now; the worker fetches no
task while none can. The health checks are workers/policy/health_checks.py.

Two settings belong to the backend that owns the rotation. `probes`: hosted APIs have no
/health, so the openai backend's rotation runs no health checks, and since nothing could then
bring a replica back, errors never take one out. `failure_penalty_s`: a replica whose request
failed that recently goes last among the ready ones for new rollouts (the openai backend's
COOLDOWN_S; 0, no effect, for the token client).

Load (`adaptive_load`, load.py). A replica may carry an in-flight limit (`cap`) that a poll of
its /metrics moves to where its throughput peaks. `pick` treats a replica at its limit as
taking nothing more for now, without moving anyone: a rollout waits for a slot on its own
replica, a group's sample for its home (unless the home is crowded, as above), a new group for
any replica with room; `take` waits for that slot (woken as requests there end, and every
SLOT_RECHECK_S in any case) within the caller's deadline, the retry budget. A replica without a
limit (no /metrics, adaptive_load off) always has room: the placement above, unchanged.

Routers in front of the servers (vLLM's production-stack router, SGLang's gateway) place
requests themselves; `route_headers` sends each request the keys they route on (header name ->
"group" or "session"), e.g. {"X-SMG-Routing-Key": "group"} for SGLang's consistent hashing.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import zlib
from collections import OrderedDict, deque
from typing import Optional

from farm.transport import backoff_delay
from workers.policy.config import PolicyConfig
from workers.policy.health_checks import HealthChecks
from workers.policy.load import LoadMonitor
from workers.policy.replicas import Home, Replica, Session, retry_after_s

__all__ = ["Home", "Replica", "Rotation", "Session", "retry_after_s"]

log = logging.getLogger("farm.policy")

GROUPS_KEPT = 65_536  # group homes remembered (least recently used dropped first)
NEAR = 0.25  # a new group's home: a replica within this x the mean load of the least loaded
SLOT_RECHECK_S = 0.25  # a request waiting for a replica's slot looks again at least this often


class Rotation:
    def __init__(self, config: PolicyConfig, probes: bool = True, failure_penalty_s: float = 0.0):
        self.config = config
        self.probes = probes
        self.failure_penalty_s = failure_penalty_s
        self.replicas = [Replica(u.rstrip("/")) for u in config.urls]
        self._homes: OrderedDict[str, Home] = OrderedDict()  # group -> home, least recently used first
        self._headers = tuple(config.route_headers.items())
        self._monitor_task: Optional[asyncio.Task] = None
        self.health = HealthChecks(config, self.replicas, self.put_back, self.take_out)
        self._ready: Optional[asyncio.Event] = None
        self._wake: Optional[asyncio.TimerHandle] = None
        self.load = LoadMonitor(config, self.replicas, self._pump) if config.adaptive_load and probes else None
        self._load_task: Optional[asyncio.Task] = None
        self._waiters: dict[Optional[str], deque[asyncio.Future]] = {}  # replica url (None: any) -> FIFO
        self._pump_soon = False

    def _event(self) -> asyncio.Event:
        if self._ready is None:
            self._refresh()
        return self._ready

    def _refresh(self) -> None:
        """Set the ready event iff some replica can take work; wake up when a cooling one can."""
        now = time.monotonic()
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None
        if self._ready is None:
            self._ready = asyncio.Event()
        event = self._ready
        if any(r.ready(now) for r in self.replicas):
            event.set()
            return
        event.clear()
        cooling = [r.cool_until for r in self.replicas if r.healthy]
        if cooling:
            self._wake = asyncio.get_running_loop().call_later(max(0.0, min(cooling) - now), self._refresh)

    def ready(self) -> bool:
        now = time.monotonic()
        return any(r.ready(now) for r in self.replicas)

    async def wait_ready(self) -> None:
        """Until some replica can take work (the worker fetches no task before that)."""
        self.ensure_monitor()
        await self._event().wait()

    def pick(self, session: Session) -> Optional[Replica]:
        """The session's replica while it can take work; else its group's home if that is ready and
        not crowded; else the least-loaded ready replica (one that failed within `failure_penalty_s`
        goes last). None when no replica is ready."""
        now = time.monotonic()
        current = session.replica
        session.wanted = None
        if current is not None and current.ready(now):
            return current if current.has_slot() else self._full(session, current)
        home = self._home(session.group) if self.config.routing == "group" and session.group else None
        if home is not None and home.replica.ready(now) and not self._crowded(home, now):
            if not home.replica.has_slot():
                return self._full(session, home.replica)
            return self._place(session, home.replica, home)
        homeless = session.group if (home is None or not home.replica.ready(now)) else None
        best = self._least_loaded(now, homeless if self.config.routing == "group" else None)
        if best is None:
            return None
        if homeless and self.config.routing == "group":
            home = self._rehome(homeless, best)  # a new group, or one whose home left rotation
        return self._place(session, best, home if home is not None and home.replica is best else None)

    @staticmethod
    def _full(session: Session, replica: Replica) -> None:
        """The session's replica (or its group's home) is at its in-flight limit: wait for it."""
        session.wanted = replica
        return None

    def _home(self, group: str) -> Optional[Home]:
        home = self._homes.get(group)
        if home is not None:
            self._homes.move_to_end(group)
        return home

    def _rehome(self, group: str, replica: Replica) -> Home:
        """A new home for the group (its samples live on the old one keep counting there)."""
        home = self._homes[group] = Home(replica)
        self._homes.move_to_end(group)
        if len(self._homes) > GROUPS_KEPT:
            self._homes.popitem(last=False)
        return home

    def _crowded(self, home: Home, now: float) -> bool:
        """More rollouts on the home than `spill_ratio` x the mean over ready replicas, beyond the
        group's own samples there."""
        ready = [r for r in self.replicas if r.ready(now)]
        mean = sum(r.assigned for r in ready) / len(ready)
        return home.replica.assigned - home.live > self.config.spill_ratio * mean

    def _least_loaded(self, now: float, group: Optional[str] = None) -> Optional[Replica]:
        """The ready replica with the fewest rollouts assigned (routing "group") or requests
        outstanding ("least_outstanding"), one that failed within `failure_penalty_s` last.

        For a new group's home: among the replicas within NEAR x the mean load of the least loaded,
        the one the group's id hashes to first (rendezvous hashing over the replicas' URLs). Every
        worker process computes the same preference without asking anyone, so the samples of one
        group fetched by several processes, whose loads are alike, mostly start on one replica."""
        ready = [r for r in self.replicas if r.ready(now) and r.has_slot()]
        if not ready:
            return None
        fresh = [r for r in ready if now - r.failed_at >= self.failure_penalty_s] or ready
        if self.config.routing != "group":
            least = min(r.outstanding for r in fresh)
            return random.choice([r for r in fresh if r.outstanding == least])
        least = min(r.assigned for r in fresh)
        if group is None:
            ties = [r for r in fresh if r.assigned == least]
            fewest = min(r.outstanding for r in ties)
            return random.choice([r for r in ties if r.outstanding == fewest])
        near = least + max(1.0, NEAR * sum(r.assigned for r in ready) / len(ready))
        return max((r for r in fresh if r.assigned <= near), key=lambda r: zlib.crc32(f"{group}\0{r.url}".encode()))

    @staticmethod
    def _place(session: Session, replica: Replica, home: Optional[Home]) -> Replica:
        """Put the session on `replica` (moving it off its old one), counted in the group's home
        when that is where it lands."""
        old = session.replica
        if old is not replica:
            if old is not None:
                old.assigned -= 1
                session.moves += 1
            replica.assigned += 1
            session.replica = replica
        if session.home is not home:
            if session.home is not None:
                session.home.live -= 1
            if home is not None:
                home.live += 1
            session.home = home
        return replica

    def headers(self, session: Session) -> Optional[dict[str, str]]:
        """The routing headers for a router in front of the servers (`route_headers`), or None."""
        if not self._headers:
            return None
        out = {}
        for name, which in self._headers:
            value = session.group if which == "group" else session.key
            if value:
                out[name] = value
        return out or None

    async def take(self, session: Session, deadline: float) -> Optional[Replica]:
        """pick(), waiting for a replica to come back, or for a slot on a full one, until the
        monotonic `deadline` (then None)."""
        while True:
            replica = self.pick(session)
            if replica is not None:
                return replica
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if self.ready():  # replicas in rotation, but the one wanted (or all) at their limits
                await self._slot(session.wanted, left)
                continue
            try:
                await asyncio.wait_for(self.wait_ready(), left)
            except asyncio.TimeoutError:
                return None

    async def _slot(self, replica: Optional[Replica], left: float) -> None:
        """Until a slot may have opened on `replica` (None: on any), SLOT_RECHECK_S at most."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(replica.url if replica else None, deque()).append(waiter)
        self.ensure_monitor()
        try:
            await asyncio.wait_for(waiter, min(left, SLOT_RECHECK_S))
        except asyncio.TimeoutError:
            pass

    def _released(self) -> None:
        """A request ended (its caller frees its slot right after): wake waiters once it has."""
        if self._waiters and not self._pump_soon:
            self._pump_soon = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        """Wake as many waiters as each replica has free slots: its own first, then any's."""
        self._pump_soon = False
        if not self._waiters:
            return
        now = time.monotonic()
        anyone = self._waiters.get(None)
        for r in self.replicas:
            if not r.ready(now):
                continue
            free = (r.cap - r.outstanding) if r.cap is not None else len(self._waiters.get(r.url) or ()) + 1
            for queue in (self._waiters.get(r.url), anyone):
                while queue and free > 0:
                    waiter = queue.popleft()
                    if not waiter.done():
                        waiter.set_result(None)
                        free -= 1
        for key in [k for k, q in self._waiters.items() if not q]:
            del self._waiters[key]

    def ok(self, replica: Replica) -> None:
        self._released()
        replica.errors = replica.cooldowns = 0
        replica.served += 1
        replica.last_ok = time.monotonic()
        if not replica.healthy:
            self.put_back(replica)

    def put_back(self, replica: Replica) -> None:
        replica.healthy, replica.errors, replica.cool_until = True, 0, 0.0
        log.info("policy replica %s back in rotation", replica.url)
        self._refresh()

    def failed(self, replica: Replica, reason: str) -> None:
        self._released()
        replica.errors += 1
        replica.last_error = reason
        replica.failed_at = time.monotonic()
        if self.probes and replica.healthy and replica.errors >= self.config.unhealthy_after:
            self.take_out(replica, f"{replica.errors} errors in a row, last: {reason}")

    def refused(self, replica: Replica, reason: str) -> None:
        """A connection to the replica could not be made: nothing listens there. Out of rotation at
        once where probes can bring it back (its groups go elsewhere at their next placement), else
        an ordinary failure."""
        self.failed(replica, reason)
        if self.probes and replica.healthy:
            self.take_out(replica, f"connection refused: {reason}")

    def take_out(self, replica: Replica, reason: str) -> None:
        replica.healthy = False
        replica.last_error = reason
        log.warning("policy replica %s out of rotation: %s", replica.url, reason)
        self.ensure_monitor()
        self._refresh()

    def cool(self, replica: Replica, status: int, retry_after: Optional[float]) -> None:
        self._released()
        replica.cooldowns += 1
        delay = (
            retry_after
            if retry_after is not None
            else backoff_delay(self.config.backoff_s, self.config.backoff_max_s, replica.cooldowns - 1)
        )
        until = time.monotonic() + delay
        if until > replica.cool_until:
            if replica.cool_until <= time.monotonic():
                log.warning(
                    "policy replica %s answered HTTP %d: no requests to it for %.1fs", replica.url, status, delay
                )
            replica.cool_until = until
        replica.last_error = f"HTTP {status}"
        self._refresh()

    def ensure_monitor(self) -> None:
        if self.load is not None and (self._load_task is None or self._load_task.done()):
            self._load_task = asyncio.create_task(self.load.run(), name="policy-load")
        if self.probes and (self._monitor_task is None or self._monitor_task.done()):
            self._monitor_task = asyncio.create_task(self.health.run(), name="policy-health")

    async def check_health(self) -> dict[str, bool]:
        """Probe every replica now; take the dead ones out of rotation, bring back the live ones."""
        if self.probes:
            await self.health.check_all()
        return {r.url: r.healthy for r in self.replicas}

    async def aclose(self) -> None:
        if self._monitor_task is not None:
            self._monitor_task.cancel()
        if self._load_task is not None:
            self._load_task.cancel()
        if self.load is not None:
            await self.load.aclose()
        if self._wake is not None:
            self._wake.cancel()
        await self.health.aclose()
