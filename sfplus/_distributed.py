"""Distributed plumbing: local views of sharded tensors and the one collective a step needs.

ScheduleFree+ couples every parameter through three scalars: the loss ``F``, ``||g||_1`` and
``<g, z - x>``. How each must be combined across processes depends on how the model is split:

* **Data parallel (DDP)**: parameters and (after DDP's all-reduce) gradients are identical on
  every rank, so ``||g||_1`` and the inner product are already global; only the loss differs
  (each rank saw its own batch) and is averaged over the data-parallel group.
* **Sharded (DTensor: FSDP2, tensor parallel)**: every rank holds a slice; sums over the slices
  are added up across the mesh dimensions along which the tensor is sharded (``Shard``/``Partial``
  placements), and left alone along ``Replicate`` dimensions.

Everything is packed into as few 1-D float64 tensors as possible; the host-scalar path then
fetches them with a single ``tolist()`` (its only device-to-host synchronisation of a step), the
device-scalar path keeps them on the device (:func:`combine_global`). Works with gloo (CPU) and
NCCL alike; gloo has no ``ReduceOp.AVG``, so averages are sums divided by the group size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

_DTensor: type | None
try:  # DTensor is public from torch 2.4; keep the optimizer importable without it.
    from torch.distributed.tensor import DTensor as _DTensor
except ImportError:  # pragma: no cover - depends on the torch build
    _DTensor = None

#: Identifies how a sharded tensor's partial sums must be combined: its device mesh and the mesh
#: dimensions along which it is split. ``None`` means "replicated or not distributed".
ShardKey = tuple[Any, tuple[int, ...]]

__all__ = ["ShardKey", "combine_global", "fetch_global", "is_active", "local", "shard_key"]


def local(t: Tensor) -> Tensor:
    """The plain tensor holding this process's data: the local shard of a DTensor, else ``t``.

    Under ``torch.no_grad()`` this is the shard's own storage, so in-place updates stick.
    """
    if _DTensor is not None and isinstance(t, _DTensor):
        dt: Any = t
        local_tensor: Tensor = dt.to_local()
        return local_tensor
    return t


def shard_key(t: Tensor) -> ShardKey | None:
    """How partial sums over ``t``'s local data combine into a global sum (see :data:`ShardKey`)."""
    if _DTensor is None or not isinstance(t, _DTensor):
        return None
    dt: Any = t
    dims = tuple(i for i, p in enumerate(dt.placements) if p.is_shard() or p.is_partial())
    if not dims:
        return None
    return (dt.device_mesh, dims)


def is_active(group: Any = None) -> bool:
    """True when ``torch.distributed`` is initialised and ``group`` spans more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def fetch_global(
    means: Tensor | None,
    replicated: Tensor,
    sharded: Mapping[ShardKey, Tensor],
    *,
    group: Any = None,
) -> tuple[list[float], list[float]]:
    """Combine local scalars across processes and fetch them to the host in one transfer.

    Args:
        means: values to average over ``group`` (the per-rank loss), or ``None``.
        replicated: 1-D sums over tensors that are identical on every rank (already global).
        sharded: 1-D partial sums over local shards, keyed by :func:`shard_key`; same length as
            ``replicated``.
        group: the data-parallel process group for ``means`` (``None``: the default group).

    Returns:
        ``(mean_values, sum_values)`` as Python floats.
    """
    mean_vals, total = combine_global(means, replicated, sharded, group=group)
    return _split(torch.cat([mean_vals, total]).tolist(), mean_vals.numel())


def combine_global(
    means: Tensor | None,
    replicated: Tensor,
    sharded: Mapping[ShardKey, Tensor],
    *,
    group: Any = None,
) -> tuple[Tensor, Tensor]:
    """:func:`fetch_global` without the fetch: the averaged ``means`` (empty if ``None``) and
    the global sums, as tensors on ``replicated``'s device. The collectives are enqueued like
    any other operation; nothing is read on the host.
    """
    device = replicated.device
    total = replicated.clone()
    if not (dist.is_available() and dist.is_initialized()):
        for part in sharded.values():
            total += part.to(device)
        mean_vals = means.to(device) if means is not None else replicated.new_zeros(0)
        return mean_vals, total

    world = dist.get_world_size(group)
    # Sums whose sharding group is the whole data-parallel group (the common 1-D FSDP2 mesh)
    # ride along in the loss's all-reduce; anything else gets its own, one per mesh dimension.
    riding: list[Tensor] = []
    for (mesh, dims), part in sharded.items():
        groups = [mesh.get_group(d) for d in dims]
        spans_world = dist.get_world_size(groups[0]) == dist.get_world_size()
        if group is None and len(groups) == 1 and spans_world:
            riding.append(part.to(device))
            continue
        buf = part.to(device).clone()
        for g in groups:
            dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=g)
        total += buf
    mean_vals = means.to(device) if means is not None else replicated.new_zeros(0)
    n_mean = mean_vals.numel()
    if world > 1 and (n_mean or riding):
        riding_sum = torch.stack(riding).sum(0) if riding else replicated.new_zeros(0)
        packed = torch.cat([mean_vals, riding_sum])
        dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)
        mean_vals = packed[:n_mean] / world
        if riding:
            total += packed[n_mean:]
    elif riding:
        total += torch.stack(riding).sum(0)
    return mean_vals, total


def _split(values: Sequence[float], n: int) -> tuple[list[float], list[float]]:
    return list(values[:n]), list(values[n:])
