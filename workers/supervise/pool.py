"""`farm worker --processes P`: a small supervisor over P single-process workers.

Each child runs the command it is given (`python -m farm worker ... --processes 1`), so one
process is exactly what a Kubernetes pod or a Slurm task would run. The supervisor forwards
SIGTERM/SIGINT and exits with the worst child status: after a stop signal 0 when every child
settled or handed back what it held, 3 when one left tasks pending for reclaim (Redis gone). It
waits for no child longer than a worker's own stop bound (grace_s + STOP_MARGIN_S): one still
running then is SIGKILLed (its tasks stay pending, reclaimed after the visibility timeout) and
counts as 3, so the pool's stop is bounded too.

Restarts follow the child's exit code (farm.errors): a configuration error, refused
credentials or an unknown agent would fail the same way again, so that child is not
restarted and the pool stops with its code. A child that exits 3 has already waited out the
outage for redis_down_max_s: restarting it would start a fresh clock, so a pool would outlive
the bound several times over. The pool asks Redis once (`redis_ok`): when it answers again the
child is restarted like a crash, otherwise the whole pool stops with 3, within the bound plus
the probe. A crash is restarted after a jittered backoff that doubles with each quick failure, at most
`max_restarts` times within any `window_s` seconds: a child that crashes now and then runs
for ever, one that crash-loops stops the pool with a message that says so.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections import deque
from typing import Callable, Optional

from farm.errors import EXIT_INTERRUPTED, EXIT_TRANSPORT, NOT_RESTARTABLE
from farm.transport import backoff_delay
from workers.delivery.chores import STOP_MARGIN_S

log = logging.getLogger("farm.pool")


class RestartWindow:
    """At most `max_restarts` restarts within any `window_s` seconds; backoff grows with recent ones."""

    def __init__(self, max_restarts: int, window_s: float, base_s: float = 0.5, cap_s: float = 30.0):
        self.max_restarts, self.window_s, self.base_s, self.cap_s = max_restarts, window_s, base_s, cap_s
        self.times: deque[float] = deque()

    def recent(self, now: float) -> int:
        while self.times and now - self.times[0] > self.window_s:
            self.times.popleft()
        return len(self.times)

    def allow(self, now: float) -> Optional[float]:
        """The delay before a restart now, or None when the window is full."""
        n = self.recent(now)
        if n >= self.max_restarts:
            return None
        self.times.append(now)
        return backoff_delay(self.base_s, self.cap_s, n)


def _slot_env(env: Optional[dict[str, str]], slot: int, restart: bool = False) -> dict[str, str]:
    """The child's environment, with FARM_WORKER_SLOT (0..P-1): e.g. its metrics port is the base + slot.
    A restarted child gets FARM_REDIS_REACHED=1: the pool was running, so a Redis that does not answer
    it is an outage to wait out (redis_down_max_s), not a Redis that was never there (farm.transport)."""
    extra = {"FARM_REDIS_REACHED": "1"} if restart else {}
    return {**(os.environ if env is None else env), "FARM_WORKER_SLOT": str(slot), **extra}


def run_pool(
    cmd: list[str],
    processes: int,
    *,
    max_restarts: int = 5,
    window_s: float = 60.0,
    base_s: float = 0.5,
    env: Optional[dict[str, str]] = None,
    redis_ok: Optional[Callable[[], bool]] = None,
    grace_s: float = 30.0,
) -> int:
    """Run `processes` children of `cmd` until they end (see the module docstring); the pool's status."""
    pool = _Pool(cmd, env, RestartWindow(max_restarts, window_s, base_s), redis_ok, grace_s)
    signal.signal(signal.SIGTERM, pool.forward)
    signal.signal(signal.SIGINT, pool.forward)
    pool.start(processes)
    return pool.run()


class _Pool:
    def __init__(
        self,
        cmd: list[str],
        env: Optional[dict[str, str]],
        window: RestartWindow,
        redis_ok: Optional[Callable[[], bool]],
        grace_s: float,
    ):
        self.cmd, self.env, self.window, self.redis_ok, self.grace_s = cmd, env, window, redis_ok, grace_s
        self.children: dict[int, Optional[subprocess.Popen]] = {}
        self.due: dict[int, float] = {}  # slot -> when its restart is due
        self.stopping = False
        self.signalled = False  # stopped by a signal: the pool's last line says what its children left
        self.codes: list[int] = []
        self.cause: Optional[int] = None  # the code that stopped the pool: its status, whatever the rest die of
        self.kill_at: Optional[float] = None  # Redis is gone: a draining child could settle nothing, so it gets 1 s
        self.killed: set[int] = set()  # pids killed for that: their -9 is not the pool's status
        self.kill_by: Optional[float] = None  # the stop's bound: a child still running then is SIGKILLed
        self.overdue: set[int] = set()  # pids killed for running past it: their status is 3

    def start(self, processes: int) -> None:
        for i in range(processes):
            if self.stopping:  # a stop signal came first
                return
            self.children[i] = subprocess.Popen(self.cmd, env=_slot_env(self.env, i))

    def alive(self) -> list[subprocess.Popen]:
        return [c for c in self.children.values() if c is not None and c.poll() is None]

    def begin_stop(self) -> None:
        self.stopping = True
        self.due.clear()
        if self.kill_by is None:
            self.kill_by = time.monotonic() + self.grace_s + STOP_MARGIN_S

    def forward(self, signum, _frame) -> None:
        self.signalled = True
        self.begin_stop()
        for c in self.alive():
            c.send_signal(signum)

    def stop_all(self, why: str, code: int) -> None:
        if not self.stopping:
            log.error("stopping the pool: %s", why)
            self.cause = code
        self.begin_stop()
        for c in self.alive():
            c.terminate()

    def run(self) -> int:
        while any(c is not None for c in self.children.values()) or (self.due and not self.stopping):
            time.sleep(0.1)
            now = time.monotonic()
            self.kill_late(now)
            for slot, at in list(self.due.items()):
                if now >= at and not self.stopping:
                    del self.due[slot]
                    self.children[slot] = subprocess.Popen(self.cmd, env=_slot_env(self.env, slot, restart=True))
            for slot, c in self.children.items():
                code = None if c is None else c.poll()
                if c is not None and code is not None:
                    self.children[slot] = None
                    self.ended(slot, c.pid, code, now)
        status = self.cause if self.cause is not None else max((abs(c) for c in self.codes), default=0)
        if self.signalled:
            left = sum(c == EXIT_TRANSPORT for c in self.codes)
            log.log(
                logging.WARNING if left else logging.INFO,
                "pool stopped: %d of %d workers left tasks pending for reclaim; exit status %d",
                left,
                len(self.codes),
                status,
            )
        return status

    def kill_late(self, now: float) -> None:
        """SIGKILL what outlived its time: the children of a pool whose Redis is gone (after 1 s), and a
        child still running past the stop's bound."""
        if self.kill_at is not None and now >= self.kill_at:
            for c in self.alive():
                c.kill()
                self.killed.add(c.pid)
            self.kill_at = None
        if self.kill_by is not None and now >= self.kill_by:
            for c in self.alive():
                if c.pid not in self.overdue:
                    log.warning("worker pid %d still running %gs after the stop; killing it", c.pid, self.grace_s)
                    c.kill()
                    self.overdue.add(c.pid)

    def ended(self, slot: int, pid: int, code: int, now: float) -> None:
        """A child exited with `code`: its status counted, the pool stopped, or the child restarted."""
        if pid in self.killed:
            return
        if pid in self.overdue:  # what it held stays pending, reclaimed after the visibility timeout
            self.codes.append(EXIT_TRANSPORT)
            return
        if self.stopping and code in (-signal.SIGTERM, -signal.SIGINT, EXIT_INTERRUPTED):
            code = 0  # the stop signal ended it before its own handlers were set: it held nothing
        if self.stopping or code == 0:
            self.codes.append(code)
            return
        if code in NOT_RESTARTABLE:
            self.codes.append(code)
            self.stop_all(
                f"worker pid {pid} exited with {code} (a configuration problem; restarting would fail the same way)",
                code,
            )
            return
        if code == EXIT_TRANSPORT and not (self.redis_ok is not None and self.redis_ok()):
            self.codes.append(code)
            self.stop_all(
                f"worker pid {pid} exited with {code}: Redis unreachable (never, or past redis_down_max_s)", code
            )
            self.kill_at = now + 1.0  # its tasks stay pending in Redis and are reclaimed once it is back
            return
        delay = self.window.allow(now)
        if delay is None:
            self.codes.append(code)
            self.stop_all(
                f"worker pid {pid} exited with {code}; {self.window.max_restarts} restarts within "
                f"{self.window.window_s:g}s already (restart_max / restart_window_s)",
                code,
            )
            return
        log.warning(
            "worker pid %d exited with %d; restarting in %.1fs (%d restarts in the last %gs)",
            pid,
            code,
            delay,
            self.window.recent(now),
            self.window.window_s,
        )
        self.due[slot] = now + delay
