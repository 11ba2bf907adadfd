"""The in-place update kernels of ScheduleFree+ (eager), for host or device coefficients.

:func:`update` takes the step's coefficients as Python floats (the host-scalar path: the
Polyak step was computed on the host after one transfer); :func:`update_device` takes the ones
that depend on the step size as a tensor on the parameters' device (the device-scalar path: no
host read in the step). Both have a ``torch._foreach_*`` multi-tensor path and a per-tensor
path that, on CPU, walks each tensor in cache-sized blocks; ``fused=True`` on the host path
hands float32/float64 tensors to the compiled update of :mod:`curvecast.sfplus._fused`.

One step, with ``u = m_hat / (sqrt(v_hat) + eps)``, ``alpha`` the step size, ``lam`` the weight
decay, ``c`` the averaging weight and ``beta``/``beta'`` the SF betas of this step and of the
one that formed ``y`` (see :mod:`curvecast.sfplus.functional` for the derivation)::

    d         = -alpha * u - alpha**2 * lam * y          # z_new - z_old
    b         = beta * (1 - c),   a = b / beta'
    delta_new = a * delta + b * d
    y_new     = y + (1 - a) * delta + (1 - b) * d
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from curvecast.sfplus import _fused

__all__ = [
    "DEVICE_COEFFICIENTS", "HostCoefficients", "all_contiguous", "update", "update_device",
]


def all_contiguous(*tensors: Tensor) -> bool:
    """Whether every tensor is contiguous (its flat view is then a view, not a copy)."""
    return all(t.is_contiguous() for t in tensors)


def _coefficients(
    alpha: float, c: float, sf_beta: float, sf_beta_prev: float
) -> tuple[float, float, float]:
    """``(b, a, k)`` of the module docstring.

    ``b = beta (1 - c)``, ``a = b / beta'`` and ``k = 1 - b``.
    """
    b = sf_beta * (1.0 - c)
    return b, b / sf_beta_prev, 1.0 - b


def update(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    exp_avgs: Sequence[Tensor],
    exp_avg_sqs: Sequence[Tensor],
    deltas: Sequence[Tensor],
    steps: Sequence[int],
    *,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    alpha: float,
    c: float,
    sf_beta: float,
    sf_beta_prev: float,
    foreach: bool,
    block: int | None = None,
    fused: bool = False,
) -> None:
    """One in-place ScheduleFree+ update of ``y`` (the parameters), ``delta``, and Adam's moments.

    Args:
        params: the parameters, holding ``y``; updated in place to ``y_new``.
        grads: gradients at ``y``.
        exp_avgs: Adam first moments ``m`` (updated in place).
        exp_avg_sqs: Adam second moments ``v`` (updated in place).
        deltas: ``z - y`` buffers (updated in place).
        steps: per-tensor Adam step counts *including* this step (for bias correction; they
            differ only for parameters that skipped steps without a gradient or joined late).
        beta1: Adam's first-moment coefficient.
        beta2: Adam's second-moment coefficient.
        eps: Adam's epsilon, added to ``sqrt(v_hat)``.
        weight_decay: the fully decoupled AdamC ``lambda`` (``z -= alpha^2 lambda y``).
        alpha: the effective step size ``warmup * lr * eta`` of this parameter group.
        c: the averaging weight ``c_t``.
        sf_beta: SF beta of this step (forms ``y_new``).
        sf_beta_prev: SF beta that formed the current ``y``.
        foreach: use the ``torch._foreach_*`` multi-tensor kernels.
        block: per-tensor path only: block size in elements for contiguous tensors (CPU).
        fused: use the compiled one-pass kernel (:mod:`curvecast.sfplus._fused`) for tensors of
            at least ``FUSED_MIN_NUMEL`` elements, the per-tensor path for the rest and for
            everything if compilation is unavailable. Takes precedence over ``foreach``.
    """
    if not params:
        return
    b, a, k = _coefficients(alpha, c, sf_beta, sf_beta_prev)
    # Group by step so every kernel call below takes plain scalars; normally there is one group.
    by_step: dict[int, list[int]] = defaultdict(list)
    for i, s in enumerate(steps):
        by_step[s].append(i)
    for step, idx in by_step.items():
        bc1 = 1.0 - beta1**step
        bc2 = 1.0 - beta2**step
        # m_hat / (sqrt(v_hat) + eps) == scale * m / (sqrt(v) + eps * sqrt(bc2)).
        scale = math.sqrt(bc2) / bc1
        eps_eff = eps * math.sqrt(bc2)
        coeffs = _StepCoefficients(
            one_minus_beta1=1.0 - beta1,
            beta2=beta2,
            one_minus_beta2=1.0 - beta2,
            eps_eff=eps_eff,
            wd_fold=alpha * weight_decay / scale,
            y_delta=1.0 - a,
            y_dir=-k * alpha * scale,
            delta_keep=a,
            delta_dir=-b * alpha * scale,
            decay=weight_decay != 0.0 and alpha != 0.0,
        )
        sel = [params[i] for i in idx], [grads[i] for i in idx]
        ms, vs, ds = (
            [exp_avgs[i] for i in idx],
            [exp_avg_sqs[i] for i in idx],
            [deltas[i] for i in idx],
        )
        if fused:
            _update_fused(sel[0], sel[1], ms, vs, ds, coeffs, block)
        elif foreach:
            _update_foreach(sel[0], sel[1], ms, vs, ds, coeffs)
        else:
            for y, g, m, v, d in zip(sel[0], sel[1], ms, vs, ds, strict=True):
                _update_tensor(y, g, m, v, d, coeffs, block)


@dataclass(slots=True, kw_only=True)
class _StepCoefficients:
    """Host scalars of one update, precomputed once per (group, step-count) bucket."""

    one_minus_beta1: float
    beta2: float
    one_minus_beta2: float
    eps_eff: float
    #: With T = m / denom + wd_fold * y, the z displacement is d = -alpha * scale * T.
    wd_fold: float
    y_delta: float
    y_dir: float
    delta_keep: float
    delta_dir: float
    decay: bool


def _update_foreach(
    ys: list[Tensor],
    gs: list[Tensor],
    ms: list[Tensor],
    vs: list[Tensor],
    ds: list[Tensor],
    k: _StepCoefficients,
) -> None:
    buckets: dict[tuple[torch.device, torch.dtype], list[int]] = defaultdict(list)
    for i, y in enumerate(ys):
        buckets[(y.device, y.dtype)].append(i)
    for idx in buckets.values():
        yl = [ys[i] for i in idx]
        gl = [gs[i] for i in idx]
        ml = [ms[i] for i in idx]
        vl = [vs[i] for i in idx]
        dl = [ds[i] for i in idx]
        torch._foreach_lerp_(ml, gl, k.one_minus_beta1)
        torch._foreach_mul_(vl, k.beta2)
        torch._foreach_addcmul_(vl, gl, gl, k.one_minus_beta2)
        denom = torch._foreach_sqrt(vl)
        torch._foreach_add_(denom, k.eps_eff)
        if k.decay:
            # y_new needs delta_old and delta_new needs y_old, and both need the decay term in
            # y_old: materialise T = m / denom + wd_fold * y once, then update y before delta.
            t = torch._foreach_div(ml, denom)
            del denom
            torch._foreach_add_(t, yl, alpha=k.wd_fold)
            torch._foreach_add_(yl, dl, alpha=k.y_delta)
            torch._foreach_add_(yl, t, alpha=k.y_dir)
            torch._foreach_mul_(dl, k.delta_keep)
            torch._foreach_add_(dl, t, alpha=k.delta_dir)
        else:
            torch._foreach_add_(yl, dl, alpha=k.y_delta)
            torch._foreach_addcdiv_(yl, ml, denom, k.y_dir)
            torch._foreach_mul_(dl, k.delta_keep)
            torch._foreach_addcdiv_(dl, ml, denom, k.delta_dir)


def _update_fused(
    ys: list[Tensor],
    gs: list[Tensor],
    ms: list[Tensor],
    vs: list[Tensor],
    ds: list[Tensor],
    k: _StepCoefficients,
    block: int | None,
) -> None:
    scalars = (
        k.one_minus_beta1, k.beta2, k.one_minus_beta2, k.eps_eff,
        k.wd_fold if k.decay else 0.0, k.y_delta, k.y_dir, k.delta_keep, k.delta_dir,
    )
    # Every float32/float64 tensor in one compiled call; the others one call each.
    ys, gs, ms, vs, ds = _update_fused_many(ys, gs, ms, vs, ds, scalars)
    if not ys:
        return
    kernel = _fused.fused_kernel()
    for y, g, m, v, d in zip(ys, gs, ms, vs, ds, strict=True):
        if (
            kernel is not None
            and y.numel() >= _fused.FUSED_MIN_NUMEL
            and all_contiguous(y, g, m, v, d)
            and _fused.run(kernel, (y, g, m, v, d), scalars)
        ):
            continue
        kernel = _fused.fused_kernel()  # None from now on if the call above failed to compile
        _update_tensor(y, g, m, v, d, k, block)


def _update_fused_many(
    ys: list[Tensor],
    gs: list[Tensor],
    ms: list[Tensor],
    vs: list[Tensor],
    ds: list[Tensor],
    scalars: tuple[float, ...],
) -> tuple[list[Tensor], list[Tensor], list[Tensor], list[Tensor], list[Tensor]]:
    """The compiled update of every contiguous float32 or float64 tensor, one call per (device,
    dtype) and step; returns the tensors it left to the per-tensor path (the others, or all where
    compiling failed). One call rather than one per tensor: a compiled call costs tens to hundreds
    of microseconds of Python and guards, more than many tensors' own work (BENCHMARKS.md,
    "optimizer" and "optimizer_cuda")."""
    buckets: dict[tuple[torch.device, torch.dtype], list[int]] = defaultdict(list)
    rest: list[int] = []
    for i, (y, g, m, v, d) in enumerate(zip(ys, gs, ms, vs, ds, strict=True)):
        # float32 and float64 only: a lower precision would need the scalars (which must stay
        # in float32 there, as Python floats do) and the tensors in two dtypes in one graph.
        if y.dtype in (torch.float32, torch.float64) and all_contiguous(y, g, m, v, d):
            buckets[(y.device, y.dtype)].append(i)
        else:
            rest.append(i)
    for (device, dtype), idx in buckets.items():
        many = _fused.fused_many_kernel()
        # The scalars in the tensors' dtype: one small copy to the device per step.
        k = torch.tensor(scalars, device=device, dtype=dtype)
        lists = tuple([t[i] for i in idx] for t in (ys, gs, ms, vs, ds))
        if many is None or not _fused.run_many(many, lists, k):
            rest.extend(idx)
    rest.sort()
    return ([ys[i] for i in rest], [gs[i] for i in rest], [ms[i] for i in rest],
            [vs[i] for i in rest], [ds[i] for i in rest])


def _update_tensor(
    y: Tensor,
    g: Tensor,
    m: Tensor,
    v: Tensor,
    d: Tensor,
    k: _StepCoefficients,
    block: int | None,
) -> None:
    if block and y.numel() > block and all_contiguous(y, g, m, v, d):
        yf, gf, mf, vf, df = y.view(-1), g.view(-1), m.view(-1), v.view(-1), d.view(-1)
        scratch = torch.empty(block, dtype=y.dtype, device=y.device)
        n = yf.numel()
        for i in range(0, n, block):
            j = min(i + block, n)
            _update_block(yf[i:j], gf[i:j], mf[i:j], vf[i:j], df[i:j], scratch[: j - i], k)
    else:
        _update_block(y, g, m, v, d, torch.empty_like(y), k)


def _update_block(
    y: Tensor, g: Tensor, m: Tensor, v: Tensor, d: Tensor, tmp: Tensor, k: _StepCoefficients
) -> None:
    # Same operation order as _update_foreach, so the two paths agree to the last bit on the
    # elementwise maths and differ only in how reductions are summed.
    m.lerp_(g, k.one_minus_beta1)
    v.mul_(k.beta2).addcmul_(g, g, value=k.one_minus_beta2)
    torch.sqrt(v, out=tmp)
    tmp.add_(k.eps_eff)
    if k.decay:
        torch.div(m, tmp, out=tmp)
        tmp.add_(y, alpha=k.wd_fold)
        y.add_(d, alpha=k.y_delta).add_(tmp, alpha=k.y_dir)
        d.mul_(k.delta_keep).add_(tmp, alpha=k.delta_dir)
    else:
        y.add_(d, alpha=k.y_delta).addcdiv_(m, tmp, value=k.y_dir)
        d.mul_(k.delta_keep).addcdiv_(m, tmp, value=k.delta_dir)




# --------------------------------------------------------------------------------------------
# Device coefficients: the step size stays on the device
# --------------------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True, frozen=True)
class HostCoefficients:
    """The coefficients of one update that do not depend on the step size: known on the host
    before the step (Adam's moments and its bias-corrected epsilon)."""

    one_minus_beta1: float
    beta2: float
    one_minus_beta2: float
    eps_eff: float
    #: Whether the group has weight decay (then ``y`` enters the direction).
    decay: bool


#: Rows of the device coefficients :func:`update_device` takes, in this order.
DEVICE_COEFFICIENTS = ("wd_fold", "y_delta", "y_dir", "delta_dir")


def update_device(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    exp_avgs: Sequence[Tensor],
    exp_avg_sqs: Sequence[Tensor],
    deltas: Sequence[Tensor],
    *,
    host: HostCoefficients,
    coefficients: Tensor,
    foreach: bool,
    block: int | None = None,
) -> None:
    """:func:`update` of tensors that share a step count, with the step-size-dependent
    coefficients read from a tensor instead of passed as floats: no host read.

    ``coefficients`` holds :data:`DEVICE_COEFFICIENTS` (``wd_fold``, ``y_delta = 1 - a``,
    ``y_dir``, ``delta_dir`` of :func:`update`) on the tensors' device. ``delta`` is updated as
    ``delta - y_delta * delta + delta_dir * T`` rather than ``a * delta + ...``: every
    coefficient that multiplies a tensor is then an increment's, small beside 1, so the
    rounding to the tensors' precision that a multi-tensor kernel applies to a tensor scalar
    (bfloat16: 8 bits) perturbs the step by a fraction of itself, not the weights.
    """
    if not params:
        return
    if foreach:
        buckets: dict[tuple[torch.device, torch.dtype], list[int]] = defaultdict(list)
        for i, y in enumerate(params):
            buckets[(y.device, y.dtype)].append(i)
        for (device, dtype), idx in buckets.items():
            # The multi-tensor kernels take a scalar tensor of the lists' dtype and device.
            coef = coefficients.to(device=device, dtype=dtype)
            _update_foreach_device(
                [params[i] for i in idx], [grads[i] for i in idx], [exp_avgs[i] for i in idx],
                [exp_avg_sqs[i] for i in idx], [deltas[i] for i in idx], host, coef)
        return
    for y, g, m, v, d in zip(params, grads, exp_avgs, exp_avg_sqs, deltas, strict=True):
        coef = coefficients if coefficients.device == y.device else coefficients.to(y.device)
        if block and y.numel() > block and all_contiguous(y, g, m, v, d):
            yf, gf, mf, vf, df = y.view(-1), g.view(-1), m.view(-1), v.view(-1), d.view(-1)
            scratch = torch.empty(block, dtype=y.dtype, device=y.device)
            n = y.numel()
            for i in range(0, n, block):
                j = min(i + block, n)
                _update_block_device(yf[i:j], gf[i:j], mf[i:j], vf[i:j], df[i:j],
                                     scratch[: j - i], host, coef)
        else:
            _update_block_device(y, g, m, v, d, torch.empty_like(y), host, coef)


def _update_foreach_device(
    ys: list[Tensor], gs: list[Tensor], ms: list[Tensor], vs: list[Tensor], ds: list[Tensor],
    k: HostCoefficients, coef: Tensor,
) -> None:
    wd_fold, y_delta, y_dir, delta_dir = coef.unbind()
    torch._foreach_lerp_(ms, gs, k.one_minus_beta1)
    torch._foreach_mul_(vs, k.beta2)
    torch._foreach_addcmul_(vs, gs, gs, k.one_minus_beta2)
    t = torch._foreach_sqrt(vs)
    torch._foreach_add_(t, k.eps_eff)
    t = torch._foreach_div(ms, t)  # m / denom: T without the decay term
    if k.decay:
        torch._foreach_add_(t, torch._foreach_mul(ys, wd_fold))
    tmp = torch._foreach_mul(ds, y_delta)  # (1 - a) delta, for both y and delta
    torch._foreach_add_(ys, tmp)
    torch._foreach_sub_(ds, tmp)
    tmp = torch._foreach_mul(t, delta_dir)
    torch._foreach_add_(ds, tmp)
    del tmp
    torch._foreach_mul_(t, y_dir)
    torch._foreach_add_(ys, t)


def _update_block_device(
    y: Tensor, g: Tensor, m: Tensor, v: Tensor, d: Tensor, tmp: Tensor, k: HostCoefficients,
    coef: Tensor,
) -> None:
    # The operations of _update_block, with the step size's coefficients as 0-d tensors that
    # broadcast (addcmul_ by a 0-d tensor: one operation, as add_ with alpha= is).
    wd_fold, y_delta, y_dir, delta_dir = coef.unbind()
    m.lerp_(g, k.one_minus_beta1)
    v.mul_(k.beta2).addcmul_(g, g, value=k.one_minus_beta2)
    torch.sqrt(v, out=tmp)
    tmp.add_(k.eps_eff)
    torch.div(m, tmp, out=tmp)
    if k.decay:
        tmp.addcmul_(y, wd_fold)
    y.addcmul_(d, y_delta)
    d.addcmul_(d, y_delta, value=-1.0)
    y.addcmul_(tmp, y_dir)
    d.addcmul_(tmp, delta_dir)
