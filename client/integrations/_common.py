"""Helpers shared by the framework integrations (no framework imports here)."""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

from curvecast.client._validate import sanitize_key


def is_scalar(value: Any) -> bool:
    """A number or a one-element tensor (read later, without a sync)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, numbers.Real):
        return True
    numel = getattr(value, "numel", None)
    return callable(numel) and numel() == 1 and not value.is_complex()


def scalar_metrics(
    items: Iterable[tuple[str, Any]], rename: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Keep the scalar values, with names made valid (``rename`` maps whole names first)."""
    out: dict[str, Any] = {}
    for key, value in items:
        if is_scalar(value):
            # Frameworks hand over (1,)-shaped tensors too; Monitor.log takes 0-d ones only
            # (reshape is a view: no copy, no device sync).
            if getattr(value, "ndim", 0):
                value = value.reshape(())
            out[sanitize_key((rename or {}).get(key, key))] = value
    return out


def json_safe(config: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON-representable part of a hyper-parameter dict (others become their ``str``)."""

    def convert(value: Any) -> Any:
        if isinstance(value, bool | str) or value is None:
            return value
        if isinstance(value, numbers.Integral):
            return int(value)
        if isinstance(value, numbers.Real):
            number = float(value)
            return number if math.isfinite(number) else str(number)
        if isinstance(value, Mapping):
            return {str(k): convert(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [convert(v) for v in value]
        return str(value)

    out = {str(k): convert(v) for k, v in config.items()}
    json.dumps(out)  # guaranteed by construction; fail loudly here if not
    return out


def unwrap_optimizer(optimizer: Any) -> Any:
    """The innermost optimizer of wrappers (accelerate's ``AcceleratedOptimizer``,
    Lightning's ``LightningOptimizer``) whose ``step`` calls the inner one's."""
    seen = 0
    while seen < 10 and hasattr(optimizer, "optimizer") and hasattr(optimizer.optimizer, "step"):
        optimizer = optimizer.optimizer
        seen += 1
    return optimizer


def is_schedule_free(optimizer: Any) -> bool:
    """Whether the optimizer switches between y (training) and x (evaluation) points."""
    return callable(getattr(optimizer, "eval", None)) and hasattr(optimizer, "train_mode")
