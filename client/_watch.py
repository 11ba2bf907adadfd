"""``Monitor.watch()``: the optimizer hook, and the run-config keys an optimizer contributes.

The hook runs in the training thread after every ``optimizer.step()``: it only appends a
reference to the statistics the optimizer's step made (ScheduleFree+'s ``step_stats``, not
copied; names are mapped and values checked later, in the batcher thread), so watching costs a
few operations per step. With the step size on the device (ScheduleFree+'s default on an
accelerator) most of those values are 0-d device tensors: the batcher thread reads them with
the rest of its batch, and the training thread never waits for the device.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from curvecast.client._batcher import KeyMap, Record
from curvecast.client._validate import check_key, check_value

log = logging.getLogger("curvecast.client")


@dataclass(eq=False, slots=True)
class Sink:
    """Where the optimizer hooks put each step's statistics: the monitor's buffer (shared with
    ``Monitor.log``). The hook appends ``(step, wall time, stats, key map)`` records itself, in
    one frame: run once per training step, its code and data are out of the CPU caches, so each
    further call or object touched costs more than its instructions. Points are counted when
    the batcher drains the buffer, not here.

    Attributes:
        buffer: the monitor's record buffer (drained by the batcher thread).
        wall: the source of each point's wall time.
        wake_at: buffer length at which to call ``on_full``.
        on_full: ``Monitor._buffer_filling`` (wakes the batcher; bounds memory).
        open: False once the monitor finishes: the hooks stop appending.
        step: the step of the hook's last record, and ``wall_time`` its wall time: a
            ``log()`` at that step takes the same time (one clock reading per step).
    """

    buffer: deque[Record]
    wall: Callable[[], float]
    wake_at: int
    on_full: Callable[[], None]
    open: bool = True
    step: int = -1
    wall_time: float = 0.0


def watch_optimizer(
    optimizer: Any,
    sink: Sink,
    *,
    norms_every: int,
    prefix: str,
    step_fn: Callable[[], int] | None,
) -> Any:
    """Register the hook that records ``optimizer``'s telemetry after every step.

    Args:
        optimizer: a ``torch.optim.Optimizer``; ScheduleFree+ (anything with ``stats()``) logs
            its statistics, any other its learning rate(s).
        sink: where each step's statistics go (the monitor's).
        norms_every: also log the weight and gradient norms every this many steps (0: never).
        prefix: prefix of the metric names.
        step_fn: returns the step to log at; default: the optimizer's own count.

    Returns:
        The hook handle; ``handle.remove()`` stops logging.

    Raises:
        TypeError: ``optimizer`` cannot take a step hook.
        ValueError: a negative ``norms_every``, or a prefix that makes invalid names.
    """
    register = getattr(optimizer, "register_step_post_hook", None)
    if not callable(register):
        raise TypeError(f"watch() needs a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if norms_every < 0:
        raise ValueError(f"norms_every must be >= 0, got {norms_every}")
    check_key(prefix + "x")  # a bad prefix fails here, in the caller's thread
    keymap = KeyMap(prefix, skip=("step",))
    names: dict[str, str] = {}
    buffer, wall, wake_at, on_full = sink.buffer, sink.wall, sink.wake_at, sink.on_full
    append = buffer.append

    def name(stat: str) -> str:
        full = names.get(stat)
        if full is None:
            full = names[stat] = check_key(prefix + stat)
        return full

    def put(step: int, metrics: Mapping[str, Any], keys: KeyMap | None) -> None:
        """One record (the per-step path of ``step_stats_hook`` spells this out inline)."""
        if sink.open:
            append((step, wall(), metrics, keys))
            if len(buffer) >= wake_at:
                on_full()

    def put_norms(opt: Any, step: int, stats: Mapping[str, Any]) -> None:
        # A record of their own: the per-step records keep the same keys, which is what lets
        # the batcher turn them into columns in one go.
        norms = {k: v for k, v in opt.stats(norms=True).items() if k not in stats}
        if norms:
            put(step, norms, keymap)

    # Mutable cells the closures share: the step count since watch(), and whether a failure
    # was already reported (a broken hook logs once, not every step).
    counter = [0]
    failed = [False]

    def report_failure(what: str) -> None:
        if not failed[0]:
            failed[0] = True
            log.exception("curvecast: reading the optimizer's %s failed (ignored)", what)

    def step_stats_hook(opt: Any, _args: Any, _kwargs: Any) -> None:
        # ScheduleFree+: runs after every step and only appends a reference to the step's
        # statistics (floats, or 0-d device tensors nobody has read yet; names are mapped and
        # values read and checked in the batcher thread), in one frame.
        try:
            stats = opt.step_stats
            if not stats or not sink.open:
                return
            step = step_fn() if step_fn else int(stats["step"])
            sink.step = step
            now = sink.wall_time = wall()
            append((step, now, stats, keymap))
            if len(buffer) >= wake_at:
                on_full()
            if norms_every and step % norms_every == 0:
                put_norms(opt, step, stats)
        except Exception:
            report_failure("stats")

    def stats_hook(opt: Any, _args: Any, _kwargs: Any) -> None:
        # Any other optimizer with a stats() method (a copy per step).
        try:
            counter[0] += 1
            stats = opt.stats()
            if not stats or not sink.open:
                return
            step = step_fn() if step_fn else int(stats.get("step") or counter[0])
            put(step, stats, keymap)
            if norms_every and step % norms_every == 0:
                put_norms(opt, step, stats)
        except Exception:
            report_failure("stats")

    def lr_hook(opt: Any, _args: Any, _kwargs: Any) -> None:
        try:
            counter[0] += 1
            step = step_fn() if step_fn else counter[0]
            groups = opt.param_groups
            if len(groups) == 1:
                lrs = {name("lr"): groups[0]["lr"]}
            else:
                lrs = {name(f"lr/{i}"): g["lr"] for i, g in enumerate(groups)}
            for key, value in lrs.items():
                if type(value) is not float:  # a tensor LR: checked like a logged value
                    lrs[key] = check_value(key, value)
            put(step, lrs, None)
        except Exception:
            report_failure("learning rate")

    # ScheduleFree+'s step_stats: the same values as stats(), without a copy per step.
    if isinstance(getattr(type(optimizer), "step_stats", None), property):
        return register(step_stats_hook)
    return register(stats_hook if callable(getattr(optimizer, "stats", None)) else lr_hook)


def optimizer_config(optimizer: Any) -> dict[str, Any]:
    """The run-config keys describing an optimizer.

    Every optimizer is described the same way: ``"optimizer": {"name": <class name>, <its
    hyper-parameters>}``. ScheduleFree+ (anything with a ``config()`` method) contributes
    ``config()`` there (its ``"optimizer"`` entry becomes ``"name"``) and the keys the service
    reads (``weight_decay`` = AdamC lambda, ``c_warmup``, ``warmup_steps``) at the top level.
    Other optimizers contribute their JSON-safe defaults under ``"optimizer"`` only (their
    ``weight_decay`` is not on the AdamC scale).
    """
    config_fn = getattr(optimizer, "config", None)
    if callable(config_fn):
        cfg = dict(config_fn())
        name = cfg.pop("optimizer", None)
        cfg = {"name": name if isinstance(name, str) else type(optimizer).__name__, **cfg}
        out: dict[str, Any] = {"optimizer": cfg}
        for key in ("weight_decay", "c_warmup", "warmup_steps"):
            if cfg.get(key) is not None:
                out[key] = cfg[key]
        return out
    defaults = getattr(optimizer, "defaults", {}) or {}
    safe: dict[str, Any] = {"name": type(optimizer).__name__}
    for key, value in defaults.items():
        if isinstance(value, bool | str | None):
            safe[key] = value
        elif isinstance(value, int | float) and value == value and abs(value) != float("inf"):
            safe[key] = value
        elif isinstance(value, tuple | list) and all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in value
        ):
            safe[key] = list(value)
    return {"optimizer": safe}
