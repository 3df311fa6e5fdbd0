"""Small SVG line charts, drawn on the server (no JavaScript library, nothing from a CDN).

Every label is escaped here, since the SVG goes into the page as markup.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from markupsafe import Markup, escape

COLOURS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563")
W, H, PAD = 560, 160, 34


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def line_chart(title: str, minutes: Sequence[int], lines: dict[str, Sequence[Optional[float]]]) -> Markup:
    """One chart: a polyline per named series over the minutes (None: no data that minute)."""
    values = [v for series in lines.values() for v in series if v is not None and math.isfinite(v)]
    top = max(values) if values else 1.0
    top = top if top > 0 else 1.0
    n = max(len(minutes) - 1, 1)
    parts = [
        f'<svg class="chart" viewBox="0 0 {W} {H + 28}" role="img" aria-label="{escape(title)}">',
        f'<text x="{PAD}" y="12" class="chart-title">{escape(title)}</text>',
        f'<line x1="{PAD}" y1="{H}" x2="{W - 4}" y2="{H}" class="axis"/>',
        f'<text x="2" y="24" class="tick">{escape(_fmt(top))}</text>',
        f'<text x="2" y="{H}" class="tick">0</text>',
    ]
    for i, (name, series) in enumerate(lines.items()):
        colour = COLOURS[i % len(COLOURS)]
        points = [
            f"{PAD + (W - PAD - 4) * j / n:.1f},{H - (H - 20) * (v / top):.1f}"
            for j, v in enumerate(series)
            if v is not None and math.isfinite(v)
        ]
        if points:
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{" ".join(points)}"/>')
        parts.append(f'<text x="{PAD + 110 * i}" y="{H + 20}" class="legend" fill="{colour}">{escape(name)}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))
