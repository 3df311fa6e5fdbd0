"""`farm worker --processes P`: a small supervisor over P single-process workers.

Each child runs the command it is given (`python -m farm worker ... --processes 1`), so one
process is exactly what a Kubernetes pod or a Slurm task would run. The supervisor forwards
SIGTERM/SIGINT and exits with the worst child status.

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

from farm.errors import EXIT_TRANSPORT, NOT_RESTARTABLE
from farm.transport import backoff_delay

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
) -> int:
    children: dict[int, Optional[subprocess.Popen]] = {
        i: subprocess.Popen(cmd, env=_slot_env(env, i)) for i in range(processes)
    }
    due: dict[int, float] = {}  # slot -> when its restart is due
    window = RestartWindow(max_restarts, window_s, base_s)
    stopping = False
    codes: list[int] = []

    def forward(signum, _frame):
        nonlocal stopping
        stopping = True
        for c in children.values():
            if c is not None and c.poll() is None:
                c.send_signal(signum)

    kill_at: Optional[float] = None  # Redis is gone: a draining child could settle nothing, so it gets 1 s
    killed: set[int] = set()  # pids killed for that: their -9 is not the pool's status

    cause: Optional[int] = None  # the code that stopped the pool: its status, whatever the rest die of

    def stop_all(why: str, code: int) -> None:
        nonlocal stopping, cause
        if not stopping:
            log.error("stopping the pool: %s", why)
            cause = code
        stopping = True
        due.clear()
        for c in children.values():
            if c is not None and c.poll() is None:
                c.terminate()

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while any(c is not None for c in children.values()) or (due and not stopping):
        time.sleep(0.1)
        now = time.monotonic()
        if kill_at is not None and now >= kill_at:
            for c in children.values():
                if c is not None and c.poll() is None:
                    c.kill()
                    killed.add(c.pid)
            kill_at = None
        for slot, at in list(due.items()):
            if now >= at and not stopping:
                del due[slot]
                children[slot] = subprocess.Popen(cmd, env=_slot_env(env, slot, restart=True))
        for slot, c in children.items():
            code = None if c is None else c.poll()
            if code is None:
                continue
            children[slot] = None
            if c.pid in killed:
                continue
            if stopping or code == 0:
                codes.append(code)
                continue
            if code in NOT_RESTARTABLE:
                codes.append(code)
                stop_all(
                    f"worker pid {c.pid} exited with {code} (a configuration problem; "
                    "restarting would fail the same way)",
                    code,
                )
                continue
            if code == EXIT_TRANSPORT and not (redis_ok is not None and redis_ok()):
                codes.append(code)
                stop_all(
                    f"worker pid {c.pid} exited with {code}: Redis unreachable (never, or past redis_down_max_s)",
                    code,
                )
                kill_at = now + 1.0  # its tasks stay pending in Redis and are reclaimed once it is back
                continue
            delay = window.allow(now)
            if delay is None:
                codes.append(code)
                stop_all(
                    f"worker pid {c.pid} exited with {code}; {max_restarts} restarts within "
                    f"{window_s:g}s already (restart_max / restart_window_s)",
                    code,
                )
                continue
            log.warning(
                "worker pid %d exited with %d; restarting in %.1fs (%d restarts in the last %gs)",
                c.pid,
                code,
                delay,
                window.recent(now),
                window_s,
            )
            due[slot] = now + delay
    return cause if cause is not None else max((abs(c) for c in codes), default=0)
