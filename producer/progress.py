"""The live progress bar of `farm collect`: per agent, completed/total, rate, ETA, failures, reward."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class Live:
    """What the progress bar shows, per agent."""

    done: int = 0
    failed: int = 0
    reward_sum: float = 0.0
    rewarded: int = 0
    cancelled: int = 0  # by a client (`farm cancel`): not the model failing, so not under `failed`


def per_second(n: float, elapsed: float) -> str:
    """A rate for people, to two significant digits below 10/s: an LLM run's 0.8/s is not "0/s",
    and its first minute's 0.036/s is not "0.0/s"."""
    rate = n / max(elapsed, 1e-9)
    if rate >= 10:
        return f"{rate:,.0f}/s"
    return f"{rate:.1f}/s" if rate >= 1 else f"{rate:.2g}/s" if rate > 0 else "0/s"


def _line(name: str, v: Live, done: int, total: int, elapsed: float) -> str:
    reward = f"{v.reward_sum / v.rewarded:.3f}" if v.rewarded else "-"
    rate = per_second(v.done, elapsed)
    cancelled = f"  cancelled {v.cancelled:,}" if v.cancelled else ""
    return f"{name[:18]:<18} {done:>7,}/{total:<7,} {rate:>8}  failed {v.failed:>5,}  reward {reward}{cancelled}"


@contextmanager
def live_progress(enabled: bool, totals: dict[str, int], already: dict[str, int], *, every_s: float = 5.0, stream=None):
    """Per agent (and all): completed/total, rate, ETA, failures, mean reward.

    On a terminal, a live bar that fits 80 columns; elsewhere (CI logs, `| tee`), one plain line
    per agent every `every_s` seconds and at the end, so a log shows progress as it happens."""
    if not enabled:
        yield lambda live: None
        return
    import sys

    from rich.console import Console

    stream = stream or sys.stderr
    console = Console(file=stream, width=min(80, Console(file=stream).width))
    start = time.monotonic()
    agents = sorted(totals)

    def rows(live: dict[str, Live]) -> list[tuple[str, Live, int, int]]:
        out = [(a, live[a], live[a].done + already.get(a, 0), totals[a]) for a in agents]
        if len(agents) > 1:
            v = Live(
                sum(x.done for x in live.values()),
                sum(x.failed for x in live.values()),
                sum(x.reward_sum for x in live.values()),
                sum(x.rewarded for x in live.values()),
                sum(x.cancelled for x in live.values()),
            )
            out.append(("all", v, v.done + sum(already.values()), sum(totals.values())))
        return out

    if not console.is_terminal:
        last = [0.0]
        latest: dict[str, Live] = {}

        def update(live: dict[str, Live]) -> None:
            latest.update(live)
            now = time.monotonic()
            if now - last[0] >= every_s:
                last[0] = now
                for name, v, done, total in rows({a: latest.get(a, Live()) for a in agents}):
                    print("progress " + _line(name, v, done, total, max(1e-9, now - start)), file=stream, flush=True)

        try:
            yield update
        finally:
            last[0] = 0.0
            update(latest)
        return

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(
        TextColumn("{task.description:<12.12}"),
        BarColumn(bar_width=12),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:>7}"),
        TimeRemainingColumn(compact=True),
        TextColumn("fail {task.fields[failed]:>4} r {task.fields[reward]}"),
        console=console,
        refresh_per_second=5,
    )
    ids = {
        name: bar.add_task(name, total=total, completed=done, rate="", failed=0, reward="-")
        for name, _v, done, total in rows({a: Live() for a in agents})
    }

    def update(live: dict[str, Live]) -> None:
        elapsed = max(1e-9, time.monotonic() - start)
        for name, v, done, _total in rows({a: live.get(a, Live()) for a in agents}):
            bar.update(
                ids[name],
                completed=done,
                rate=per_second(v.done, elapsed),
                failed=v.failed,
                reward=f"{v.reward_sum / v.rewarded:.2f}" if v.rewarded else "-",
            )

    with bar:
        yield update
