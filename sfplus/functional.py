"""Functional core of ScheduleFree+: pure scalar schedules and the tensor kernels.

The optimizer class (:mod:`curvecast.sfplus.optimizer`) owns state and bookkeeping; this module
holds the maths, in two layers:

* **Scalar functions** (plain Python floats, no tensors): the SF-beta annealing schedule, the
  multiplicative warmup, the Polyak step and the averaging weight ``c_t``. They run on the host
  once per step, in float64, and are shared with the tests.
* **Tensor kernels**: the global reductions (``||g||_1`` and ``<g, z - y>``) and the in-place
  parameter update, each with a ``torch._foreach_*`` multi-tensor path and a per-tensor path.
  On CPU the per-tensor path walks each tensor in cache-sized blocks so that the ~11 elementwise
  operations of one step touch main memory about once per buffer (see ``CPU_BLOCK``).

Storage convention (why there is no ``x`` buffer): the parameter holds ``y`` and the state holds
``delta = z - y``. Because ``y = beta' x + (1 - beta') z`` (``beta'`` is the SF beta that formed
``y``), ``z - x = delta / beta'``, so both ``z = y + delta`` and ``x = y - (1/beta' - 1) delta`` are
recoverable. Storing the *difference* rather than ``z`` itself makes the inner product a single
dot product and avoids the cancellation of ``<g, z> - <g, y>`` when ``z`` is close to ``y``.

One step, with ``u = m_hat / (sqrt(v_hat) + eps)`` the Adam direction, ``alpha`` the effective
step size, ``lam`` the weight decay and ``c`` the averaging weight, is (Algorithm 1, rewritten in
terms of ``y`` and ``delta``)::

    d         = -alpha * u - alpha**2 * lam * y          # z_new - z_old (AdamC decay + Adam step)
    b         = beta * (1 - c)
    delta_new = (b / beta') * delta + b * d              # = beta (z_new - x_new)
    y_new     = y + (1 - b / beta') * delta + (1 - b) * d

Both lines follow from ``x_new = (1 - c) x_old + c z_new`` and
``y_new = beta x_new + (1 - beta) z_new``.
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
    "CPU_BLOCK",
    "CPU_BLOCK_THREADED",
    "cpu_block",
    "SQRT_HALF_PI",
    "accumulate_dtype",
    "averaging_weight",
    "dot",
    "polyak_step",
    "reductions",
    "rescale_for_beta",
    "resolve_c_warmup",
    "sf_beta_schedule",
    "sumsq",
    "swap_y_to_x",
    "swap_x_to_y",
    "update",
    "warmup_factor",
]

#: ``E|X| = sqrt(pi/2) * sigma``'s factor for Gaussian X: converts the gradient L1 norm into the
#: Adam-weighted squared norm the Polyak denominator needs (paper, "Inverse-Gradient Norm
#: Weighting").
SQRT_HALF_PI = math.sqrt(math.pi / 2.0)

#: Elements per block for the CPU per-tensor path with one intra-op thread. 65,536 fp32 elements
#: are 256 KiB per buffer, so the five buffers a step touches (g, m, v, y, delta) plus one scratch
#: block stay in the core's L2 cache while the ~11 operations of a step run over them.
CPU_BLOCK = 1 << 16

#: Elements per block *per thread* when torch uses several intra-op threads. Every operation on
#: a block is then an OpenMP fork/join, and on a busy machine each join can wait a scheduler time
#: slice for a descheduled thread, so cost grows with the number of operations issued; blocks are
#: made L3-sized (2 MiB per buffer per thread) to keep that number close to AdamW's.
CPU_BLOCK_THREADED = 1 << 19


def cpu_block() -> int:
    """Block size (elements) for the CPU per-tensor path at the current intra-op thread count.

    The block-size sweep (``python -m bench run optimizer --block-sizes``) is the measurement
    behind both constants.
    """
    threads = torch.get_num_threads()
    return CPU_BLOCK if threads <= 1 else CPU_BLOCK_THREADED * threads


# --------------------------------------------------------------------------------------------
# Scalar schedules (host floats)
# --------------------------------------------------------------------------------------------


def sf_beta_schedule(step: int, sf_beta: float, sf_beta_max: float, anneal_steps: int) -> float:
    """SF beta at ``step`` (1-based): log-linear interpolation of ``1 - beta`` (Alg. 1, part 1).

    Args:
        step: the 1-based step number ``t``.
        sf_beta: the initial Schedule-Free interpolation coefficient.
        sf_beta_max: the value reached after ``anneal_steps``.
        anneal_steps: length of the anneal; ``0`` keeps ``sf_beta`` constant.

    Returns:
        ``1 - exp((1 - tau) ln(1 - sf_beta) + tau ln(1 - sf_beta_max))`` with
        ``tau = min(step / anneal_steps, 1)``, or ``sf_beta`` when ``anneal_steps == 0``.
    """
    if anneal_steps <= 0:
        return sf_beta
    tau = min(step / anneal_steps, 1.0)
    return 1.0 - math.exp((1.0 - tau) * math.log1p(-sf_beta) + tau * math.log1p(-sf_beta_max))


def warmup_factor(step: int, warmup_steps: int) -> float:
    """Linear multiplicative warmup ``gamma_t = min(1, t / warmup_steps)`` (1 when disabled)."""
    if warmup_steps <= 0:
        return 1.0
    return min(1.0, step / warmup_steps)


def resolve_c_warmup(c_warmup: int | None, warmup_steps: int) -> int:
    """``c_warmup``, with ``None`` meaning the paper's heuristic of twice the LR warmup."""
    return 2 * warmup_steps if c_warmup is None else c_warmup


def polyak_step(
    loss: float,
    inner: float,
    grad_l1: float,
    *,
    ema: float,
    ema_weight: float,
    polyak_beta: float,
    f_star: float,
) -> tuple[float, float, float, float, float]:
    """The Polyak scalar of Algorithm 1, part 2, with a bias correction that never compounds.

    The raw EMA ``ema`` and its total weight ``ema_weight`` (``1 - polyak_beta**t`` while
    ``polyak_beta`` is constant) are carried separately; the bias-corrected value is only ever
    *derived*, never written back. Tracking the weight by recursion rather than as
    ``1 - beta**t`` keeps the correction exact even if ``polyak_beta`` is changed mid-run.

    Args:
        loss: ``F``, the (globally averaged) loss at ``y``.
        inner: ``I = beta_t <g, z - x>``.
        grad_l1: ``||g||_1`` over all parameters.
        ema: the raw EMA after the previous step (0 before the first).
        ema_weight: the EMA's total weight after the previous step (0 before the first).
        polyak_beta: EMA coefficient ``beta_p`` in ``[0, 1)``.
        f_star: the loss floor ``f*`` subtracted in the numerator.

    Returns:
        ``(eta, numerator, denominator, new_ema, new_ema_weight)`` where ``numerator`` is
        ``F + I - f*`` *before* clipping at zero (negative values are worth alerting on) and
        ``denominator`` is the bias-corrected EMA actually used. ``eta`` is 0 when the numerator
        is negative or the denominator is 0 (all-zero gradients), and NaN when the loss is NaN:
        a NaN is reported, never silently turned into a zero step.
    """
    new_ema = polyak_beta * ema + (1.0 - polyak_beta) * SQRT_HALF_PI * grad_l1
    new_weight = polyak_beta * ema_weight + (1.0 - polyak_beta)
    denominator = new_ema / new_weight
    numerator = loss + inner - f_star
    if math.isnan(numerator) or math.isnan(denominator):
        eta = math.nan
    elif numerator <= 0.0 or denominator <= 0.0:
        eta = 0.0
    else:
        eta = numerator / denominator
    return eta, numerator, denominator, new_ema, new_weight


def averaging_weight(
    step: int,
    gamma_max: float,
    weight_sum: float,
    *,
    c_warmup: int,
    r: float,
    weight_lr_power: float,
) -> tuple[float, float]:
    """The Schedule-Free averaging weight ``c_t`` (Algorithm 1, part 3).

    Args:
        step: the 1-based step ``t``.
        gamma_max: the running maximum of the effective step size, this step included.
        weight_sum: ``W_{t-1}``, the sum of weights so far (0 before averaging starts).
        c_warmup: steps during which ``c_t = 1`` (no averaging; ``x`` tracks ``z``).
        r: power of ``t`` in the weight.
        weight_lr_power: power of ``gamma_max`` in the weight.

    Returns:
        ``(c_t, W_t)``. ``c_t = 1`` while ``t <= c_warmup``; afterwards ``w_t = t^r gamma_max^p``,
        ``W_t = W_{t-1} + w_t`` and ``c_t = w_t / W_t``. If every weight so far is 0 (only
        possible with ``eps = 0`` and no step ever taken) ``c_t = 1``, which is harmless because
        ``z`` has not moved.
    """
    if step <= c_warmup:
        return 1.0, weight_sum
    weight = float(step) ** r * gamma_max**weight_lr_power
    new_sum = weight_sum + weight
    if new_sum <= 0.0:
        return 1.0, new_sum
    return weight / new_sum, new_sum


# --------------------------------------------------------------------------------------------
# Tensor kernels
# --------------------------------------------------------------------------------------------


def accumulate_dtype(device: torch.device) -> torch.dtype:
    """The dtype partial sums on ``device`` are combined in: float64, float32 on MPS.

    float64 so that summing many per-tensor (or per-block) partials does not lose precision;
    MPS has no float64.
    """
    return torch.float32 if device.type == "mps" else torch.float64


def _flat(t: Tensor) -> Tensor:
    return t.view(-1) if t.is_contiguous() else t.reshape(-1)


def norm_dtype(dtype: torch.dtype) -> torch.dtype | None:
    # Half-precision norms are accumulated and returned in float32; float32/64 stay as they are.
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else None


def _dot_operand(t: Tensor) -> Tensor:
    """``t`` flat, half precision upcast to float32 (torch.dot would round the result to 8
    mantissa bits)."""
    flat = _flat(t)
    return flat.float() if t.dtype in (torch.float16, torch.bfloat16) else flat


def dot(a: Tensor, b: Tensor) -> Tensor:
    """``<a, b>`` over all elements, accumulated in at least float32."""
    return torch.dot(_dot_operand(a), _dot_operand(b))


def sumsq(t: Tensor) -> Tensor:
    """``||t||_2^2``, accumulated in at least float32: :func:`dot` of ``t`` with itself.

    Not ``vector_norm(t).square()``: on the CPU that is 1.4x slower, and less accurate (a
    relative error of 1.5e-4 against 2.5e-6 for 4M float32 values; 1.4e-6 against 2e-8 for
    262k), as torch's norm kernel accumulates in float32 where BLAS's dot keeps partial sums.
    """
    flat = _dot_operand(t)  # once: a half-precision or strided tensor is copied to get it
    return torch.dot(flat, flat)


def _all_contiguous(*tensors: Tensor) -> bool:
    return all(t.is_contiguous() for t in tensors)


def reductions(
    grads: Sequence[Tensor],
    deltas: Sequence[Tensor | None],
    *,
    foreach: bool,
    block: int | None = None,
) -> Tensor:
    """Local sums ``[||g||_1, <g, delta>]`` over the given tensors, on the first tensor's device.

    Args:
        grads: gradients (plain local tensors).
        deltas: the matching ``z - y`` buffers; ``None`` for freshly initialised state (known to
            be zero, so the dot product is skipped).
        foreach: use ``torch._foreach_norm`` for the L1 norms (accelerators).
        block: if set (CPU), walk each contiguous tensor in blocks of this many elements: the
            L1 norm of a block is ``abs`` into a cache-resident scratch buffer plus ``sum``
            (torch's CPU ``vector_norm(ord=1)`` is ~2.5x slower than that), and the block of
            ``g`` is still in cache for the dot product. Takes precedence over ``foreach``.

    Returns:
        A 1-D tensor of two elements in float64 (float32 on MPS). No host synchronisation.
    """
    if not grads:
        return torch.zeros(2, dtype=torch.float64)
    device = grads[0].device
    acc = accumulate_dtype(device)
    l1_parts: list[Tensor] = []
    dot_parts: list[Tensor] = []
    if block:
        scratch: dict[torch.dtype, Tensor] = {}
        for g, d in zip(grads, deltas, strict=True):
            if not _all_contiguous(g, *([d] if d is not None else [])):
                l1_parts.append(torch.linalg.vector_norm(g, 1, dtype=norm_dtype(g.dtype)))
                if d is not None:
                    dot_parts.append(dot(g, d))
                continue
            buf = scratch.get(g.dtype)
            if buf is None:
                buf = scratch[g.dtype] = torch.empty(block, dtype=g.dtype, device=g.device)
            gf = g.view(-1)
            df = d.view(-1) if d is not None else None
            for i in range(0, gf.numel(), block):
                gb = gf[i : i + block]
                ab = buf[: gb.numel()]
                torch.abs(gb, out=ab)
                l1_parts.append(ab.sum(dtype=norm_dtype(g.dtype)))
                if df is not None:
                    dot_parts.append(dot(gb, df[i : i + block]))
    elif foreach:
        buckets: dict[tuple[torch.device, torch.dtype], list[Tensor]] = defaultdict(list)
        for g in grads:
            buckets[(g.device, g.dtype)].append(g)
        for (_dev, dtype), gs in buckets.items():
            norms = torch._foreach_norm(gs, 1, dtype=norm_dtype(dtype))
            l1_parts.append(torch.stack(norms).to(device=device, dtype=acc).sum())
        for g, d in zip(grads, deltas, strict=True):
            if d is not None:
                dot_parts.append(dot(g, d).to(device=device, dtype=acc))
    else:
        for g, d in zip(grads, deltas, strict=True):
            l1_parts.append(torch.linalg.vector_norm(g, 1, dtype=norm_dtype(g.dtype)))
            if d is not None:
                dot_parts.append(dot(g, d))
    l1 = torch.stack([p.to(device=device, dtype=acc) for p in l1_parts]).sum()
    inner = (
        torch.stack([p.to(device=device, dtype=acc) for p in dot_parts]).sum()
        if dot_parts
        else torch.zeros((), dtype=acc, device=device)
    )
    return torch.stack([l1, inner])


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
            and _all_contiguous(y, g, m, v, d)
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
    """The compiled update of every contiguous float32 or float64 tensor, one call per
    (device, dtype) and step; returns the tensors it left to the per-tensor path (the others,
    or all where compiling failed). One call rather than one per tensor: a compiled call costs
    tens of microseconds of Python and guards on CPU and about 240 on an H200, more than many
    tensors' own work (BENCHMARKS.md, "optimizer" and "optimizer_cuda")."""
    buckets: dict[tuple[torch.device, torch.dtype], list[int]] = defaultdict(list)
    rest: list[int] = []
    for i, (y, g, m, v, d) in enumerate(zip(ys, gs, ms, vs, ds, strict=True)):
        # float32 and float64 only: a lower precision would need the scalars (which must stay
        # in float32 there, as Python floats do) and the tensors in two dtypes in one graph.
        if y.dtype in (torch.float32, torch.float64) and _all_contiguous(y, g, m, v, d):
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
    if block and y.numel() > block and _all_contiguous(y, g, m, v, d):
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


def rescale_for_beta(
    params: Sequence[Tensor],
    deltas: Sequence[Tensor],
    *,
    sf_beta: float,
    sf_beta_prev: float,
    foreach: bool,
) -> None:
    """Keep ``y = beta x + (1 - beta) z`` for parameters that skipped a step while beta changed.

    ``x`` and ``z`` of a parameter without a gradient do not move, but ``y`` is defined with the
    current SF beta, which changes while annealing: ``z - y_new = (beta / beta') (z - y)``.
    """
    if not params or sf_beta == sf_beta_prev:
        return
    ratio = sf_beta / sf_beta_prev
    if foreach:
        torch._foreach_add_(list(params), list(deltas), alpha=1.0 - ratio)
        torch._foreach_mul_(list(deltas), ratio)
    else:
        for y, d in zip(params, deltas, strict=True):
            y.add_(d, alpha=1.0 - ratio)
            d.mul_(ratio)


def swap_y_to_x(
    params: Sequence[Tensor], deltas: Sequence[Tensor], *, sf_beta_prev: float, foreach: bool
) -> None:
    """In place ``y -> x = y - (1/beta' - 1) (z - y)`` (for evaluation)."""
    _axpy(params, deltas, 1.0 - 1.0 / sf_beta_prev, foreach)


def swap_x_to_y(
    params: Sequence[Tensor], deltas: Sequence[Tensor], *, sf_beta_prev: float, foreach: bool
) -> None:
    """In place ``x -> y = x + (1/beta' - 1) (z - y)`` (back to training)."""
    _axpy(params, deltas, 1.0 / sf_beta_prev - 1.0, foreach)


def _axpy(params: Sequence[Tensor], deltas: Sequence[Tensor], scale: float, foreach: bool) -> None:
    if not params:
        return
    if foreach:
        torch._foreach_add_(list(params), list(deltas), alpha=scale)
    else:
        for p, d in zip(params, deltas, strict=True):
            p.add_(d, alpha=scale)
