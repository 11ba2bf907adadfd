"""Deprecated alias of :mod:`curvecast.integrations.optuna`, where ``CurvecastPruner`` moved in
0.3.0 (the import path it was asked for); this alias goes in 0.4.0."""

from __future__ import annotations

import warnings

from curvecast.integrations.optuna import (
    DEFAULT_MIN_PROGRESS,
    DEFAULT_THRESHOLD,
    CurvecastPruner,
    PruneDecision,
    decide,
)

__all__ = [
    "DEFAULT_MIN_PROGRESS", "DEFAULT_THRESHOLD", "CurvecastPruner", "PruneDecision", "decide",
]

warnings.warn("curvecast.service.integrations.optuna has moved to curvecast.integrations.optuna;"
              " import CurvecastPruner from there (this alias goes in curvecast 0.4.0)",
              DeprecationWarning, stacklevel=2)
