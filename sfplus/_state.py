"""Where ScheduleFree+ keeps its state, and the tensors of one parameter group that a step uses.

Moved out of :mod:`curvecast.sfplus.optimizer`, which reads and writes the state through these
names. The layout is part of every checkpoint (``state_dict()``), so the keys never change:

* per parameter: ``step`` (:data:`STEP`, an int), ``exp_avg``, ``exp_avg_sq`` and ``z_minus_y``
  (:data:`DELTA`), created on the parameter's first step with a gradient;
* optimizer-wide scalars: one dict (:func:`new_global`) under :data:`GLOBAL` in the first
  parameter's state, the pattern torch's own LBFGS uses: it then travels with
  ``state_dict()``/``load_state_dict()`` and survives FSDP/DCP state-dict round trips, which only
  know about per-parameter state and groups.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from curvecast.sfplus import _distributed as _dist

__all__ = ["DELTA", "GLOBAL", "STEP", "GroupWork", "cover_groups", "gather", "new_global"]

#: Per-parameter state: ``z - y`` (``x`` is never stored because ``z - y = beta (z - x)``).
DELTA = "z_minus_y"
#: Per-parameter state: the steps this parameter took (its Adam bias correction).
STEP = "step"
#: The key of the optimizer-wide dict in the first parameter's state.
GLOBAL = "sfplus"


def new_global(sf_beta: float) -> dict[str, Any]:
    """The optimizer-wide scalars before the first step, as plain Python numbers.

    Args:
        sf_beta: the SF beta of the first parameter group (the one that "formed" ``y = x = z``).
    """
    return {
        "step": 0,
        "denom_ema": 0.0,
        "denom_ema_weight": 0.0,
        "sf_beta_prev": sf_beta,
        "train_mode": True,
        "gamma_max": [],
        "weight_sum": [],
    }


def cover_groups(glob: dict[str, Any], param_groups: list[dict[str, Any]]) -> None:
    """Give parameter groups without per-group scalars their initial ones, in place.

    Groups added after construction get them here, on first use: ``gamma_max`` starts at the
    group's ``eps`` and the averaging weights' sum at 0.
    """
    while len(glob["gamma_max"]) < len(param_groups):
        glob["gamma_max"].append(float(param_groups[len(glob["gamma_max"])]["eps"]))
    while len(glob["weight_sum"]) < len(param_groups):
        glob["weight_sum"].append(0.0)


@dataclass(slots=True)
class GroupWork:
    """The tensors one parameter group contributes to a step (local shards); see :func:`gather`.

    The first lists are parallel, one entry per parameter with a gradient; ``skipped_*`` hold
    the parameters without a gradient that already have state (``y`` must follow a changing
    SF beta even for them).
    """

    params: list[Tensor] = field(default_factory=list)
    grads: list[Tensor] = field(default_factory=list)
    exp_avgs: list[Tensor] = field(default_factory=list)
    exp_avg_sqs: list[Tensor] = field(default_factory=list)
    deltas: list[Tensor] = field(default_factory=list)
    #: ``deltas``, with None for a freshly created (so known-zero) one: its dot product is skipped.
    reduction_deltas: list[Tensor | None] = field(default_factory=list)
    #: Each parameter's Adam step count, this step included.
    steps: list[int] = field(default_factory=list)
    states: list[dict[str, Any]] = field(default_factory=list)
    keys: list[_dist.ShardKey | None] = field(default_factory=list)
    skipped_params: list[Tensor] = field(default_factory=list)
    skipped_deltas: list[Tensor] = field(default_factory=list)

    def by_shard(self) -> dict[_dist.ShardKey | None, list[int]]:
        """Indices of the parameters, by how their partial sums combine (their shard key)."""
        out: dict[_dist.ShardKey | None, list[int]] = defaultdict(list)
        for i, key in enumerate(self.keys):
            out[key].append(i)
        return out

    def count_step(self) -> None:
        """Record that every parameter with a gradient took this step."""
        for state in self.states:
            state[STEP] += 1


def gather(params: list[Tensor], state: defaultdict[Tensor, Any]) -> GroupWork:
    """Collect a group's tensors for a step, creating the state of parameters new to it.

    Args:
        params: the group's parameters.
        state: the optimizer's per-parameter state (``optimizer.state``).

    Raises:
        RuntimeError: for a sparse gradient.
    """
    w = GroupWork()
    for p in params:
        if p.grad is None:
            # .get, not [], so that parameters without gradients get no empty state entry.
            skipped = state.get(p, {})
            if DELTA in skipped:
                w.skipped_params.append(_dist.local(p))
                w.skipped_deltas.append(_dist.local(skipped[DELTA]))
            continue
        if p.grad.is_sparse:
            raise RuntimeError("ScheduleFreePlus does not support sparse gradients")
        st = state[p]
        fresh = DELTA not in st
        if fresh:
            st[STEP] = 0
            st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st[DELTA] = torch.zeros_like(p, memory_format=torch.preserve_format)
        delta = _dist.local(st[DELTA])
        w.params.append(_dist.local(p))
        w.grads.append(_dist.local(p.grad))
        w.exp_avgs.append(_dist.local(st["exp_avg"]))
        w.exp_avg_sqs.append(_dist.local(st["exp_avg_sq"]))
        w.deltas.append(delta)
        w.reduction_deltas.append(None if fresh else delta)
        w.steps.append(int(st[STEP]) + 1)
        w.states.append(st)
        w.keys.append(_dist.shard_key(p))
    return w
