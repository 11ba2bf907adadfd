"""One ScheduleFree+ step: gather the tensors, reduce, compute the scalars, update.

Moved out of :mod:`curvecast.sfplus.optimizer`, whose ``step()`` validates the call and then
runs :func:`begin`, :func:`host_step` and :func:`finish`: the loss and the two global sums are
fetched in one transfer, the Polyak step, ``gamma_max`` and ``c_t`` are Python floats
(:mod:`curvecast.sfplus.functional`), and the update takes them as such.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from curvecast.sfplus import _distributed as _dist
from curvecast.sfplus import _hparams, _state
from curvecast.sfplus import functional as F

__all__ = ["Step", "begin", "check_loss", "finish", "host_step", "loss_tensor"]

LossLike = Tensor | float


@dataclass(slots=True)
class Step:
    """What a step needs throughout: its number, SF betas, tensors and where they live."""

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
