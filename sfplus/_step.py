"""One ScheduleFree+ step, in its two forms: the step size on the host or on the device.

Moved out of :mod:`curvecast.sfplus.optimizer`, whose ``step()`` validates the call and then
runs :func:`begin`, one of :func:`host_step` and :func:`device_step`, and :func:`finish`:

* **host scalars** (the eager paths' default on CPU, where reading a tensor costs nothing):
  the loss and the two global sums are fetched in one transfer, the Polyak step, ``gamma_max``
  and ``c_t`` are Python floats (:mod:`curvecast.sfplus.functional`), and the update takes them
  as such;
* **device scalars** (the default on accelerators and with ``fused``): the same arithmetic on
  device tensors (:mod:`curvecast.sfplus._device`), consumed by the update as tensors; a step
  reads nothing on the host, and its statistics are read when someone asks for them. With
  ``fused`` the whole step is one compiled call (:func:`curvecast.sfplus._fused.step_many_`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from curvecast.sfplus import _device, _fused, _hparams, _kernels, _state
from curvecast.sfplus import _distributed as _dist
from curvecast.sfplus import functional as F

__all__ = [
    "Step", "begin", "check_loss", "device_step", "finish", "host_step", "host_vector",
    "loss_tensor",
]

LossLike = Tensor | float


@dataclass(slots=True)
class Step:
    """What both forms of a step share: its number, SF betas, tensors and where they live."""

    t: int
    beta: float
    beta_prev: float
    work: list[_state.GroupWork]
    foreach: list[bool]
    device: torch.device
    #: Elements per block for the CPU per-tensor path (None on accelerators).
    block: int | None


def begin(
    param_groups: list[dict[str, Any]], state: Any, glob: dict[str, Any], foreach: list[bool]
) -> Step | None:
    """Gather the step's tensors (creating new parameters' state); None if no gradient."""
    g0 = param_groups[0]
    t = int(glob["step"]) + 1
    beta = F.sf_beta_schedule(t, g0["sf_beta"], g0["sf_beta_max"], g0["anneal_steps"])
    work = [_state.gather(group["params"], state) for group in param_groups]
    if not any(w.grads for w in work):
        return None  # no gradients anywhere: nothing to do, and the step is not counted
    device = next(w.grads[0].device for w in work if w.grads)
    # Cache blocking only pays on CPU; accelerators get whole tensors (or foreach lists).
    block = F.cpu_block() if device.type == "cpu" else None
    return Step(t, beta, float(glob["sf_beta_prev"]), work, foreach, device, block)


def _local_sums(s: Step) -> tuple[Tensor, dict[_dist.ShardKey, Tensor]]:
    """``[||g||_1, <g, z - y>]`` of this process's tensors: over replicated ones, and per
    sharding layout over sharded ones (not yet combined across processes)."""
    replicated = torch.zeros(2, dtype=F.accumulate_dtype(s.device), device=s.device)
    sharded: dict[_dist.ShardKey, Tensor] = {}
    for w, foreach in zip(s.work, s.foreach, strict=True):
        for key, idx in w.by_shard().items():
            part = F.reductions(
                [w.grads[i] for i in idx],
                [w.reduction_deltas[i] for i in idx],
                foreach=foreach,
                block=s.block,
            ).to(device=s.device, dtype=replicated.dtype)
            if key is None:
                replicated += part
            else:
                sharded[key] = sharded[key] + part if key in sharded else part
    return replicated, sharded


def check_loss(loss: object) -> None:
    """Refuse a loss that is neither a real number nor a one-element tensor."""
    if isinstance(loss, Tensor):
        if loss.numel() != 1:
            raise ValueError(
                "ScheduleFreePlus.step(): the loss must be a scalar, got a tensor of shape "
                f"{tuple(loss.shape)}"
            )
        return
    if _hparams.is_real(loss):
        return
    raise ValueError(
        "ScheduleFreePlus.step(): the loss must be a float or a 0-d tensor, got "
        f"{type(loss).__name__}"
    )


def loss_tensor(loss: LossLike, device: torch.device, dtype: torch.dtype) -> Tensor:
    """The (checked) loss as a one-element tensor on ``device``, without a transfer to wait
    for."""
    if isinstance(loss, Tensor):
        return loss.detach().reshape(1).to(device=device, dtype=dtype)
    # torch.full fills on the device from a host scalar: no host-to-device copy to wait for.
    return torch.full((1,), float(loss), dtype=dtype, device=device)


def finish(s: Step) -> None:
    """Re-form ``y`` of parameters that skipped the step (the SF beta may have changed), and
    count the step of those that took it."""
    for w, foreach in zip(s.work, s.foreach, strict=True):
        F.rescale_for_beta(w.skipped_params, w.skipped_deltas, sf_beta=s.beta,
                           sf_beta_prev=s.beta_prev, foreach=foreach)
        w.count_step()


# --------------------------------------------------------------------------------------------
# The step size on the host
# --------------------------------------------------------------------------------------------


def host_step(
    param_groups: list[dict[str, Any]], s: Step, loss: LossLike, glob: dict[str, Any], *,
    process_group: Any,
) -> dict[str, float]:
    """Reduce, fetch the sums (one transfer), compute the scalars on the host, update; returns
    the step's statistics as floats. ``glob`` gets this step's scalars."""
    g0 = param_groups[0]
    replicated, sharded = _local_sums(s)
    # The loss joins the single fetch when it lives on the device or must be all-reduced;
    # a host float needs neither.
    loss_t: Tensor | None = None
    if isinstance(loss, Tensor) or _dist.is_active(process_group):
        loss_t = loss_tensor(loss, s.device, replicated.dtype)
    means, sums = _dist.fetch_global(loss_t, replicated, sharded, group=process_group)
    loss_value = means[0] if loss_t is not None else float(loss)
    grad_l1, dot = sums

    inner = s.beta / s.beta_prev * dot  # beta_t <g, z - x> with z - x = (z - y) / beta'
    eta, numerator, denom, ema, ema_weight = F.polyak_step(
        loss_value, inner, grad_l1, ema=glob["denom_ema"], ema_weight=glob["denom_ema_weight"],
        polyak_beta=g0["polyak_beta"], f_star=g0["f_star"],
    )
    group_stats: list[tuple[float, float, float, float]] = []
    for gi, (group, w) in enumerate(zip(param_groups, s.work, strict=True)):
        warm = F.warmup_factor(s.t, group["warmup_steps"])
        alpha = warm * group["lr"] * eta
        gamma_max = max(glob["gamma_max"][gi], alpha)
        c, weight_sum = F.averaging_weight(
            s.t, gamma_max, glob["weight_sum"][gi],
            c_warmup=F.resolve_c_warmup(group["c_warmup"], group["warmup_steps"]),
            r=group["r"], weight_lr_power=group["weight_lr_power"],
        )
        glob["gamma_max"][gi] = gamma_max
        glob["weight_sum"][gi] = weight_sum
        group_stats.append((alpha, gamma_max, c, warm))
        beta1, beta2 = group["betas"]
        F.update(
            w.params, w.grads, w.exp_avgs, w.exp_avg_sqs, w.deltas, w.steps,
            beta1=beta1, beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"],
            alpha=alpha, c=c, sf_beta=s.beta, sf_beta_prev=s.beta_prev,
            foreach=s.foreach[gi], block=s.block, fused=bool(group["fused"]),
        )
    glob.update(step=s.t, denom_ema=ema, denom_ema_weight=ema_weight, sf_beta_prev=s.beta)
    alpha0, gamma_max0, c0, warm0 = group_stats[0]
    # The keys and their order are contract.OPTIMIZER_STATS (tests/sfplus hold them equal).
    return {
        "step": float(s.t), "loss": loss_value, "inner": inner, "numerator": numerator,
        "grad_l1": grad_l1, "denom_ema": denom, "eta": eta, "alpha": alpha0,
        "gamma_max": gamma_max0, "c": c0, "sf_beta": s.beta, "warmup": warm0,
    }


# --------------------------------------------------------------------------------------------
# The step size on the device
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Layout:
    """The step's tensors in one flat list (group by group) and their rows: tensors of one
    group with one Adam step count share a row of host-known values and of coefficients."""

    ys: list[Tensor]
    gs: list[Tensor]
    ms: list[Tensor]
    vs: list[Tensor]
    ds: list[Tensor]
    #: Per flat tensor: its parameter group and its row.
    group_of: list[int]
    row_of: list[int]
    #: Per row: ``(group, Adam step count)``.
    rows: list[tuple[int, int]]


def _layout(work: Sequence[_state.GroupWork]) -> _Layout:
    out = _Layout([], [], [], [], [], [], [], [])
    row_index: dict[tuple[int, int], int] = {}
    for gi, w in enumerate(work):
        out.ys += w.params
        out.gs += w.grads
        out.ms += w.exp_avgs
        out.vs += w.exp_avg_sqs
        out.ds += w.deltas
        for step in w.steps:
            row = row_index.get((gi, step))
            if row is None:
                row = row_index[gi, step] = len(out.rows)
                out.rows.append((gi, step))
            out.group_of.append(gi)
            out.row_of.append(row)
    return out


def host_vector(
    param_groups: list[dict[str, Any]], s: Step, rows: list[tuple[int, int]], ema_weight: float
) -> tuple[list[float], list[_kernels.HostCoefficients]]:
    """The host-known values of the step (:mod:`curvecast.sfplus._device`'s layout), and each
    row's coefficients for the eager update."""
    g0 = param_groups[0]
    pb = float(g0["polyak_beta"])
    values = [s.beta / s.beta_prev, pb, (1.0 - pb) * F.SQRT_HALF_PI, ema_weight,
              float(g0["f_star"]), s.beta, s.beta_prev]
    for group in param_groups:
        c_warmup = F.resolve_c_warmup(group["c_warmup"], group["warmup_steps"])
        values += [F.warmup_factor(s.t, group["warmup_steps"]) * group["lr"],
                   1.0 if s.t > c_warmup else 0.0, float(s.t) ** group["r"],
                   float(group["weight_lr_power"])]
    coefficients = []
    for gi, step in rows:
        group = param_groups[gi]
        beta1, beta2 = group["betas"]
        bc1, bc2 = 1.0 - beta1**step, 1.0 - beta2**step
        # m_hat / (sqrt(v_hat) + eps) == scale * m / (sqrt(v) + eps * sqrt(bc2)), as in update.
        scale, eps_eff = math.sqrt(bc2) / bc1, group["eps"] * math.sqrt(bc2)
        values += [scale, eps_eff, 1.0 - beta1, beta2, 1.0 - beta2, float(group["weight_decay"])]
        coefficients.append(_kernels.HostCoefficients(
            one_minus_beta1=1.0 - beta1, beta2=beta2, one_minus_beta2=1.0 - beta2,
            eps_eff=eps_eff, decay=group["weight_decay"] != 0.0))
    return values, coefficients


def device_step(
    param_groups: list[dict[str, Any]], s: Step, loss: LossLike, glob: dict[str, Any], *,
    process_group: Any, device_state: _device.DeviceState, compile_mode: str | None,
) -> tuple[dict[str, Any], Tensor]:
    """The step with its scalars on the device: no host read. Returns the statistics mapping
    (device values as 0-d tensors) and the tensor that holds them."""
    acc = F.accumulate_dtype(s.device)
    groups = len(param_groups)
    pb = float(param_groups[0]["polyak_beta"])
    # The EMA's weight does not depend on the data: it stays a host number.
    ema_weight = pb * glob["denom_ema_weight"] + (1.0 - pb)
    lay = _layout(s.work)
    values, row_coefficients = host_vector(param_groups, s, lay.rows, ema_weight)
    h = _device.to_device(values, s.device, acc)
    state = device_state.get(glob, groups, s.device, acc)
    loss_t = loss_tensor(loss, s.device, acc)
    rows = tuple(gi for gi, _ in lay.rows)
    fused = [bool(group["fused"]) for group in param_groups]
    sharded_present = any(key is not None for w in s.work for key in w.by_shard())

    sums: Tensor | None = None
    if sharded_present:
        replicated, sharded = _local_sums(s)
        loss_t, sums = _dist.combine_global(loss_t, replicated, sharded, group=process_group)
    elif _dist.is_active(process_group):  # DDP: only the loss differs between ranks
        loss_t, _ = _dist.combine_global(loss_t, loss_t.new_zeros(0), {}, group=process_group)

    result = None
    kernel = _fused.step_kernel(compile_mode) if any(fused) else None
    if kernel is not None:
        updated = tuple(i for i, gi in enumerate(lay.group_of) if fused[gi])
        if compile_mode == "reduce-overhead":
            _mark_static(lay, state)
        result = _fused.run_step(
            kernel, lay.ys, lay.gs, lay.ms, lay.vs, lay.ds, h, state, loss_t, sums,
            updated=updated, tensor_rows=tuple(lay.row_of[i] for i in updated),
            groups=groups, rows=rows)
    if result is not None:
        stats, coefficients = result
        if compile_mode == "reduce-overhead":
            stats = stats.clone()  # a CUDA graph's outputs are overwritten by its next replay
        eager = [not f for f in fused]
    else:  # no group asked for fused, or compilation is unavailable here
        if sums is None:  # nothing sharded (else the sums were reduced above)
            sums, _ = _local_sums(s)
        coefficients, new_state, stats = _device.step_scalars(
            h, state, sums, loss_t, groups=groups, rows=rows)
        state.copy_(new_state)
        eager = [True] * groups
    device_state.ahead = True

    by_row: dict[int, list[int]] = defaultdict(list)
    for i, (gi, row) in enumerate(zip(lay.group_of, lay.row_of, strict=True)):
        if eager[gi]:
            by_row[row].append(i)
    for row, idx in by_row.items():
        gi = lay.rows[row][0]
        _kernels.update_device(
            *([t[i] for i in idx] for t in (lay.ys, lay.gs, lay.ms, lay.vs, lay.ds)),
            host=row_coefficients[row], coefficients=coefficients[row],
            foreach=s.foreach[gi], block=s.block,
        )
    glob.update(step=s.t, denom_ema_weight=ema_weight, sf_beta_prev=s.beta)
    warm0 = F.warmup_factor(s.t, param_groups[0]["warmup_steps"])
    return _device.stats_mapping(s.t, stats, s.beta, warm0), stats


def _mark_static(lay: _Layout, state: Tensor) -> None:
    """Tell CUDA graphs (``compile_mode="reduce-overhead"``) that the buffers the step updates
    in place keep their addresses, so they are not copied in and out of the graph."""
    for t in (state, *lay.ys, *lay.ms, *lay.vs, *lay.ds):
        if getattr(t, "_dynamo_static_input_type", None) is None:
            torch._dynamo.mark_static_address(t)
