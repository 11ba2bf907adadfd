"""Sparklines as inline SVG geometry (pure): the runs list draws one per run without Plotly."""

from __future__ import annotations

import math
from collections.abc import Sequence


def sparkline_path(
    steps: Sequence[float], values: Sequence[float], *, width: int = 120, height: int = 28,
    pad: float = 2.0,
) -> str:
    """An SVG path (``d`` attribute) through the finite points, scaled to ``width × height``.

    The y-range is the 2nd–98th percentile of the values, so one early huge loss does not
    flatten the trend; points outside it are clamped to the edges. Non-finite values break the
    line. Returns ``""`` when fewer than two points are finite. The output holds only numbers
    and the letters M and L.
    """
    points = [(float(s), float(v)) for s, v in zip(steps, values, strict=False)
              if math.isfinite(s) and math.isfinite(v)]
    if len(points) < 2:
        return ""
    xs = [p[0] for p in points]
    ys = sorted(p[1] for p in points)
    lo = ys[int(0.02 * (len(ys) - 1))]
    hi = ys[int(math.ceil(0.98 * (len(ys) - 1)))]
    x0, x1 = min(xs), max(xs)
    span_x = (x1 - x0) or 1.0
    span_y = (hi - lo) or 1.0
    parts = []
    pen_down = False
    for s, v in zip(steps, values, strict=False):
        if not (math.isfinite(s) and math.isfinite(v)):
            pen_down = False
            continue
        x = pad + (float(s) - x0) / span_x * (width - 2 * pad)
        clamped = min(max(float(v), lo), hi)
        y = pad + (1.0 - (clamped - lo) / span_y) * (height - 2 * pad)
        parts.append(f"{'L' if pen_down else 'M'}{x:.1f} {y:.1f}")
        pen_down = True
    return " ".join(parts)
