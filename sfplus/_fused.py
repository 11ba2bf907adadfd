"""The fused update via ``torch.compile``: one compiled call per step for every float32 and
float64 tensor (:func:`update_many_`), one per tensor for the others (:func:`update_`).

The eager paths of :func:`curvecast.sfplus.functional.update` issue about eleven elementwise
operations per tensor, each a pass over memory (the CPU path walks cache-sized blocks to soften
that). Compiled by TorchInductor, the same arithmetic becomes one loop that reads ``y, g, m, v,
delta`` once and writes ``y, m, v, delta`` once. The one-call graph is compiled once per
parameter list, with the step's scalars as a tensor input; the per-tensor kernel once per dtype
and device, with a dynamic length (every tensor is passed flattened) and float inputs. Neither
recompiles for a new step size.

Compiling takes tens of seconds the first time (Inductor caches its output on disk, so later
processes are faster) and needs a C++ compiler on CPU. When it is unavailable or fails,
the update falls back to the eager per-tensor path with one warning; results differ only by float
rounding (the parity tests hold it to 1e-6 in float64).

With the step size on the device (``device_scalars``), :func:`step_many_` is the whole step in
one compiled call: the two global sums (one pass over ``g`` and ``delta``), the Polyak step and
the averaging weight (:func:`curvecast.sfplus._device.step_scalars`, on a few scalars) and the
update (one pass over every buffer), for tensors of any floating dtype together. Everything that
changes from step to step reaches it as a tensor, so it compiles once per parameter list and is
capturable in a CUDA graph (``compile_mode="reduce-overhead"``).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from curvecast.sfplus._device import ROW_FIELDS, row_table, step_scalars

__all__ = [
    "FUSED_MIN_NUMEL", "disable", "fused_kernel", "fused_many_kernel", "run", "run_many",
    "run_step", "step_kernel", "step_many_", "update_", "update_many_",
]

#: Tensors smaller than this take the eager path: a compiled call costs tens of microseconds of
#: Python and guard overhead, more than the eager operations on a few thousand elements.
FUSED_MIN_NUMEL = 1 << 15

_lock = threading.Lock()
#: The compiled form of each update function (and compile mode), made at its first use.
_compiled: dict[Any, Callable[..., Any]] = {}
_failed: str | None = None


def update_(
    y: Tensor,
    g: Tensor,
    m: Tensor,
    v: Tensor,
    d: Tensor,
    one_minus_beta1: float,
    beta2: float,
    one_minus_beta2: float,
    eps_eff: float,
    wd_fold: float,
    y_delta: float,
    y_dir: float,
    delta_keep: float,
    delta_dir: float,
) -> None:
    """The update of one flattened tensor, in place (the eager maths of ``_update_block``).

    With ``T = m_new / (sqrt(v_new) + eps_eff) + wd_fold * y``::

        m     <- m + one_minus_beta1 (g - m)
        v     <- beta2 v + one_minus_beta2 g^2
        y     <- y + y_delta delta + y_dir T
        delta <- delta_keep delta + delta_dir T
    """
    m_new = torch.lerp(m, g, one_minus_beta1)
    v_new = v * beta2 + g * g * one_minus_beta2
    t = m_new / (v_new.sqrt() + eps_eff) + y * wd_fold
    y_new = y + d * y_delta + t * y_dir
    d_new = d * delta_keep + t * delta_dir
    m.copy_(m_new)
    v.copy_(v_new)
    y.copy_(y_new)
    d.copy_(d_new)


def update_many_(
    ys: list[Tensor], gs: list[Tensor], ms: list[Tensor], vs: list[Tensor], ds: list[Tensor],
    k: Tensor,
) -> None:
    """:func:`update_` of every tensor of the lists, with the step's nine scalars in the 1-D
    tensor ``k`` (in :func:`update_`'s order), on the tensors' device.

    Compiled, one call runs every tensor's loop (CPU) or kernel (CUDA) from one graph, where
    a compiled call per tensor cost more in Python and guards than many tensors' work
    (BENCHMARKS.md, "optimizer_cuda"). The scalars are
    data, so a new step size is not a recompile; the graph is compiled once per parameter list.
    """
    for y, g, m, v, d in zip(ys, gs, ms, vs, ds, strict=True):
        m_new = torch.lerp(m, g, k[0])
        v_new = v * k[1] + g * g * k[2]
        t = m_new / (v_new.sqrt() + k[3]) + y * k[4]
        y_new = y + d * k[5] + t * k[6]
        d_new = d * k[7] + t * k[8]
        m.copy_(m_new)
        v.copy_(v_new)
        y.copy_(y_new)
        d.copy_(d_new)


def step_many_(
    ys: list[Tensor], gs: list[Tensor], ms: list[Tensor], vs: list[Tensor], ds: list[Tensor],
    h: Tensor, state: Tensor, loss: Tensor, sums: Tensor | None, *,
    updated: tuple[int, ...], tensor_rows: tuple[int, ...], groups: int, rows: tuple[int, ...],
) -> tuple[Tensor, Tensor]:
    """One ScheduleFree+ step with the step size on the device, for every tensor with a gradient.

    Args:
        ys, gs, ms, vs, ds: parameters (``y``), gradients, Adam's moments and ``z - y`` of every
            tensor with a gradient, of any floating dtype.
        h: the host-known values of the step (:func:`curvecast.sfplus._step.host_vector`).
        state: the device scalars (:class:`curvecast.sfplus._device.DeviceState`), updated in
            place.
        loss: the loss (0-d or one element; averaged across ranks already).
        sums: ``[||g||_1, <g, z - y>]`` when the caller reduced them (sharded parameters); else
            computed here over ``gs`` and ``ds`` in ``h``'s dtype, one pass over both.
        updated: the indices of the tensors to update here (the others belong to parameter
            groups without ``fused``; they are only reduced).
        tensor_rows: the row of ``h``'s row table (and of the coefficients) of each updated
            tensor.
        groups: the number of parameter groups.
        rows: the parameter group of each row.

    Returns:
        ``(stats, coefficients)`` as :func:`curvecast.sfplus._device.step_scalars` returns them,
        for the step's statistics and for updating the tensors not updated here.
    """
    acc = h.dtype
    if sums is None:
        l1 = torch.stack([g.abs().sum(dtype=acc) for g in gs]).sum()
        dot = torch.stack([(g.to(acc) * d.to(acc)).sum() for g, d in zip(gs, ds, strict=True)])
        sums = torch.stack([l1, dot.sum()])
    coefficients, new_state, stats = step_scalars(h, state, sums, loss, groups=groups, rows=rows)
    state.copy_(new_state)
    table = row_table(h, groups=groups, rows=len(rows))
    for i, row in zip(updated, tensor_rows, strict=True):
        _update_one(ys[i], gs[i], ms[i], vs[i], ds[i], coefficients[row], table[row])
    return stats, coefficients


def _update_one(
    y: Tensor, g: Tensor, m: Tensor, v: Tensor, d: Tensor, coef: Tensor, row: Tensor
) -> None:
    """One tensor's update, in float32 (float64 for float64 tensors) whatever its storage."""
    op = torch.float64 if y.dtype == torch.float64 else torch.float32
    coef, row = coef.to(op), row.to(op)
    wd_fold, y_delta, y_dir, delta_dir = coef[0], coef[1], coef[2], coef[3]
    eps_eff = row[ROW_FIELDS.index("eps_eff")]
    one_minus_beta1 = row[ROW_FIELDS.index("one_minus_beta1")]
    beta2 = row[ROW_FIELDS.index("beta2")]
    one_minus_beta2 = row[ROW_FIELDS.index("one_minus_beta2")]
    y32, g32, m32, v32, d32 = y.to(op), g.to(op), m.to(op), v.to(op), d.to(op)
    m_new = torch.lerp(m32, g32, one_minus_beta1)
    v_new = v32 * beta2 + g32 * g32 * one_minus_beta2
    t = m_new / (v_new.sqrt() + eps_eff) + y32 * wd_fold
    y_new = y32 + d32 * y_delta + t * y_dir
    d_new = d32 - d32 * y_delta + t * delta_dir
    m.copy_(m_new)
    v.copy_(v_new)
    y.copy_(y_new)
    d.copy_(d_new)


def step_kernel(mode: str | None = None) -> Callable[..., tuple[Tensor, Tensor]] | None:
    """The compiled :func:`step_many_` (with ``torch.compile``'s ``mode``), or ``None`` when
    compilation is unavailable here. Static shapes: one graph per parameter list."""
    return _compiled_once(step_many_, dynamic=False, mode=mode)


def fused_many_kernel() -> Callable[..., None] | None:
    """The compiled :func:`update_many_`, or ``None`` when compilation is unavailable here."""
    return _compiled_once(update_many_)


def fused_kernel() -> Callable[..., None] | None:
    """The compiled :func:`update_`, or ``None`` when compilation is unavailable here."""
    return _compiled_once(update_, dynamic=True)


def _compiled_once(fn: Callable[..., Any], *, dynamic: bool | None = None,
                   mode: str | None = None) -> Callable[..., Any] | None:
    """``torch.compile(fn, fullgraph=True, dynamic=dynamic, mode=mode)``, made once per process
    (and mode); ``None`` once compilation has failed here."""
    if _failed is not None:
        return None
    key: Any = fn if mode is None else (fn, mode)
    with _lock:
        kernel = _compiled.get(key)
        if kernel is None:
            kernel = _compiled[key] = torch.compile(fn, fullgraph=True, dynamic=dynamic,
                                                    mode=mode)
        return kernel


def disable(reason: BaseException | str) -> None:
    """Stop using the compiled kernel in this process, saying why once."""
    global _failed
    if _failed is None:
        _failed = str(reason) or type(reason).__name__
        warnings.warn(
            f"ScheduleFreePlus(fused=True): torch.compile is unavailable here ({_failed[:300]}); "
            f"using the eager update instead (same results up to float rounding)",
            RuntimeWarning,
            stacklevel=4,  # disable <- _call <- run <- the update
        )


def run(kernel: Callable[..., None], tensors: tuple[Tensor, ...], scalars: Any) -> bool:
    """Call the compiled kernel on flattened tensors; ``False`` (and disabled) if it fails to
    compile. A compilation error is raised before the kernel writes anything."""
    return _call(kernel, *(t.view(-1) for t in tensors), *scalars)[0]


def run_many(kernel: Callable[..., None], lists: tuple[list[Tensor], ...], k: Tensor) -> bool:
    """:func:`run` for :func:`update_many_`: ``False`` (and disabled) if it fails to compile."""
    return _call(kernel, *lists, k)[0]


def run_step(kernel: Callable[..., tuple[Tensor, Tensor]], *args: Any,
             **kwargs: Any) -> tuple[Tensor, Tensor] | None:
    """Call the compiled :func:`step_many_`; ``None`` (and disabled) if it fails to compile,
    before anything was written."""
    ok, result = _call(kernel, *args, **kwargs)
    return result if ok else None


def _call(kernel: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[bool, Any]:
    try:
        result = kernel(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - any compiler failure means "not here"
        if not _is_compile_error(exc):
            raise
        disable(exc)
        return False, None
    return True, result


def _is_compile_error(exc: BaseException) -> bool:
    module = type(exc).__module__
    return module.startswith(("torch._dynamo", "torch._inductor")) or isinstance(
        exc, (OSError, ImportError, NotImplementedError)
    )
