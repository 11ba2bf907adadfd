"""The step size on the device: the Polyak step, ``gamma_max`` and ``c_t`` as tensors.

The host-scalar path (:mod:`curvecast.sfplus.functional`'s scalar functions) reads the step's
three sums on the host, one transfer a step: on an accelerator the training loop then waits for
the device at every step. Here the same arithmetic runs on the device, in float64 (float32 on
MPS), on tensors, and the update consumes its results as tensors: nothing is read on the host.

What a step needs comes in three parts:

* **Host-known values** (:func:`host_vector` builds them in
  :mod:`curvecast.sfplus._step`; laid out by :data:`GLOBAL_FIELDS`, :data:`GROUP_FIELDS` and
  :data:`ROW_FIELDS`): everything that depends only on the step count and the
  hyper-parameters (SF beta, warmup, the EMA's weight, Adam's bias corrections, ``f_star``,
  ``lr``), sent to the device in one asynchronous copy. Hyper-parameters are data, not
  constants, so a compiled step does not recompile when they change.
* **Device state** (:class:`DeviceState`): what depends on the data and carries over between
  steps, the raw Polyak EMA and per group ``gamma_max`` and the weight sum. The optimizer's
  checkpointed scalars (plain Python numbers, :mod:`curvecast.sfplus._state`) are written back
  from it when a state dict is taken.
* **The step's sums and loss**, reduced on the device.

:func:`step_scalars` turns them into the update's coefficients and the step's statistics; it is
plain tensor code, run eagerly by the eager paths and traced into the compiled step of
:mod:`curvecast.sfplus._fused`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "DEVICE_STATS", "DeviceState", "GLOBAL_FIELDS", "GROUP_FIELDS", "ROW_FIELDS",
    "group_table", "row_table", "stats_mapping", "step_scalars", "to_device",
]

#: Values of the whole step, at the head of the host vector.
GLOBAL_FIELDS = (
    "inner_scale",  # beta / beta': turns <g, z - y> into beta <g, z - x>
    "polyak_beta",
    "l1_coef",  # (1 - polyak_beta) sqrt(pi/2)
    "ema_weight",  # the EMA's total weight after this step (its bias correction)
    "f_star",
    "sf_beta",
    "sf_beta_prev",
)
#: Values of each parameter group, after the global ones.
GROUP_FIELDS = (
    "lr_warmup",  # lr * min(1, t / warmup_steps)
    "averaging",  # 1.0 once t > c_warmup, else 0.0
    "t_pow_r",  # t ** r
    "weight_lr_power",
)
#: Values of each row (tensors that share a group and a step count), after the groups'.
ROW_FIELDS = ("scale", "eps_eff", "one_minus_beta1", "beta2", "one_minus_beta2", "weight_decay")
#: The statistics :func:`step_scalars` returns, in order (``contract.OPTIMIZER_STATS`` without
#: the host-known ``step``, ``sf_beta`` and ``warmup``).
DEVICE_STATS = (
    "loss", "inner", "numerator", "grad_l1", "denom_ema", "eta", "alpha", "gamma_max", "c",
)
_G = {name: i for i, name in enumerate(GLOBAL_FIELDS)}
_P = {name: i for i, name in enumerate(GROUP_FIELDS)}
_R = {name: i for i, name in enumerate(ROW_FIELDS)}


def group_table(h: Tensor, *, groups: int) -> Tensor:
    """The per-group values of the host vector ``h`` as a ``(groups, len(GROUP_FIELDS))`` view."""
    start = len(GLOBAL_FIELDS)
    return h[start : start + groups * len(GROUP_FIELDS)].view(groups, len(GROUP_FIELDS))


def row_table(h: Tensor, *, groups: int, rows: int) -> Tensor:
    """The per-row values of the host vector ``h`` as a ``(rows, len(ROW_FIELDS))`` view."""
    start = len(GLOBAL_FIELDS) + groups * len(GROUP_FIELDS)
    return h[start : start + rows * len(ROW_FIELDS)].view(rows, len(ROW_FIELDS))


def to_device(values: list[float], device: torch.device, dtype: torch.dtype) -> Tensor:
    """``values`` as a 1-D tensor on ``device`` without waiting for it.

    On CUDA the values go through pinned memory with an asynchronous copy (a plain
    ``torch.tensor(..., device=...)`` copies from pageable memory and waits for the stream);
    torch's pinned-memory allocator keeps the buffer until the copy has run.
    """
    if device.type == "cpu":
        return torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)
    return torch.tensor(values, dtype=dtype).to(device)


def _select(values: Tensor, rows: tuple[int, ...]) -> Tensor:
    """``values[rows]`` along the first dimension, from views and one stack (indexing with a
    list would copy the index to the device first)."""
    if rows == tuple(range(values.shape[0])):
        return values
    return torch.stack([values[i] for i in rows])


def step_scalars(
    h: Tensor, state: Tensor, sums: Tensor, loss: Tensor, *, groups: int, rows: tuple[int, ...]
) -> tuple[Tensor, Tensor, Tensor]:
    """Algorithm 1's scalars (parts 2 and 3) on tensors: the arithmetic of
    :func:`~curvecast.sfplus.functional.polyak_step` and
    :func:`~curvecast.sfplus.functional.averaging_weight`, operation for operation.

    Args:
        h: the host-known values (:data:`GLOBAL_FIELDS`, then :data:`GROUP_FIELDS` per group,
            then :data:`ROW_FIELDS` per row), 1-D, in the accumulation dtype.
        state: ``[ema, gamma_max per group, weight sum per group]`` before the step.
        sums: ``[||g||_1, <g, z - y>]`` over all parameters.
        loss: the loss at ``y`` (one element, any floating dtype).
        groups: the number of parameter groups.
        rows: the parameter group of each row.

    Returns:
        ``(coefficients, new_state, stats)``: per row the update's step-size coefficients
        (``kernels.DEVICE_COEFFICIENTS``: ``wd_fold``, ``y_delta``, ``y_dir``, ``delta_dir``),
        the state after the step, and :data:`DEVICE_STATS`.
    """
    dtype = h.dtype
    loss = loss.reshape(()).to(dtype)
    l1, dot = sums[0].to(dtype), sums[1].to(dtype)
    inner = h[_G["inner_scale"]] * dot
    ema = h[_G["polyak_beta"]] * state[0] + h[_G["l1_coef"]] * l1
    denom = ema / h[_G["ema_weight"]]
    numerator = loss + inner - h[_G["f_star"]]
    eta = torch.where((numerator > 0) & (denom > 0), numerator / denom, 0.0)
    # A NaN loss is reported as a NaN step, never silently turned into a zero step.
    eta = torch.where(torch.isnan(numerator) | torch.isnan(denom), math.nan, eta)

    per_group = group_table(h, groups=groups)
    alpha = per_group[:, _P["lr_warmup"]] * eta
    gamma_max = torch.fmax(state[1 : 1 + groups], alpha)  # max() that ignores a NaN step
    weight = per_group[:, _P["t_pow_r"]] * gamma_max ** per_group[:, _P["weight_lr_power"]]
    averaging = per_group[:, _P["averaging"]] > 0
    weight_sum = state[1 + groups :] + torch.where(averaging, weight, 0.0)
    c = torch.where(averaging & (weight_sum > 0), weight / weight_sum, 1.0)
    b = h[_G["sf_beta"]] * (1.0 - c)
    a = b / h[_G["sf_beta_prev"]]
    k = 1.0 - b

    table = row_table(h, groups=groups, rows=len(rows))
    scale = table[:, _R["scale"]]
    alpha_r, a_r, b_r, k_r = _select(torch.stack([alpha, a, b, k], dim=1), rows).unbind(1)
    coefficients = torch.stack([
        alpha_r * table[:, _R["weight_decay"]] / scale,  # wd_fold
        1.0 - a_r,  # y_delta
        -k_r * alpha_r * scale,  # y_dir
        -b_r * alpha_r * scale,  # delta_dir
    ], dim=1)
    new_state = torch.cat([ema.reshape(1), gamma_max, weight_sum])
    stats = torch.stack([loss, inner, numerator, l1, denom, eta, alpha[0], gamma_max[0], c[0]])
    return coefficients, new_state, stats


class DeviceState:
    """The data-dependent optimizer-wide scalars on the device between steps.

    ``[ema, gamma_max per group, weight sum per group]``, one tensor in the accumulation dtype.
    The optimizer's global state dict (:mod:`curvecast.sfplus._state`) keeps the same values as
    plain Python numbers for checkpoints; :meth:`write_back` brings them up to date (one read,
    when a state dict is taken, never in a step).
    """

    __slots__ = ("tensor", "ahead")

    def __init__(self) -> None:
        self.tensor: Tensor | None = None
        #: Whether the tensor holds steps the host copy has not seen.
        self.ahead = False

    def get(self, glob: dict[str, Any], groups: int, device: torch.device,
            dtype: torch.dtype) -> Tensor:
        """The state tensor for a step on ``device``, made from ``glob`` when there is none
        for this device and number of groups (the first step, or a group was added)."""
        t = self.tensor
        if t is not None and t.numel() == 1 + 2 * groups and t.device == device \
                and t.dtype == dtype:
            return t
        self.write_back(glob)
        values = [float(glob["denom_ema"]), *map(float, glob["gamma_max"][:groups]),
                  *map(float, glob["weight_sum"][:groups])]
        self.tensor = to_device(values, device, dtype)
        return self.tensor

    def write_back(self, glob: dict[str, Any]) -> None:
        """Copy the device values into ``glob`` (Python floats) if it is behind them."""
        t = self.tensor
        if t is None or not self.ahead:
            return
        values = t.tolist()
        groups = (len(values) - 1) // 2
        glob["denom_ema"] = values[0]
        glob["gamma_max"][:groups] = values[1 : 1 + groups]
        glob["weight_sum"][:groups] = values[1 + groups :]
        self.ahead = False

    def drop(self) -> None:
        """Forget the device copy (the host state was replaced, e.g. by a loaded checkpoint)."""
        self.tensor = None
        self.ahead = False


def stats_mapping(step: int, vector: Tensor, sf_beta: float, warmup: float) -> dict[str, Any]:
    """A step's statistics, in ``contract.OPTIMIZER_STATS`` order: the host-known ones as
    floats, the others as 0-d views of ``vector`` (:data:`DEVICE_STATS`), read only when
    someone asks (``stats()``, or the client hook's batcher thread)."""
    out: dict[str, Any] = {"step": float(step)}
    out.update(zip(DEVICE_STATS, vector.unbind(), strict=True))
    out["sf_beta"] = sf_beta
    out["warmup"] = warmup
    return out
