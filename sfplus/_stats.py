"""The costly part of ScheduleFree+'s telemetry: the norms of ``x``, ``y``, ``z`` and ``g``.

Moved out of :mod:`curvecast.sfplus.optimizer`, whose ``stats(norms=True)`` calls
:func:`weight_norms`. The names of all statistics are facts of :mod:`curvecast.contract`
(``OPTIMIZER_STATS``, ``NORM_STATS``), re-exported as ``curvecast.sfplus.STATS_KEYS`` and
``NORM_STATS_KEYS``; the per-step ones are read on the host during the step, in the optimizer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Final

import torch
from torch import Tensor

from curvecast.sfplus import _distributed as _dist
from curvecast.sfplus import functional as F

__all__ = ["weight_norms"]


#: On the CPU, tensors of fewer elements than this are not reduced one by one but flattened
#: into one tensor per dtype with the others and reduced together: a reduction costs a few
#: microseconds of dispatch whatever its size, so a model's biases and norm weights cost more
#: in calls than in arithmetic. Not larger: the copy then costs more than the calls it saves
#: (bench/optimizer/optimizer_norms.py: at 2**15, which joins 128 x 128 weights, the deep MLP's
#: norms took 2.3 times as long as reducing each tensor).
SMALL_NUMEL: Final = 1 << 13
#: Joined tensors are reduced once they hold this many elements (bounds the copy's memory).
JOIN_NUMEL: Final = 1 << 20

_PP, _PD, _DD, _GG = range(4)  # the sums: <p, p>, <p, delta>, <delta, delta>, <g, g>


class _Sums:
    """The partial sums of one shard key, by kind (``_PP`` ... ``_GG``): 0-d tensors, or on an
    accelerator with foreach the tensors themselves, to be summed per device and dtype. Small
    CPU tensors wait in ``joining`` (per dtype: ``p``, ``p`` with a ``delta``, ``delta``, ``g``)
    and are reduced together."""

    __slots__ = ("parts", "joining", "joining_numel")

    def __init__(self) -> None:
        self.parts: tuple[list[Tensor], ...] = ([], [], [], [])
        self.joining: dict[torch.dtype, tuple[list[Tensor], ...]] = {}
        self.joining_numel = 0

    def reduce(self, p: Tensor, delta: Tensor | None, g: Tensor | None) -> None:
        """Add the sums of one parameter now (while its tensors are in cache)."""
        parts = self.parts
        parts[_PP].append(F.sumsq(p))
        if delta is not None:
            parts[_PD].append(F.dot(p, delta))
            parts[_DD].append(F.sumsq(delta))
        if g is not None:
            parts[_GG].append(F.sumsq(g))

    def join(self, p: Tensor, delta: Tensor | None, g: Tensor | None) -> None:
        """Keep one small parameter's flat tensors for a joint reduction."""
        lists = self.joining.get(p.dtype)
        if lists is None:
            lists = self.joining[p.dtype] = ([], [], [], [])
        lists[0].append(p.view(-1))
        if delta is not None:
            lists[1].append(lists[0][-1])
            lists[2].append(delta.view(-1))
        if g is not None:
            lists[3].append(g.view(-1))
        self.joining_numel += p.numel()
        if self.joining_numel >= JOIN_NUMEL:
            self.reduce_joined()

    def reduce_joined(self) -> None:
        """Reduce the small tensors kept so far: one copy per dtype and kind, then one reduction
        per sum instead of one per tensor."""
        parts = self.parts
        for ps, pds, ds, gs in self.joining.values():
            p = torch.cat(ps)
            parts[_PP].append(F.sumsq(p))
            if ds:
                d = torch.cat(ds)
                parts[_PD].append(F.dot(p if len(pds) == len(ps) else torch.cat(pds), d))
                parts[_DD].append(F.sumsq(d))
            if gs:
                parts[_GG].append(F.sumsq(torch.cat(gs)))
        self.joining.clear()
        self.joining_numel = 0


def _joinable(p: Tensor, delta: Tensor | None, g: Tensor | None) -> bool:
    """A small CPU parameter whose tensors can be flattened and joined without a conversion."""
    return (p.numel() < SMALL_NUMEL and p.dtype in (torch.float32, torch.float64)
            and p.is_contiguous()
            and all(t is None or (t.dtype == p.dtype and t.is_contiguous()
                                  and t.numel() == p.numel()) for t in (delta, g)))


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
    # to back while it is in cache (bench/optimizer/optimizer_norms.py), so they are taken in the
    # loop; small tensors are joined (SMALL_NUMEL).
    buckets: dict[_dist.ShardKey | None, _Sums] = {}
    device: torch.device | None = None
    one_device = True
    use_foreach = False
    # Last parameter first: the optimizer's step has just walked them first to last, so the
    # last ones are still in cache; taken first, they are read before the others evict them.
    for p, delta in reversed(list(params)):
        pl = _dist.local(p)
        if device is None:
            device = pl.device
            use_foreach = foreach if foreach is not None else device.type != "cpu"
        elif pl.device != device:
            one_device = False
        key = _dist.shard_key(p)
        sums = buckets.get(key)
        if sums is None:
            sums = buckets[key] = _Sums()
        dl = _dist.local(delta) if delta is not None else None
        gl = _dist.local(p.grad) if p.grad is not None else None
        if use_foreach:
            sums.parts[_PP].append(pl)
            if dl is not None:
                sums.parts[_PD].append(F.dot(pl, dl))
                sums.parts[_DD].append(dl)
            if gl is not None:
                sums.parts[_GG].append(gl)
        elif pl.device.type == "cpu" and _joinable(pl, dl, gl):
            sums.join(pl, dl, gl)
        else:
            sums.reduce(pl, dl, gl)
    assert device is not None
    acc = F.accumulate_dtype(device)

    def foreach_sums(items: list[Tensor]) -> list[Tensor]:
        """Sums of squares of ``items``, one foreach norm per device and dtype."""
        groups: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
        for t in items:
            groups.setdefault((t.device, t.dtype), []).append(t)
        # Half precision is accumulated in float32, as F.sumsq does; each norm is squared in
        # ``acc``.
        return [
            torch.stack(torch._foreach_norm(group, 2, dtype=F.norm_dtype(dtype)))
            .to(device=device, dtype=acc).square().sum()
            for (_, dtype), group in groups.items()
        ]

    for sums in buckets.values():
        sums.reduce_joined()
        if use_foreach:
            for kind in (_PP, _DD, _GG):
                sums.parts[kind][:] = foreach_sums(sums.parts[kind])
    if set(buckets) == {None} and one_device:
        # No shard to combine across processes: every partial sum to the host in one read,
        # summed there in double precision.
        parts = buckets[None].parts
        if use_foreach:
            # The foreach sums are in ``acc``, the dots in the parameters' dtype: one stack and
            # cast per kind. Stacking them all at once casts value by value (on CUDA a kernel
            # launch each, a visible cost on models of many tensors).
            flat = torch.cat([torch.stack(partials).to(acc) for partials in parts if partials])
        else:
            flat = torch.stack([q for partials in parts for q in partials])
        values = flat.tolist()
        totals, start = [], 0
        for partials in parts:
            totals.append(math.fsum(values[start:start + len(partials)]))
            start += len(partials)
        pp, pd, dd, gg = totals
    else:
        pp, pd, dd, gg = _global_sums(buckets, device, acc, one_device)
    inv = 1.0 / sf_beta_prev
    if train_mode:  # p = y;  z = y + delta;  x = y + (1 - 1/beta') delta
        k_x, k_y, k_z = 1.0 - inv, 0.0, 1.0
    else:  # p = x;  y = x + (1/beta' - 1) delta;  z = x + delta / beta'
        k_x, k_y, k_z = 0.0, inv - 1.0, inv

    def norm(k: float) -> float:
        return math.sqrt(max(pp + 2.0 * k * pd + k * k * dd, 0.0))

    return {"x_l2": norm(k_x), "y_l2": norm(k_y), "z_l2": norm(k_z), "grad_l2": math.sqrt(gg)}


def _global_sums(buckets: dict[_dist.ShardKey | None, _Sums], device: torch.device,
                 acc: torch.dtype, one_device: bool) -> list[float]:
    """The four sums over every shard key, sharded ones combined across processes."""
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
    for key, sums in buckets.items():
        vector = torch.stack([total(kind) for kind in sums.parts])
        if key is None:
            replicated += vector
        else:
            sharded[key] = vector
    _, values = _dist.fetch_global(None, replicated, sharded)
    return values
