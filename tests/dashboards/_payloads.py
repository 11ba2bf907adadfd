"""What the figure and view tests feed the builders: series, a forecast and a band shaped like
the REST API's answers, and the figure's traces by role."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import plotly.graph_objects as go


def downsampled(key: str, n_buckets: int = 50, spike_at: int | None = 20) -> dict[str, Any]:
    """A downsampled ``SeriesOut`` as the metrics API returns it."""
    steps = np.linspace(100, 10_000, n_buckets).round().astype(int)
    values = 60 / np.sqrt(steps + 300.0) + 2.0
    vmax = values + 0.05
    if spike_at is not None:
        vmax[spike_at] = 9.5  # a one-step spike inside a bucket
    return {"key": key, "total_points": 10_000, "downsampled": True, "steps": steps.tolist(),
            "values": values.tolist(), "min": (values - 0.05).tolist(), "max": vmax.tolist(),
            "count": [200] * n_buckets}


def raw(key: str, steps: list[int], values: list[Any]) -> dict[str, Any]:
    return {"key": key, "total_points": len(steps), "downsampled": False, "steps": steps,
            "values": values}


FORECAST = {
    "status": "ok", "n_points": 10_000, "fitted_upto_step": 10_000.0, "a": 60.0, "b": 300.0,
    "c": 2.0, "f_star": {"value": 2.0, "lo": 1.95, "hi": 2.05},
    "prediction": {"step": 20_000, "value": 2.42, "lo": 2.38, "hi": 2.47}, "target": None,
    "key": "loss", "fitted_at": "2026-01-01T00:00:00Z", "confidence": 0.9, "off_model": False,
    "message": "",
}
BAND = [{"step": s, "value": 60 / math.sqrt(s + 300) + 2, "lo": 60 / math.sqrt(s + 300) + 1.97,
         "hi": 60 / math.sqrt(s + 300) + 2.04} for s in (10_000, 12_000, 15_000, 20_000)]
CONFIG = {"total_steps": 20_000, "warmup_steps": 200, "c_warmup": 400, "weight_decay": 5.0}


def by_role(fig: go.Figure) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for trace in fig.data:
        meta = trace.meta or {}
        out.setdefault(meta.get("role", "?"), []).append(trace)
    return out
