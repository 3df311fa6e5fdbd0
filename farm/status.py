"""`farm status`: what every agent stream and worker looks like right now, read from Redis."""

from __future__ import annotations

import json
import signal
from dataclasses import asdict
from typing import Any, Optional

import redis

from farm import state
from farm.keys import Keys

# The stats-hash counts `farm status` shows per agent, in its columns' order: how tasks ended
# (a cancelled task is neither done nor failed: a client called it off) and attempts retried.
SETTLED = ("done", "failed", "cancelled", "retried")


def collect_status(r: redis.Redis, keys: Keys) -> dict:
    """Per agent its queue (farm.state.QueueState's fields), and the live workers."""
    return {
        "agents": {agent: asdict(state.queue(r, keys, agent)) for agent in state.agents(r, keys)},
        "workers": state.live_workers(r, keys).listing(),
    }


def _n(value: Any) -> str:
    """A count as text: 0 stays 0 (a blank reads as 'unknown'); None (no group yet) is '-'."""
    return "-" if value is None else f"{int(value):,}"


def render_status(status: dict, *, where: str = "", console=None) -> None:
    """Two tables that fit 80 columns: per agent, then live workers (ids shortened to fit)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    if where:
        console.print(where, highlight=False, soft_wrap=True)
    t = agent_table("agents", ("queued", "pending", "lag", "delayed", "dead", *SETTLED), 16)
    t.collapse_padding = True  # one space between columns: ten of them fit 80 columns
    for agent, row in status["agents"].items():
        c = row["counters"]
        t.add_row(
            agent,
            _n(row["length"]),
            _n(row["pending"]),
            _n(row["lag"]),
            _n(row["delayed"]),
            _n(row["dead"]),
            *(_n(c.get(k, 0)) for k in SETTLED),
        )
    if not status["agents"]:
        t.add_row("(none yet)", *["0"] * (5 + len(SETTLED)))
    console.print(t)
    w = Table(title=f"workers alive: {len(status['workers'])}", title_justify="left", pad_edge=False, box=None)
    for col in ("worker", "agent", "conc", "inflight", "done", "failed"):
        w.add_column(
            col,
            justify="left" if col in ("worker", "agent") else "right",
            no_wrap=True,
            overflow="ellipsis",
            max_width=34 if col == "worker" else (16 if col == "agent" else None),
        )
    for info in sorted(status["workers"], key=lambda x: x.get("worker_id", "")):
        w.add_row(
            str(info.get("worker_id", "?")),
            str(info.get("agent", "?")),
            *(_n(info.get(k, 0)) for k in ("concurrency", "inflight", "done", "failed")),
        )
    console.print(w)


def run_status(settings, *, as_json: bool = False, watch_s: Optional[float] = None) -> int:
    """`farm status`: once, or every watch_s seconds until Ctrl-C. Names the Redis and namespace it reads."""
    import time

    from rich.console import Console

    from farm.connection import connect_sync
    from farm.transport import errors, redact

    where = f"Redis {redact(settings.redis_url)}, namespace {settings.namespace!r}"
    r = connect_sync(settings)
    console = Console(width=min(80, Console().width))
    if watch_s:
        # Ctrl-C ends the watch even when this process was started with SIGINT ignored (Python then
        # installs no handler of its own: a shell's background job, a supervisor), as the workers'
        # own handlers do.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        while True:
            with errors(settings.redis_url):
                status = collect_status(r, settings.keys)
            if as_json:
                print(
                    json.dumps(
                        {"redis": redact(settings.redis_url), "namespace": settings.namespace, **status},
                        indent=None if watch_s else 2,
                        default=str,
                    ),
                    flush=True,
                )
            else:
                if watch_s and console.is_terminal:
                    console.clear()
                stamp = time.strftime("%H:%M:%S")
                render_status(status, where=f"{where} at {stamp}" if watch_s else where, console=console)
            if not watch_s:
                return 0
            time.sleep(watch_s)
    except KeyboardInterrupt:
        return 0
    finally:
        r.close()


def agent_table(title: str, columns: tuple[str, ...], agent_width: int, first: str = "agent"):
    """A borderless rich Table with a first column (`agent`, cut at agent_width) and right-aligned
    values, as `farm status` and `farm collect` print them within 80 columns."""
    from rich.table import Table

    t = Table(title=title or None, title_justify="left", pad_edge=False, box=None)
    t.add_column(first, justify="left", no_wrap=True, overflow="ellipsis", max_width=agent_width)
    for col in columns:
        t.add_column(col, justify="right", no_wrap=True, overflow="ellipsis")
    return t
