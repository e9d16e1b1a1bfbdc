"""Line charts as inline SVG, drawn on the server.

Why not a JavaScript chart library: the page must work offline, under a Content-Security-
Policy that runs no script at all (an answer holding script must never run), and stay light;
a server-drawn SVG needs none of that and is as fresh as the page (which reloads itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

WIDTH, HEIGHT, PAD = 480, 160, 36


def _number(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:.1f}"
    return f"{value:.4g}"


def line_chart(title: str, values: Sequence[float], span_s: float, unit: str = "") -> str:
    """One series as an SVG polyline with its axes; ``span_s`` labels the time axis."""
    label = escape(title)
    if not values:
        return (
            f'<figure class="chart"><figcaption>{label}</figcaption>'
            '<p class="muted">no data yet</p></figure>'
        )
    top = max(max(values), 1e-12)
    inner_w, inner_h = WIDTH - 2 * PAD, HEIGHT - 2 * PAD
    step = inner_w / max(len(values) - 1, 1)
    points = " ".join(
        f"{PAD + i * step:.1f},{PAD + inner_h - (v / top) * inner_h:.1f}"
        for i, v in enumerate(values)
    )
    peak = escape(f"{unit}{_number(top)}")
    return (
        f'<figure class="chart"><figcaption>{label}</figcaption>'
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'role="img" aria-label="{label}" data-points="{len(values)}">'
        f'<line x1="{PAD}" y1="{PAD + inner_h}" x2="{PAD + inner_w}" y2="{PAD + inner_h}" '
        'class="axis"/>'
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{PAD + inner_h}" class="axis"/>'
        f'<text x="{PAD + 4}" y="{PAD - 6}" class="tick">{peak}</text>'
        f'<text x="{PAD}" y="{HEIGHT - 8}" class="tick">0</text>'
        f'<text x="{PAD + inner_w}" y="{HEIGHT - 8}" class="tick end">'
        f"{escape(_duration(span_s))}</text>"
        f'<polyline class="series" points="{points}"/></svg></figure>'
    )


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"
