"""The costly part of ScheduleFree+'s telemetry: the norms of ``x``, ``y``, ``z`` and ``g``.

Moved out of :mod:`curvecast.sfplus.optimizer`, whose ``stats(norms=True)`` calls
:func:`weight_norms`. The names of all statistics are facts of :mod:`curvecast.contract`
(``OPTIMIZER_STATS``, ``NORM_STATS``), re-exported as ``curvecast.sfplus.STATS_KEYS`` and
``NORM_STATS_KEYS``; the per-step ones are read on the host during the step, in the optimizer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor

from curvecast.sfplus import _distributed as _dist
from curvecast.sfplus import functional as F

__all__ = ["weight_norms"]


@torch.no_grad()
def weight_norms(
    params: Iterable[tuple[Tensor, Tensor | None]],
    *,
    sf_beta_prev: float,
    train_mode: bool,
    foreach: bool | None = None,
) -> dict[str, float]:
    """``x_l2``, ``y_l2``, ``z_l2`` and ``grad_l2`` over all parameters, in one device sync.

    Args:
        params: every parameter with its ``z - y`` buffer (None before its first step).
        sf_beta_prev: the SF beta that formed ``y``.
        train_mode: whether the parameters hold ``y`` (True) or ``x`` (False).
        foreach: sum the squares with one ``torch._foreach_norm`` per device and dtype
            (default: on accelerators, not on the CPU).

    Returns:
        The four norms as plain floats, summed across shards under ``torch.distributed``.
    """
    # ||p + k delta||^2 = ||p||^2 + 2k <p, delta> + k^2 ||delta||^2 for any k: the norms of
    # x, y and z come from three sums without materialising x or z.
    # Per shard key: <p, delta> (partial dot products), and the sums of squares of p, delta and
    # g. On an accelerator the squares are summed with one foreach norm per device and dtype
    # instead of a norm (a kernel launch or two) per tensor, so the tensors are collected
    # first. On the CPU torch's foreach norm is no faster, and a tensor's reductions run back
    # to back while it is in cache (bench.optimizer_norms), so they are taken in the loop.
    buckets: dict[_dist.ShardKey | None, tuple[list[Tensor], ...]] = {}
    device: torch.device | None = None
    one_device = True
    use_foreach = False

    def squares(t: Tensor) -> Tensor:
        """``t`` itself, to be summed with others (foreach), or its sum of squares now."""
        return t if use_foreach else F.sumsq(t)

    for p, delta in params:
        pl = _dist.local(p)
        if device is None:
            device = pl.device
            use_foreach = foreach if foreach is not None else device.type != "cpu"
        elif pl.device != device:
            one_device = False
        key = _dist.shard_key(p)
        parts = buckets.get(key)
        if parts is None:
            parts = buckets[key] = ([], [], [], [])
        parts[0].append(squares(pl))
        if delta is not None:
            dl = _dist.local(delta)
            parts[1].append(F.dot(pl, dl))
            parts[2].append(squares(dl))
        if p.grad is not None:
            parts[3].append(squares(_dist.local(p.grad)))
    assert device is not None
    acc = F.accumulate_dtype(device)
    zero = torch.zeros((), dtype=acc, device=device)

    def total(sums: list[Tensor]) -> Tensor:
        if not sums:
            return zero
        if not one_device:
            sums = [q.to(device) for q in sums]
        # Stacking promotes to the widest dtype (exact), then the sum runs in ``acc``.
        return torch.stack(sums).to(acc).sum()

    def sum_of_squares(items: list[Tensor]) -> Tensor:
        if not use_foreach:
            return total(items)  # already sums of squares
        groups: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
        for t in items:
            groups.setdefault((t.device, t.dtype), []).append(t)
        # Half precision is accumulated in float32, as F.sumsq does; each norm is squared in
        # ``acc``.
        sums = [
            torch.stack(torch._foreach_norm(group, 2, dtype=F.norm_dtype(dtype)))
            .to(device=device, dtype=acc).square().sum()
            for (_, dtype), group in groups.items()
        ]
        return total(sums) if len(sums) != 1 else sums[0]

    replicated = torch.zeros(4, dtype=acc, device=device)
    sharded: dict[_dist.ShardKey, Tensor] = {}
    for key, (ps, dots, ds, gs) in buckets.items():
        sums = torch.stack([sum_of_squares(ps), total(dots), sum_of_squares(ds),
                            sum_of_squares(gs)])
        if key is None:
            replicated += sums
        else:
            sharded[key] = sums
    _, (pp, pd, dd, gg) = _dist.fetch_global(None, replicated, sharded)
    inv = 1.0 / sf_beta_prev
    if train_mode:  # p = y;  z = y + delta;  x = y + (1 - 1/beta') delta
        k_x, k_y, k_z = 1.0 - inv, 0.0, 1.0
    else:  # p = x;  y = x + (1/beta' - 1) delta;  z = x + delta / beta'
        k_x, k_y, k_z = 0.0, inv - 1.0, inv

    def norm(k: float) -> float:
        return math.sqrt(max(pp + 2.0 * k * pd + k * k * dd, 0.0))

    return {"x_l2": norm(k_x), "y_l2": norm(k_y), "z_l2": norm(k_z), "grad_l2": math.sqrt(gg)}
