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
    params: Iterable[tuple[Tensor, Tensor | None]], *, sf_beta_prev: float, train_mode: bool
) -> dict[str, float]:
    """``x_l2``, ``y_l2``, ``z_l2`` and ``grad_l2`` over all parameters, in one device sync.

    Args:
        params: every parameter with its ``z - y`` buffer (None before its first step).
        sf_beta_prev: the SF beta that formed ``y``.
        train_mode: whether the parameters hold ``y`` (True) or ``x`` (False).

    Returns:
        The four norms as plain floats, summed across shards under ``torch.distributed``.
    """
    # ||p + k delta||^2 = ||p||^2 + 2k <p, delta> + k^2 ||delta||^2 for any k: the norms of
    # x, y and z come from three sums without materialising x or z.
    # Per shard key, the partial sums of <p, p>, <p, delta>, <delta, delta> and <g, g>: a few
    # tensor operations per parameter (the reductions), the rest once per quantity.
    buckets: dict[_dist.ShardKey | None, tuple[list[Tensor], ...]] = {}
    device: torch.device | None = None
    one_device = True
    for p, delta in params:
        pl = _dist.local(p)
        if device is None:
            device = pl.device
        elif pl.device != device:
            one_device = False
        key = _dist.shard_key(p)
        parts = buckets.get(key)
        if parts is None:
            parts = buckets[key] = ([], [], [], [])
        parts[0].append(F.sumsq(pl))
        if delta is not None:
            dl = _dist.local(delta)
            parts[1].append(F.dot(pl, dl))
            parts[2].append(F.sumsq(dl))
        if p.grad is not None:
            parts[3].append(F.sumsq(_dist.local(p.grad)))
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

    replicated = torch.zeros(4, dtype=acc, device=device)
    sharded: dict[_dist.ShardKey, Tensor] = {}
    for key, parts in buckets.items():
        sums = torch.stack([total(q) for q in parts])
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
