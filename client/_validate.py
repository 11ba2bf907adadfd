"""Checks for programmer errors, raised at once in the caller's thread with a clear message.

They apply the limits of :mod:`curvecast.contract`, the same ones the service's request schema
(``curvecast.service.schemas``) enforces, so a batch the client builds is never refused for its
content: a mistake surfaces where it was made, not minutes later in a log.
These run only on slow paths (a key seen for the first time, a value that is not a plain
``float``/``int``); the hot path in ``Monitor.log`` is a dict lookup and a type check per metric.
"""

from __future__ import annotations

import json
import math
import numbers
import operator
import re
import sys
import uuid
from collections.abc import Mapping
from typing import Any

from curvecast.contract import KEY_CHARS, KEY_MAX_LENGTH, MAX_STEP, PROJECT_PATTERN, is_valid_key

_PROJECT_RE = re.compile(PROJECT_PATTERN)
_NAME_RE = re.compile(r"^[^\x00-\x1f\x7f]{1,200}$")
_INVALID_KEY_CHARS = re.compile(f"[^{KEY_CHARS}]")


def check_key(key: object) -> str:
    """A metric name, or ``ValueError``/``TypeError`` saying what is wrong with it."""
    if not isinstance(key, str):
        raise TypeError(f"metric names must be strings, got {type(key).__name__} {key!r}")
    if not is_valid_key(key):
        raise ValueError(
            f"invalid metric name {key!r}: names are 1-200 characters from A-Z a-z 0-9 _ . / - "
            f"(for example 'loss' or 'eval/loss')"
        )
    return key


def sanitize_key(key: str) -> str:
    """Turn an arbitrary label (a Trainer log name) into a valid metric name."""
    cleaned = _INVALID_KEY_CHARS.sub("_", key)[:KEY_MAX_LENGTH]
    return cleaned or "_"


def check_step(step: object) -> int:
    """A step number: an integer in ``[0, MAX_STEP]`` (``2**62``)."""
    if isinstance(step, bool) or _is_tensor(step):
        raise TypeError(
            f"step must be a Python int, got {type(step).__name__} {step!r}"
            + (" (call int() on it once per step)" if _is_tensor(step) else "")
        )
    try:
        value = operator.index(step)  # type: ignore[arg-type]  # int, numpy ints
    except TypeError:
        raise TypeError(f"step must be an int, got {type(step).__name__} {step!r}") from None
    if not 0 <= value <= MAX_STEP:
        raise ValueError(f"step must be between 0 and 2**62, got {value}")
    return value


# Types seen to be tensors, and the dtypes that are not real numbers: once filled, checking a
# tensor is a set lookup, an ndim read and a dtype lookup (no device sync). Monitor.log() reads
# both sets to check a tensor of a type seen before without calling check_value.
TENSOR_TYPES: set[type] = set()
NOT_REAL_DTYPES: set[Any] = set()
# ``torch.Tensor`` itself once seen: Monitor.log() reads such a tensor at once when it is on the
# CPU (no device to wait for). Subclasses (DTensor, tensor wrappers) are left to the background
# thread, whose read of them is the one they define.
PLAIN_TENSOR_TYPES: set[type] = set()


def _is_tensor(value: object) -> bool:
    kind = type(value)
    if kind in TENSOR_TYPES:
        return True
    torch: Any = sys.modules.get("torch")  # never import torch: a tensor implies it is loaded
    if torch is not None and isinstance(value, torch.Tensor):
        TENSOR_TYPES.add(kind)
        if kind is torch.Tensor:
            PLAIN_TENSOR_TYPES.add(kind)
        if not NOT_REAL_DTYPES:
            NOT_REAL_DTYPES.update(
                {torch.bool, torch.complex32, torch.complex64, torch.complex128}
            )
        return True
    return False


def check_value(key: str, value: object) -> Any:
    """Validate a metric value that is not a plain ``float``/``int``; returns what to store.

    A plain CPU tensor is read at once (there is no device to wait for); other tensors are
    returned as they are (detached): reading them would force a device sync, so the background
    thread does it. Other real numbers (numpy scalars, ``Fraction``) become floats.
    """
    if isinstance(value, bool) or value is None:
        raise TypeError(
            f"metric {key!r}: {value!r} is not a number; log ints, floats or 0-d tensors "
            "(use float('nan') for a missing value)"
        )
    if _is_tensor(value):
        tensor: Any = value
        # ndim, not numel(): a (1,)-shaped tensor is refused as well, as the docs say (a
        # metadata read, no device sync). One spelling of "a scalar" keeps the stored series
        # unambiguous and catches a batch of size 1 logged by mistake.
        if tensor.ndim != 0:
            hint = "t.squeeze()" if tensor.numel() == 1 else "t.mean()"
            raise ValueError(
                f"metric {key!r}: a tensor of shape {tuple(tensor.shape)} is not a scalar "
                f"(0-d) tensor; log a 0-d tensor (e.g. loss, or {hint})"
            )
        if tensor.dtype in NOT_REAL_DTYPES:
            raise TypeError(f"metric {key!r}: a {tensor.dtype} tensor is not a real number")
        if type(tensor) in PLAIN_TENSOR_TYPES and tensor.is_cpu:
            try:
                return tensor.tolist()  # a Python number; unlike float(), no requires_grad warning
            except RuntimeError:  # e.g. inside a functorch transform: read in the background
                pass
        # A tensor that still carries its autograd graph would keep activations alive until the
        # background thread reads it; detaching is cheap and needs no sync.
        return tensor.detach() if tensor.requires_grad else tensor
    if isinstance(value, numbers.Real):
        return float(value)
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy 0-d array
        return check_value(key, value.item())
    if hasattr(value, "item") and getattr(value, "size", None) == 1:  # numpy (1,) array
        raise ValueError(
            f"metric {key!r}: an array of shape {tuple(getattr(value, 'shape', ()))} is not a "
            "scalar (0-d); log a.item()"
        )
    raise TypeError(
        f"metric {key!r}: {type(value).__name__} {str(value)[:50]!r} is not a number; log ints, "
        "floats or 0-d tensors"
    )


def check_project(project: object) -> str:
    """A project name as the service accepts it."""
    if not isinstance(project, str) or not _PROJECT_RE.match(project):
        raise ValueError(
            f"invalid project {project!r}: 1-100 characters from A-Z a-z 0-9 _ . - expected"
        )
    return project


def check_run_name(name: object) -> str | None:
    """A run's display name: free text without control characters, at most 200 characters."""
    if name is None:
        return None
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(
            f"invalid run_name {name!r}: 1-200 characters without control characters expected"
        )
    return name


def check_run_id(run_id: object) -> str:
    """A run id (a UUID, or its string form) in canonical string form."""
    if isinstance(run_id, uuid.UUID):
        return str(run_id)
    try:
        return str(uuid.UUID(str(run_id)))
    except ValueError:
        raise ValueError(f"run_id must be a UUID, got {run_id!r}") from None


_INT_KEYS = {"total_steps": 1, "warmup_steps": 0, "c_warmup": 0}


def check_config(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """A run config: plain JSON with finite numbers, and the keys the service reads well typed.

    Returns:
        A JSON-round-tripped copy (so later changes by the caller do not leak in).
    """
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")
    for key in config:
        if not isinstance(key, str):
            raise TypeError(f"config keys must be strings, got {key!r}")
    try:
        out: dict[str, Any] = json.loads(json.dumps(dict(config), allow_nan=False))
    except ValueError as exc:
        raise ValueError(f"config must contain finite numbers only: {exc}") from None
    except TypeError as exc:
        raise TypeError(f"config must be JSON-serialisable: {exc}") from None
    for key, low in _INT_KEYS.items():
        value = out.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_STEP
        ):
            # The service bounds these by the contract's MAX_STEP too (RunConfigIn).
            raise ValueError(
                f"config[{key!r}] must be an integer >= {low} and <= {MAX_STEP}, got {value!r}"
            )
    decay = out.get("weight_decay")
    if decay is not None and (
        isinstance(decay, bool)
        or not isinstance(decay, int | float)
        or not math.isfinite(decay)
        or decay < 0
    ):
        raise ValueError(f"config['weight_decay'] must be a number >= 0, got {decay!r}")
    fit_key = out.get("fit_key")
    if fit_key is not None:
        check_key(fit_key)
    return out
