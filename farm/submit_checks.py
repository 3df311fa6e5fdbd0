"""What `FarmClient.submit` checks before and while it writes: the agent exists, the run is not cancelled.

A task for an agent that nothing knows (no environment or agent registered under that name, none
configured under `agents:`, no live worker in the namespace) would wait in a queue nobody reads and
end as `deadline`. By default the client warns once per agent and queues the tasks anyway: a worker
started a moment before (its first heartbeat not yet in Redis) or one still coming is a normal
start-up, and refusing it would make start-up order matter. `check_agents=True` refuses instead, as
`farm collect` does (exit code 5), with UnknownAgent before it writes the chunk (before anything,
when it is given a sequence); `check_agents=False` skips the check. What is known is cached for
the client's life (`KnownAgents`): the names defined here once, and the live workers' agents looked
up at most once per submit call (`AgentCheck`), only when a task names an agent not known yet, so
thousands of tasks cost no extra round trip.

A task submitted to a cancelled run (within cancel_ttl_s) is answered `cancelled before it started`
without running; `CancelledRuns` reads the run's cancel in the submit's own pipeline and logs a
warning once per run, so the caller hears it at submit rather than from every rollout.

While `results()` waits, `IdleAgents` says within seconds that an agent it waits for has no live
worker (else the caller hears nothing until its timeout): one look-up of the live workers per
interval, shared by every `results()` call of the client, whatever the number of tasks.

These warnings go to the logger `farm.client`. An application that has not set up logging would get
them from Python's last resort as bare lines with no level; `_Fallback` prints them with their level
and logger instead, and stands aside once the application configures logging.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from importlib.metadata import entry_points
from typing import Any, Awaitable, Callable, Iterable, Optional

from farm.errors import UnknownAgent
from farm.keys import Keys
from farm.settings import Settings

__all__ = ["BUILTIN_AGENTS", "AgentCheck", "CancelledRuns", "IdleAgents", "KnownAgents", "defined_agents"]

log = logging.getLogger("farm.client")


class _Fallback(logging.Handler):
    """The client's warnings, with their level, on stderr while the root logger has no handler."""

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            sys.stderr.write(self.format(record) + "\n")


if not any(isinstance(h, _Fallback) for h in log.handlers):
    _fallback = _Fallback(logging.WARNING)
    _fallback.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    log.addHandler(_fallback)

# The built-in agents of workers.loops.agent (the core cannot import it; tests/test_client_checks.py
# keeps the two in step), and the entry point groups environments and agents register under.
BUILTIN_AGENTS = frozenset({"noop", "harbor_oracle", "harbor_nop"})  # workers.loops.agent._builtins
ENTRY_POINT_GROUPS = ("farm.envs", "farm.agents")


def defined_agents(settings: Settings) -> set[str]:
    """Agent names defined on this machine: built-in, registered (environments and agents), configured."""
    names = set(BUILTIN_AGENTS) | set(settings.agents)
    for group in ENTRY_POINT_GROUPS:
        names |= {ep.name for ep in entry_points(group=group)}
    return names


class KnownAgents:
    """A client's cache of the agents a submit accepts: defined here, or seen with a live worker."""

    def __init__(self, settings: Settings, live: Callable[[], Awaitable[set[str]]]):
        self.settings, self.live = settings, live
        self._names: Optional[set[str]] = None

    async def names(self, *, refresh: bool = False) -> set[str]:
        if self._names is None:
            self._names = defined_agents(self.settings)
        if refresh:
            self._names |= await self.live()
        return set(self._names)


class AgentCheck:
    """One submit call's check: agents not known yet cost one live-worker lookup, once per call."""

    def __init__(self, known: KnownAgents, ns: str, refuse: bool, warned: set[str]):
        self.known, self.ns, self.refuse, self.warned = known, ns, refuse, warned
        self.looked_up = False

    async def check(self, agents: set[str]) -> None:
        known = await self.known.names()
        if agents <= known:
            return
        if not self.looked_up:
            self.looked_up = True
            known = await self.known.names(refresh=True)
        unknown = sorted(agents - known)
        if unknown and not self.refuse:
            for agent in unknown:
                if agent not in self.warned:
                    self.warned.add(agent)
                    log.warning(
                        "agent %r: no environment or agent registered under that name, none configured, no live "
                        "worker in namespace %r yet; its tasks wait for a worker (`farm worker --agent %s`) or end "
                        "as `deadline` (submit(..., check_agents=True) refuses them instead)",
                        agent,
                        self.ns,
                        agent,
                    )
            return
        if unknown:
            raise UnknownAgent(
                f"unknown agent(s) {', '.join(map(repr, unknown))}: no environment or agent registered under "
                f"that name, none configured under agents:, no live worker in namespace {self.ns!r}; known: "
                f"{', '.join(sorted(known))}. These tasks were not submitted (start its worker first, or "
                "leave check_agents at its default to queue them for one to come)"
            )


class CancelledRuns:
    """Says once per run, at submit, that tasks submitted to a cancelled run end `cancelled`."""

    def __init__(self, keys: Keys):
        self.keys = keys
        self.warned: set[str] = set()

    def read(self, pipe: Any, runs: list[str]) -> None:
        """Queue the runs' cancel expiries on the submit's pipeline: no round trip of its own."""
        pipe.zmscore(self.keys.cancel_runs(), runs)

    def warn(self, runs: Iterable[str], expiries: list[Optional[float]], now: float) -> None:
        for run, expires in zip(runs, expiries):
            if expires is not None and expires > now and run not in self.warned:
                self.warned.add(run)
                log.warning(
                    "run %s was cancelled: its tasks end `cancelled before it started` without running, for "
                    "another %.0fs (cancel_ttl_s); submit to another run id",
                    run,
                    expires - now,
                )


class IdleAgents:
    """Says once, within `interval_s` of waiting, that `results()` waits for an agent no live worker serves.

    The live workers are looked up at most once per interval for the whole client (concurrent
    `results()` calls share the answer), and only while some agent is waited for. An agent said
    once is said again only after a worker of it was seen live (it went away again).
    """

    interval_s = 3.0

    def __init__(self, live: Callable[[], Awaitable[set[str]]], ns: str):
        self.live, self.ns = live, ns
        self.warned: set[str] = set()
        self._live: set[str] = set()
        self._checked = float("-inf")  # time.monotonic() of the last look-up
        self._lock = asyncio.Lock()

    async def check(self, agents: set[str], waiting_since: float) -> None:
        """`agents`: those still waited for; `waiting_since`: time.monotonic() when the wait began."""
        if not agents or time.monotonic() - waiting_since < self.interval_s:
            return
        async with self._lock:  # a concurrent caller waits for this look-up instead of making its own
            if time.monotonic() - self._checked >= self.interval_s:
                self._live = await self.live()
                self._checked = time.monotonic()
        self.warned -= self._live
        for agent in sorted(agents - self._live - self.warned):
            self.warned.add(agent)
            log.warning(
                "waiting for rollouts of agent %r, and no worker serves it in namespace %r (no live heartbeat): "
                "start one (`farm worker --agent %s`); its tasks wait in the queue until then or until the deadline",
                agent,
                self.ns,
                agent,
            )
