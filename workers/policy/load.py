"""Each policy replica held at its best load: an in-flight limit per replica from its own /metrics.

A fixed `concurrency` per worker overloads a replica whose KV cache fills (vLLM preempts running
requests and recomputes them, throwing work away) and underloads an idle one. With
`adaptive_load` on, one `LoadMonitor` per process (the rotation's) reads every replica's
Prometheus /metrics every `load_poll_s` seconds while requests are in flight (never per
request), and a `Limit` per replica moves that replica's in-flight limit (`Replica.cap`, which
rotation.pick honours) towards where its throughput peaks, as prime-rl's adaptive concurrency
does for its whole fleet:

  cut     the replica preempted since the last poll: the limit drops to BACKOFF x this process's
          share of what the replica runs (its requests in flight x running / (running + waiting)),
          and the replica's signals are ignored until the requests in flight have drained below
          the limit (they show the overload already cut for); overload that outlives the drain is
          cut harder (ESCALATED) next time;
  shrink  requests waited at the replica at two polls in a row (`vllm:num_requests_waiting`):
          x SHRINK, never below the share it runs;
  grow    no waiting, no new preemption, KV usage under `load_kv_high`, and the limit is what
          holds the replica back (in flight >= BINDING x the limit): + max(1, GROW x the limit),
          up to the worker's connections per replica (`max_connections`);
  hold    otherwise.

The first reading sets the limit to `max_connections`, the load the worker sends anyway, so a
replica that never preempts nor queues is never held back; `load_floor` is the least it drops
to. A replica without /metrics, or with metrics this cannot read, has no limit: today's
behaviour.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Protocol

import aiohttp

if TYPE_CHECKING:
    from workers.policy.config import PolicyConfig


class Replica(Protocol):
    """What the monitor reads and sets of a rotation's replica (workers.policy.rotation.Replica,
    which imports this module: a protocol here, not an import back)."""

    url: str
    outstanding: int
    cap: Optional[int]


log = logging.getLogger("farm.policy")

BACKOFF = 0.75  # the first cut on preemption, x what is in flight
ESCALATED = 0.5  # the cut when overload outlived the drain after the last one
SHRINK = 0.9  # a queue at two polls in a row
GROW = 0.05  # growth per clear poll, x the limit (at least 1)
BINDING = 0.9  # grow only when this much of the limit is in use

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
PREEMPTIONS = ("vllm:num_preemptions_total", "vllm:num_preemptions")  # the counter's sample, its bare name
_WANTED = {RUNNING, WAITING, KV_USAGE, *PREEMPTIONS}


@dataclass(frozen=True)
class Sample:
    """One replica's load signals at one poll (summed over its engines)."""

    running: float
    waiting: float
    kv_usage: float  # 0..1
    preemptions: float  # cumulative


def parse_metrics(text: str) -> Optional[Sample]:
    """vLLM's scheduler gauges and preemption counter from Prometheus text; None when it has no
    running/waiting gauges (not a vLLM, or unreadable)."""
    values: dict[str, float] = {}
    kv: list[float] = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace, space = line.find("{"), line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            name, rest = line[:brace], line[line.find("}", brace) + 1 :]
        else:
            name, rest = line[:space], line[space:]
        if name not in _WANTED:
            continue
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            return None
        if name == KV_USAGE:
            kv.append(value)
        else:
            key = PREEMPTIONS[0] if name in PREEMPTIONS else name
            values[key] = values.get(key, 0.0) + value
    if RUNNING not in values or WAITING not in values:
        return None
    return Sample(values[RUNNING], values[WAITING], max(kv, default=0.0), values.get(PREEMPTIONS[0], 0.0))


class Limit:
    """One replica's in-flight limit, moved by each poll's Sample (see the module's law)."""

    def __init__(self, floor: int, ceiling: int, kv_high: float):
        self.floor, self.ceiling, self.kv_high = max(1, floor), max(1, floor, ceiling), kv_high
        self.value: Optional[float] = None  # None: no reading yet, no limit
        self.prev: Optional[Sample] = None
        self.draining = False
        self.backoff = BACKOFF
        self.cuts = self.grows = self.shrinks = 0

    @property
    def cap(self) -> Optional[int]:
        return None if self.value is None else int(self.value)

    def reset(self) -> None:
        """Unreadable metrics: no limit until a reading comes back."""
        self.value, self.prev, self.draining, self.backoff = None, None, False, BACKOFF

    def observe(self, sample: Sample, inflight: int) -> str:
        """Move the limit by one reading, with `inflight` this process's requests there now; say how."""
        prev, self.prev = self.prev, sample
        if self.value is None or prev is None:
            self.value = float(self.ceiling)  # today's load until the replica says otherwise
            return "start"
        # This process's share of what the replica runs (other processes may send to it too).
        share = inflight * sample.running / max(1.0, sample.running + sample.waiting)
        preempted = sample.preemptions > prev.preemptions  # a restarted server's counter drops: no
        if self.draining and inflight <= self.value:
            self.draining = False
        if self.draining:
            return "hold"  # what it still shows is the overload already cut for
        if preempted:
            self.value = max(float(self.floor), self.backoff * min(self.value, share))
            self.draining, self.backoff = True, ESCALATED
            self.cuts += 1
            return "cut"
        self.backoff = BACKOFF  # the overload did not outlive the drain
        if sample.waiting > 0 and prev.waiting > 0:
            self.value = max(float(self.floor), min(self.value, max(share, self.value * SHRINK)))
            self.shrinks += 1
            return "shrink"
        if sample.waiting > 0 or sample.kv_usage >= self.kv_high:
            return "hold"
        if inflight >= BINDING * self.value and self.value < self.ceiling:
            self.value = min(float(self.ceiling), self.value + max(1.0, GROW * self.value))
            self.grows += 1
            return "grow"
        return "hold"


class LoadMonitor:
    """The one poll of every replica's /metrics in a process, while requests are in flight."""

    def __init__(self, config: PolicyConfig, replicas: list[Replica], on_change=None):
        self.config = config
        self.replicas = replicas
        self.limits = {r.url: Limit(config.load_floor, config.max_connections, config.load_kv_high) for r in replicas}
        self.on_change = on_change  # called after a poll moved any limit (the rotation wakes waiters)
        self.polls = 0
        self._http: Optional[aiohttp.ClientSession] = None

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            if any(r.outstanding for r in self.replicas):
                await self.poll()
            await asyncio.sleep(max(0.05, self.config.load_poll_s - (time.monotonic() - started)))

    async def poll(self) -> None:
        samples = await asyncio.gather(*(self._read(r) for r in self.replicas))
        self.polls += 1
        for r, sample in zip(self.replicas, samples):
            limit = self.limits[r.url]
            if sample is None:
                limit.reset()
            else:
                verdict = limit.observe(sample, r.outstanding)
                if verdict in ("cut", "shrink"):
                    log.debug("policy replica %s: in-flight limit %s (%s)", r.url, limit.cap, verdict)
            r.cap = limit.cap
        if self.on_change is not None:
            self.on_change()

    async def _read(self, r: Replica) -> Optional[Sample]:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=8), timeout=aiohttp.ClientTimeout(total=2.0)
            )
        try:
            async with self._http.get(f"{r.url}/metrics") as resp:
                if resp.status != 200:
                    return None
                return parse_metrics(await resp.text())
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, UnicodeDecodeError):
            return None

    async def aclose(self) -> None:
        if self._http is not None and not self._http.closed:
            await self._http.close()
