"""SVG charts of per-minute series, drawn on the server (no JavaScript library, nothing from a CDN).

A chart has a time axis (HH:MM in UTC, a few ticks on round minutes), a y axis with its scale
and grid lines, a line per series broken where a minute has no value, and a dot on each point
when the window holds few minutes or a point stands alone, so one minute of data is drawn. Each
minute is a column whose <title> holds that minute's values: the browser shows it on hover,
with no script (the page's Content-Security-Policy runs none inline). Every label and title is
escaped here, since the SVG goes into the page as markup; the styles are in static/charts.css.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Optional, Sequence

from markupsafe import Markup, escape

COLOURS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563")
W = 560
LEFT, RIGHT, TOP, BOTTOM = 48, W - 24, 26, 150  # the plot area in the viewBox
DOTS_UP_TO = 60  # with up to this many minutes shown every point gets a dot, past it a lone one only
X_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440)  # minutes between time ticks
X_TICKS = 6  # at most this many time ticks
LEGEND_CHARS = 40  # a longer series name is cut in the legend (the hover title has it whole)


def _fmt(v: float) -> str:
    """A value as a person reads it: 0, 0.25, 16, 1,234, 12.5k, 3.2M."""
    if v == 0:
        return "0"
    if abs(v) >= 1e6:
        return f"{v / 1e6:.3g}M"
    if abs(v) >= 1e4:
        return f"{v / 1e3:.3g}k"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def clock(minute: int) -> str:
    """An epoch minute as HH:MM in UTC."""
    return time.strftime("%H:%M", time.gmtime(minute * 60))


def _nice(raw: float) -> float:
    """The round step (1, 2, 2.5 or 5 times a power of ten) at or above raw."""
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if raw <= m * mag * (1 + 1e-9))


def y_scale(values: Sequence[float], ticks: int = 4) -> tuple[float, float, list[float]]:
    """The y axis for these values: its bottom and top (round numbers, 0 included) and its ticks;
    whole numbers get whole steps."""
    lo, hi = min([0.0, *values]), max([0.0, *values])
    if hi == lo:
        hi = lo + 1.0
    step = _nice((hi - lo) / ticks)
    if all(float(v).is_integer() for v in values):
        step = max(step, 1.0)
    lo, hi = math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step
    return lo, hi, [lo + i * step for i in range(round((hi - lo) / step) + 1)]


def x_ticks(first: int, n: int) -> list[int]:
    """The minutes (boundaries, first to first + n) that get a time label: at most X_TICKS, on round minutes."""
    step = next((s for s in X_STEPS if n / s <= X_TICKS), X_STEPS[-1])
    start = -(-first // step) * step
    return list(range(start, first + n + 1, step))


def _legend(names: Sequence[str]) -> tuple[list[tuple[str, float, float]], float]:
    """Where each name goes below the time axis (wrapping onto more rows), and the chart's height."""
    out: list[tuple[str, float, float]] = []
    x, row = float(LEFT), 0
    for name in names:
        shown = name if len(name) <= LEGEND_CHARS else name[: LEGEND_CHARS - 1] + "…"
        width = 30 + 8 * len(shown)  # room for the larger text of a narrow screen (charts.css)
        if x + width > W and x > LEFT:
            x, row = float(LEFT), row + 1
        out.append((shown, x, BOTTOM + 36 + 15 * row))
        x += width
    return out, BOTTOM + 28 + (15 * (row + 1) if names else 0)


def _runs(points: list[Optional[tuple[float, float]]]) -> list[list[tuple[float, float]]]:
    """The stretches of consecutive points with a value (a line is broken where a minute has none)."""
    runs: list[list[tuple[float, float]]] = [[]]
    for p in points:
        if p is None:
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append(p)
    return [r for r in runs if r]


def _shown(v: Optional[float]) -> str:
    return _fmt(v) if v is not None and math.isfinite(v) else "-"


def _hover(
    minute: int, now_minute: Optional[int], lines: dict[str, Sequence[Optional[float]]], j: int, label: str
) -> str:
    """A minute's hover title: its time (or other x label), then each series' value ('-': none that minute)."""
    head = label + (" (so far)" if minute == now_minute else "")
    rows = [f"{name}: {_shown(s[j] if j < len(s) else None)}" for name, s in lines.items()]
    return "\n".join([head, *rows])


def line_chart(
    title: str,
    minutes: Sequence[int],
    lines: dict[str, Sequence[Optional[float]]],
    *,
    now_minute: Optional[int] = None,
    empty: str = "no data in this window",
    x_label: Optional[Callable[[int], str]] = None,
    x_unit: str = "per minute, UTC",
) -> Markup:
    """One chart: a line per named series over consecutive epoch minutes (None: no value that minute).
    `now_minute`, the minute still going on, is marked "so far" in its hover title. Another whole
    number on x (a policy version) takes its own `x_label` and `x_unit`."""
    label = x_label or (lambda m: f"{clock(m)} UTC")
    tick = x_label or clock
    minutes = list(minutes)
    first = minutes[0] if minutes else 0
    n = minutes[-1] - first + 1 if minutes else 1
    values = [float(v) for s in lines.values() for v in s if v is not None and math.isfinite(v)]
    lo, hi, yticks = y_scale(values)
    slot = (RIGHT - LEFT) / n

    def x(m: int) -> float:
        return LEFT + (m - first + 0.5) * slot

    def y(v: float) -> float:
        return BOTTOM - (BOTTOM - TOP) * (v - lo) / (hi - lo)

    legend, height = _legend(list(lines))
    parts = [
        f'<svg class="chart" viewBox="0 0 {W} {height:.0f}" role="img" aria-label="{escape(title)}"'
        f' data-chart="{escape(title)}" xmlns="http://www.w3.org/2000/svg">',
        f'<text x="{LEFT}" y="14" class="chart-title">{escape(title)}</text>',
        f'<text x="{RIGHT}" y="14" class="tick" text-anchor="end">{escape(x_unit)}</text>',
    ]
    for t in yticks:
        parts.append(f'<line x1="{LEFT}" y1="{y(t):.1f}" x2="{RIGHT}" y2="{y(t):.1f}" class="grid"/>')
        parts.append(f'<text x="{LEFT - 5}" y="{y(t) + 3.5:.1f}" class="tick y" text-anchor="end">{_fmt(t)}</text>')
    parts.append(f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{BOTTOM}" class="axis"/>')
    parts.append(f'<line x1="{LEFT}" y1="{BOTTOM}" x2="{RIGHT}" y2="{BOTTOM}" class="axis"/>')
    # Minutes are spans (a tick on the boundary where one starts); other x values are points (a tick under each).
    marks = x_ticks(first, n) if x_label is None else [b for b in x_ticks(first, n) if b < first + n]
    for b in marks:
        bx = LEFT + (b - first + (0.5 if x_label is not None else 0.0)) * slot
        parts.append(f'<line x1="{bx:.1f}" y1="{BOTTOM}" x2="{bx:.1f}" y2="{BOTTOM + 4}" class="axis"/>')
        label_x = escape(tick(b))
        parts.append(f'<text x="{bx:.1f}" y="{BOTTOM + 16}" class="tick x" text-anchor="middle">{label_x}</text>')
    for i, (name, series) in enumerate(lines.items()):
        colour = COLOURS[i % len(COLOURS)]
        points = [(x(m), y(v)) if v is not None and math.isfinite(v) else None for m, v in zip(minutes, series)]
        for run in _runs(points):
            if len(run) > 1:
                coords = " ".join(f"{px:.1f},{py:.1f}" for px, py in run)
                parts.append(f'<polyline class="line" fill="none" stroke="{colour}" points="{coords}"/>')
            if len(run) == 1 or n <= DOTS_UP_TO:
                dot = f'r="{4 if len(run) == 1 else 2.5}" fill="{colour}" data-series="{escape(name)}"'
                parts += [f'<circle class="dot" cx="{px:.1f}" cy="{py:.1f}" {dot}/>' for px, py in run]
    if not values:
        parts.append(
            f'<text x="{(LEFT + RIGHT) / 2:.0f}" y="{(TOP + BOTTOM) / 2:.0f}" class="empty"'
            f' text-anchor="middle">{escape(empty)}</text>'
        )
    for j, m in enumerate(minutes):
        parts.append(
            f'<rect class="hover" fill="transparent" x="{LEFT + (m - first) * slot:.1f}" y="{TOP}"'
            f' width="{slot:.2f}" height="{BOTTOM - TOP}">'
            f"<title>{escape(_hover(m, now_minute, lines, j, label(m)))}</title></rect>"
        )
    for i, (shown, lx, ly) in enumerate(legend):
        colour = COLOURS[i % len(COLOURS)]
        parts.append(f'<rect x="{lx:.1f}" y="{ly - 7}" width="12" height="4" fill="{colour}"/>')
        parts.append(f'<text x="{lx + 16:.1f}" y="{ly}" class="legend" fill="{colour}">{escape(shown)}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))
