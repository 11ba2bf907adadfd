"""Number formatting shared by figures, page summaries and templates (pure)."""

from __future__ import annotations

import html
import math
from datetime import UTC, datetime


def esc(text: object) -> str:
    """Escape user-supplied text for Plotly's pseudo-HTML (titles, names, hover text).

    Plotly renders a subset of HTML tags in text; run names, keys and alert summaries must show
    as typed, so ``&``, ``<`` and ``>`` become entities (Plotly displays them as characters).
    """
    return html.escape(str(text), quote=False)


def loss(value: float | None, digits: int = 4) -> str:
    """A loss with ``digits`` significant digits (``—`` when missing, ``NaN``/``∞`` as such)."""
    if value is None:
        return "—"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "∞" if value > 0 else "−∞"
    return f"{value:.{digits}g}"


def interval(lo: float | None, hi: float | None, digits: int = 4) -> str:
    """``[lo, hi]`` (an open end shows as ``…``)."""

    def end(x: float | None, open_text: str) -> str:
        return open_text if x is None or not math.isfinite(x) else f"{x:.{digits}g}"

    return f"[{end(lo, '…')}, {end(hi, '…')}]"


def step(value: float | None) -> str:
    """A step count with thousands separators (``12,345``)."""
    if value is None or not math.isfinite(value):
        return "—"
    return f"{round(value):,}"


def chance(p: float | None) -> str:
    """A probability as a percentage with one decimal (``—`` when unknown). Below 0.05% and
    above 99.95% it reads ``<0.1%`` and ``>99.9%``: a chance estimated by sampling a calibrated
    forecast never shows as certain."""
    if p is None or not math.isfinite(p):
        return "—"
    if p < 0.0005:
        return "<0.1%"
    if p > 0.9995:
        return ">99.9%"
    return f"{100.0 * p:.1f}%"


def short_step(value: float | None) -> str:
    """A step count in short form: ``950``, ``12k``, ``1.5M``."""
    if value is None or not math.isfinite(value):
        return "—"
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{round(value)}"


def duration(seconds: float | None) -> str:
    """A duration for people: ``45 s``, ``12 min``, ``3 h 20 min``, ``2 d 4 h``."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = seconds / 60
    if minutes < 90:
        return f"{minutes:.0f} min"
    hours, minutes = divmod(round(minutes), 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def _parse_time(when: datetime | str) -> datetime | None:
    """A timestamp (ISO 8601 text or datetime) as an aware datetime; None if unreadable."""
    if isinstance(when, str):
        try:
            when = datetime.fromisoformat(when.replace("Z", "+00:00"))
        except ValueError:
            return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def when(value: datetime | str | None) -> str:
    """A moment for people, in UTC to the second: ``2026-11-28 13:53:10 UTC`` (the scripts'
    ``cc.fmtTime`` writes the same)."""
    if value is None:
        return "—"
    moment = _parse_time(value)
    if moment is None:
        return str(value)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def ago(when: datetime | str | None, now: datetime | None = None) -> str:
    """How long ago ``when`` was (``3 min ago``)."""
    if when is None:
        return "—"
    if isinstance(when, str):
        try:
            when = datetime.fromisoformat(when.replace("Z", "+00:00"))
        except ValueError:
            return str(when)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    now = now or datetime.now(UTC)
    return duration((now - when).total_seconds()) + " ago"
