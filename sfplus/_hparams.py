"""ScheduleFree+'s hyper-parameters: their checks, and the ones every parameter group shares.

Moved out of :mod:`curvecast.sfplus.optimizer`, whose constructor, ``add_param_group`` and
``step`` call these; the meaning of each hyper-parameter is documented on
:class:`~curvecast.sfplus.optimizer.ScheduleFreePlus`.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from torch import Tensor

__all__ = ["SHARED_KEYS", "check_shared", "is_real", "validate"]

#: Hyper-parameters that describe the whole model rather than a parameter group: the Polyak step
#: (loss, L1 norm, inner product), where it is computed, and the SF beta are global, so every
#: group must agree on them.
SHARED_KEYS = ("sf_beta", "sf_beta_max", "anneal_steps", "polyak_beta", "f_star",
               "device_scalars")


def is_real(value: object) -> bool:
    """Whether ``value`` is a real number; ``bool`` is not, although Python says it is."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_shared(groups: list[dict[str, Any]]) -> None:
    """Refuse parameter groups that disagree on a :data:`SHARED_KEYS` hyper-parameter.

    Checked again at every step because ``f_star`` may be changed between steps.

    Raises:
        ValueError: naming the key and the two groups' values, or a non-finite ``f_star``.
    """
    first = groups[0]
    for i, group in enumerate(groups[1:], start=1):
        for key in SHARED_KEYS:
            if group[key] != first[key]:
                raise ValueError(
                    f"{key} must be the same in every parameter group because it belongs to the "
                    f"whole model's Polyak step (group 0 has {first[key]!r}, group {i} has "
                    f"{group[key]!r}); set it on every group"
                )
    f_star = first["f_star"]
    if not is_real(f_star) or not math.isfinite(f_star):
        raise ValueError(f"Invalid f_star: {f_star!r} (must be a finite number)")


def validate(values: dict[str, Any], *, where: str) -> dict[str, Any]:
    """Check every hyper-parameter of one parameter group (or of the defaults).

    Args:
        values: the group's hyper-parameters, keyed as the optimizer's constructor arguments.
        where: what to name in an error after the key, e.g. ``" (parameter group 2)"``.

    Returns:
        The cleaned values: floats as ``float``, counts as ``int``, ``betas`` as a tuple.

    Raises:
        ValueError: for the first invalid value; the message names it and says what is allowed.
    """

    def real(
        name: str,
        low: float | None = None,
        high: float | None = None,
        *,
        low_open: bool = False,
        high_open: bool = True,
    ) -> float:
        v = values[name]
        if not is_real(v) or not math.isfinite(float(v)):
            raise ValueError(f"Invalid {name}{where}: {v!r} (must be a finite number)")
        x = float(v)
        if low is not None and (x < low or (low_open and x == low)):
            raise ValueError(
                f"Invalid {name}{where}: {v!r} (must be {'>' if low_open else '>='} {low})"
            )
        if high is not None and (x > high or (high_open and x == high)):
            raise ValueError(
                f"Invalid {name}{where}: {v!r} (must be {'<' if high_open else '<='} {high})"
            )
        return x

    def integer(name: str, *, optional: bool = False) -> int | None:
        v = values[name]
        if v is None and optional:
            return None
        if not isinstance(v, numbers.Integral) or isinstance(v, bool) or int(v) < 0:
            raise ValueError(f"Invalid {name}{where}: {v!r} (must be an integer >= 0)")
        return int(v)

    out: dict[str, Any] = {}
    if isinstance(values.get("lr"), Tensor):
        raise ValueError(
            f"Invalid lr{where}: tensor learning rates are not supported, pass a float"
        )
    out["lr"] = real("lr", 0.0)
    betas = values["betas"]
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"Invalid betas{where}: {betas!r} (must be a pair (beta1, beta2))")
    for i, b in enumerate(betas):
        if not is_real(b) or not 0.0 <= float(b) < 1.0:
            raise ValueError(f"Invalid betas{where}: beta{i + 1} = {b!r} (must be in [0, 1))")
    out["betas"] = (float(betas[0]), float(betas[1]))
    out["eps"] = real("eps", 0.0)
    out["weight_decay"] = real("weight_decay", 0.0)
    out["sf_beta"] = real("sf_beta", 0.0, 1.0, low_open=True)
    out["sf_beta_max"] = real("sf_beta_max", 0.0, 1.0, low_open=True)
    out["anneal_steps"] = integer("anneal_steps")
    out["warmup_steps"] = integer("warmup_steps")
    out["c_warmup"] = integer("c_warmup", optional=True)
    out["r"] = real("r", 0.0, None)
    out["weight_lr_power"] = real("weight_lr_power", 0.0, None)
    out["polyak_beta"] = real("polyak_beta", 0.0, 1.0)
    out["f_star"] = real("f_star")
    foreach = values["foreach"]
    if foreach is not None and not isinstance(foreach, bool):
        raise ValueError(f"Invalid foreach{where}: {foreach!r} (must be None, True or False)")
    out["foreach"] = foreach
    fused = values.get("fused")  # absent from checkpoints written before it existed
    if fused is not None and not isinstance(fused, bool):
        raise ValueError(f"Invalid fused{where}: {fused!r} (must be None, True or False)")
    if fused and foreach:
        raise ValueError(
            f"Invalid fused{where}: fused=True and foreach=True are mutually exclusive "
            f"(the fused kernel replaces the multi-tensor one); pass one of them"
        )
    out["fused"] = fused
    device_scalars = values.get("device_scalars")  # absent from older checkpoints too
    if device_scalars is not None and not isinstance(device_scalars, bool):
        raise ValueError(
            f"Invalid device_scalars{where}: {device_scalars!r} (must be None, True or False)"
        )
    out["device_scalars"] = device_scalars
    return out
