"""`farm status`: what every agent's queue, runs and workers look like right now, read from Redis.

Per agent: `queued` is what no worker has taken yet (the runs' queues and the stream's lag,
farm.state.QueueState.waiting), then `pending` (in flight: delivered to a worker, not yet settled;
`in_flight` in --json as on the dashboard), `lag` (in the stream, not yet read by a worker: the
group's lag, or what the stream's length and pending imply before a worker read it, as the
dashboard and /metrics count it), `delayed`, `dead` and the settle counts; per
run with tasks queued or in flight, its share, cap, queued, in flight and rollouts done per minute
over the last one to two minutes (the last full minute's history bucket and the current one's);
per judge (`judges:`) its calls per second, failures, latency and cache hits (farm/judge_stats.py);
and per agent whose workers run sandboxes (`sandboxes`, only when one does) those starting and
running, started, failed to start, rollouts failed for want of one, and start latency p50/p99
(farm/sandbox_stats.py: sums over the live workers, so the counts fall when a worker goes).
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import asdict
from typing import Any, Optional

import redis

from farm import history, judge_stats, sandbox_stats, state
from farm.keys import Keys

# The stats-hash counts `farm status` shows per agent, in its columns' order: how tasks ended
# (a cancelled task is neither done nor failed: a client called it off) and attempts retried.
SETTLED = ("done", "failed", "cancelled", "retried")


def collect_status(r: redis.Redis, keys: Keys, now: Optional[float] = None) -> dict:
    """Per agent its queue (farm.state.QueueState's fields, `queued` its waiting tasks) with its runs,
    each with its rates from the history; the live workers, the judges, and the sandboxes per agent."""
    now = time.time() if now is None else now
    minutes, span = history.window(now, history.RUN_WINDOW_MINUTES)
    agents = {}
    for agent in state.agents(r, keys):
        q = state.queue(r, keys, agent)
        rates = history.run_rates(history.merge(history.buckets(r, keys, agent, minutes)), span)
        agents[agent] = {
            **asdict(q),
            "queued": q.waiting,
            "in_flight": q.pending,
            "lag": q.unread,  # the dashboard's lag: never None, so queued == backlog + lag always
            "runs": [{**asdict(run), **history.run_rate(rates, run.run_id)} for run in q.runs],
        }
    live = state.live_workers(r, keys)
    return {
        "agents": agents,
        "workers": live.listing(),
        "judges": judge_stats.summary(r, keys, now),
        "sandboxes": sandbox_stats.by_agent(live.beats),
    }


def _n(value: Any) -> str:
    """A count as text: 0 stays 0 (a blank reads as 'unknown'); None (no group yet) is '-'."""
    return "-" if value is None else f"{int(value):,}"


def render_status(status: dict, *, where: str = "", console=None) -> None:
    """Tables that fit 80 columns: per agent, each agent's runs, then live workers (ids shortened to fit)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    if where:
        console.print(where, highlight=False, soft_wrap=True)
    t = agent_table("agents", ("queued", "pending", "lag", "delayed", "dead", *SETTLED), 16)
    t.collapse_padding = True  # one space between columns: ten of them fit 80 columns
    for agent, row in status["agents"].items():
        c = row["counters"]
        t.add_row(
            agent,
            _n(row["queued"]),
            _n(row["pending"]),
            _n(row["lag"]),
            _n(row["delayed"]),
            _n(row["dead"]),
            *(_n(c.get(k, 0)) for k in SETTLED),
        )
    if not status["agents"]:
        t.add_row("(none yet)", *["0"] * (5 + len(SETTLED)))
    console.print(t)
    for agent, row in status["agents"].items():
        if row["runs"]:
            console.print(run_table(agent, row["runs"]))
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
            Text(str(info.get("worker_id", "?"))),  # from a heartbeat: as text, never as console markup
            Text(str(info.get("agent", "?"))),
            *(_n(info.get(k, 0)) for k in ("concurrency", "inflight", "done", "failed")),
        )
    console.print(w)
    if status.get("judges"):
        console.print(judge_table(status["judges"]))
    if status.get("sandboxes"):
        console.print(sandbox_table(status["sandboxes"]))


def _s(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:,.2f}"


def sandbox_table(sandboxes: dict[str, dict]):
    """Per agent whose workers run sandboxes (farm/sandbox_stats.py): starting and running now;
    since each live worker started, sandboxes started, starts that failed (`failed`: each try) and
    rollouts failed because none started (`infra`); start latency p50 (the workers' median) and p99
    (the worst worker's)."""
    from rich.text import Text

    columns = ("starting", "running", "started", "failed", "infra", "p50 s", "p99 s")
    t = agent_table("sandboxes (failed: starts; infra: rollouts without one)", columns, 20)
    t.collapse_padding = True
    for agent, b in sandboxes.items():
        t.add_row(
            Text(agent),  # from a heartbeat: as text, never as console markup
            *(_n(b[k]) for k in sandbox_stats.COUNTS),
            _s(b["start_p50_s"]),
            _s(b["start_p99_s"]),
        )
    return t


def judge_table(judges: dict[str, dict]):
    """Per judge (farm/judge_stats.py): calls per second and failures per minute over the last
    minutes, mean and p99 latency (p99: a histogram bucket's upper edge), and totals."""
    from rich.text import Text

    t = agent_table("judges", ("calls/s", "fail/min", "mean s", "p99 s", "calls", "failed", "cached"), 20, "judge")
    t.collapse_padding = True
    for name, j in judges.items():
        mean, p99 = j["latency_mean_s"], j["latency_p99_s"]
        t.add_row(
            Text(name),
            f"{j['calls_per_s']:,.2f}",
            f"{j['failed_per_min']:,.1f}",
            "-" if mean is None else f"{mean:.3f}",
            "-" if p99 is None else ("inf" if p99 == float("inf") else f"{p99:g}"),
            _n(j["calls"]),
            _n(j["failed"]),
            _n(j["cache_hits"]),
        )
    return t


def run_table(agent: str, runs: list[dict]):
    """One agent's runs: share, cap (- for none), queued, in flight, rollouts done per minute."""
    from rich.text import Text

    t = agent_table(f"runs on {agent}"[:78], ("share", "cap", "queued", "in flight", "done/min"), 36, first="run")
    t.collapse_padding = True
    for run in runs:
        t.add_row(
            Text(str(run["run_id"])),  # as text, never as console markup
            f"{run['share']:g}",
            _n(run["cap"]) if run["cap"] else "-",
            _n(run["queued"]),
            _n(run["in_flight"]),
            f"{run['done_per_min']:,.1f}",
        )
    return t


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
