"""Functional core of ScheduleFree+: pure scalar schedules and the tensor kernels.

The optimizer class (:mod:`curvecast.sfplus.optimizer`) owns state and bookkeeping; this module
holds the maths, in two layers:

* **Scalar functions** (plain Python floats, no tensors): the SF-beta annealing schedule, the
  multiplicative warmup, the Polyak step and the averaging weight ``c_t``. The host-scalar path
  runs them once per step, in float64, and they are shared with the tests;
  :mod:`curvecast.sfplus._device` is the same arithmetic on device tensors.
* **Tensor kernels**: the global reductions (``||g||_1`` and ``<g, z - y>``, here) and the
  in-place parameter update (:func:`update`, from :mod:`curvecast.sfplus._kernels`), each with a
  ``torch._foreach_*`` multi-tensor path and a per-tensor path. On CPU the per-tensor path walks
  each tensor in cache-sized blocks so that the ~11 elementwise operations of one step touch
  main memory about once per buffer (see ``CPU_BLOCK``).

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

import torch
from torch import Tensor

from curvecast.sfplus._kernels import all_contiguous, update

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

    Not ``vector_norm(t).square()``: on the CPU that is slower, and less accurate on large
    float32 tensors, as torch's norm kernel accumulates in float32 where BLAS's dot keeps
    partial sums.
    """
    flat = _dot_operand(t)  # once: a half-precision or strided tensor is copied to get it
    return torch.dot(flat, flat)


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
            (torch's CPU ``vector_norm(ord=1)`` is slower than that), and the block of
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
            if not all_contiguous(g, *([d] if d is not None else [])):
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
        # A launch per dot product; they are cast and summed once per dtype, not one by one
        # (each cast is a launch too: on an accelerator a step is mostly launches).
        dots: dict[torch.dtype, list[Tensor]] = defaultdict(list)
        for g, d in zip(grads, deltas, strict=True):
            if d is not None:
                part = dot(g, d)
                dots[part.dtype].append(part if part.device == device else part.to(device))
        for parts in dots.values():
            dot_parts.append(torch.stack(parts).to(dtype=acc).sum())
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
