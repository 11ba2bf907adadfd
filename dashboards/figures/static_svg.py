"""A figure as a static SVG (pure): the run page's first chart, drawn by the server into the HTML
so that it shows at first paint, before plotly.js (1.2 MB of JavaScript on a first visit) has
loaded; the interactive chart replaces it in the same box.

It draws what a figure of this package holds (a :class:`FigureSpec`): line traces and
``tonexty`` bands on the primary axes, the axis ranges the figure chose (``layout.xaxis.range``
/ ``yaxis.range``, else the data's), the title; with ticks and labels, and nothing interactive.
Every string is escaped; numbers are formatted, never interpolated raw.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from html import escape
from typing import Any

import numpy as np

from curvecast.dashboards.figures.spec import FigureSpec

__all__ = ["static_svg"]

_MARGIN = {"l": 64, "r": 16, "t": 40, "b": 40}
#: At most this many points per trace: about one per pixel column of the plot.
_MAX_POINTS = 1200


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values (1, 2 or 5 × 10^k apart) inside ``[lo, hi]``."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _label(v: float) -> str:
    if v == int(v) and abs(v) < 1e12:  # steps, round losses: 20,000 rather than 2e+04
        return f"{int(v):,}"
    return f"{v:.4g}"


def _arrays(trace: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    def floats(values: Any) -> np.ndarray:
        if values is None:
            return np.zeros(0)
        if isinstance(values, np.ndarray) and values.dtype.kind in "fiu":
            return values.astype(float)
        return np.array([np.nan if v is None else float(v) for v in values], dtype=float)

    return floats(trace.get("x")), floats(trace.get("y"))


def _thin(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if x.size <= _MAX_POINTS:
        return x, y
    keep = np.linspace(0, x.size - 1, _MAX_POINTS).astype(int)
    return x[keep], y[keep]


def _range(axis: dict[str, Any], values: Sequence[np.ndarray], clip_percentile: bool
           ) -> tuple[float, float]:
    given = axis.get("range")
    if given is not None and len(given) == 2 and axis.get("type") != "log":
        return float(given[0]), float(given[1])
    finite = np.concatenate([v[np.isfinite(v)] for v in values]) if values else np.zeros(0)
    if finite.size == 0:
        return 0.0, 1.0
    if clip_percentile:  # one early huge loss must not flatten the curve
        lo, hi = (float(q) for q in np.percentile(finite, [1, 99]))
    else:
        lo, hi = float(finite.min()), float(finite.max())
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    pad = 0.04 * (hi - lo)
    return lo - pad, hi + pad


def _path(px: np.ndarray, py: np.ndarray) -> str:
    parts: list[str] = []
    pen = False
    for a, b in zip(px.tolist(), py.tolist(), strict=True):
        if not (math.isfinite(a) and math.isfinite(b)):
            pen = False
            continue
        parts.append(f"{'L' if pen else 'M'}{a:.1f} {b:.1f}")
        pen = True
    return " ".join(parts)


def static_svg(fig: FigureSpec, *, width: int = 1100, height: int = 420,
               caption: str = "static preview; the interactive chart is loading") -> str:
    """The figure's primary-axis traces as one ``<svg>`` element (a string), with axes, ticks,
    title and ``caption``."""
    traces = [t for t in fig.data if t.get("yaxis") in (None, "y")
              and t.get("x") is not None and t.get("y") is not None]
    arrays = [_thin(*_arrays(t)) for t in traces]
    layout = fig.layout
    x0, x1 = _range(layout.get("xaxis") or {}, [a[0] for a in arrays], clip_percentile=False)
    lines = [a[1] for t, a in zip(traces, arrays, strict=True)
             if ((t.get("line") or {}).get("width") or 1) > 0]
    y0, y1 = _range(layout.get("yaxis") or {}, lines or [a[1] for a in arrays],
                    clip_percentile=True)
    left, right = _MARGIN["l"], width - _MARGIN["r"]
    top, bottom = _MARGIN["t"], height - _MARGIN["b"]

    def sx(v: np.ndarray) -> np.ndarray:
        scaled: np.ndarray = left + (v - x0) / ((x1 - x0) or 1.0) * (right - left)
        return scaled

    def sy(v: np.ndarray) -> np.ndarray:
        share = (np.clip(v, y0, y1) - y0) / ((y1 - y0) or 1.0)
        scaled: np.ndarray = bottom - share * (bottom - top)
        return scaled

    out = [
        f'<svg class="static-preview" role="img" '
        f'viewBox="0 0 {width} {height}" preserveAspectRatio="none" '
        f'aria-label="{escape(caption)}">',
        f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" '
        'fill="none" stroke="#d0d4da"/>',
    ]
    for v in _nice_ticks(y0, y1):
        ty = float(sy(np.array([v]))[0])
        out.append(f'<line x1="{left}" x2="{right}" y1="{ty:.1f}" y2="{ty:.1f}" '
                   f'stroke="#eef0f3"/><text x="{left - 6}" y="{ty + 4:.1f}" text-anchor="end" '
                   f'font-size="11" fill="#555">{escape(_label(v))}</text>')
    for v in _nice_ticks(x0, x1):
        tx = float(sx(np.array([v]))[0])
        out.append(f'<text x="{tx:.1f}" y="{bottom + 16}" text-anchor="middle" font-size="11" '
                   f'fill="#555">{escape(_label(v))}</text>')
    previous: tuple[np.ndarray, np.ndarray] | None = None
    for trace, (x, y) in zip(traces, arrays, strict=True):
        px, py = sx(x), sy(y)
        line = trace.get("line") or {}
        colour = escape(str(line.get("color") or "#1f77b4"))
        if trace.get("fill") == "tonexty" and previous is not None:
            ok = np.isfinite(px) & np.isfinite(py)
            bx, by = previous
            ok_b = np.isfinite(bx) & np.isfinite(by)
            ring = _path(np.concatenate([px[ok], bx[ok_b][::-1]]),
                         np.concatenate([py[ok], by[ok_b][::-1]]))
            fill = escape(str(trace.get("fillcolor") or "rgba(31,119,180,0.2)"))
            if ring:
                out.append(f'<path d="{ring} Z" fill="{fill}" stroke="none"/>')
        width_px = line["width"] if line.get("width") is not None else 1.5
        if width_px > 0:
            d = _path(px, py)
            if d:
                out.append(f'<path d="{d}" fill="none" stroke="{colour}" '
                           f'stroke-width="{float(width_px):.1f}"/>')
        previous = (px, py)
    title = layout.get("title") or ""
    if isinstance(title, dict):
        title = title.get("text") or ""
    title = " ".join(re.sub(r"<[^>]+>", " ", str(title)).split())  # Plotly's markup, dropped
    out.append(f'<text x="{left}" y="22" font-size="14" fill="#222">{escape(title)}</text>')
    out.append(f'<text x="{right}" y="22" text-anchor="end" font-size="11" '
               f'fill="#888">{escape(caption)}</text>')
    out.append("</svg>")
    return "".join(out)
