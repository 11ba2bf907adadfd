"""``Monitor.watch()``: the optimizer hook, and the run-config keys an optimizer contributes.

The hook runs in the training thread after every ``optimizer.step()``: it only appends a
reference to the statistics the optimizer already has on the host (ScheduleFree+'s
``step_stats``, not copied; names are mapped and values checked later, in the batcher thread),
so watching costs a few operations per step.
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
    further call or object touched costs more than its instructions.

    Attributes:
        buffer: the monitor's record buffer (drained by the batcher thread).
        wall: the source of each point's wall time.
        wake_at: buffer length at which to call ``on_full``.
        on_full: ``Monitor._buffer_filling`` (wakes the batcher; bounds memory).
        open: False once the monitor finishes: the hooks stop appending.
        points: points appended by the hooks (``Monitor.stats()`` adds them to
            ``points_logged``).
    """

    buffer: deque[Record]
    wall: Callable[[], float]
    wake_at: int
    on_full: Callable[[], None]
    open: bool = True
    points: int = 0


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

    def put(step: int, metrics: Mapping[str, Any], keys: KeyMap | None, points: int) -> None:
        """One record (the per-step path of ``sfplus_hook`` spells this out inline)."""
        if sink.open:
            sink.points += points
            append((step, wall(), metrics, keys))
            if len(buffer) >= wake_at:
                on_full()

    # Mutable cells the closures share: the step count since watch(), and whether a failure
    # was already reported (a broken hook logs once, not every step).
    counter = [0]
    failed = [False]

    def sfplus_hook(opt: Any, _args: Any, _kwargs: Any) -> None:
        # Runs after every step: it only appends a reference to the step's statistics (names
        # are mapped and values checked in the batcher thread). Kept to one frame.
        try:
            counter[0] += 1
            stats = opt.step_stats if view else opt.stats()
            if not stats or not sink.open:
                return
            step = step_fn() if step_fn else int(stats.get("step") or counter[0])
            sink.points += len(stats) - ("step" in stats)  # the key map skips "step"
            append((step, wall(), stats, keymap))
            if len(buffer) >= wake_at:
                on_full()
            if norms_every and step % norms_every == 0:
                # A record of their own: the per-step records keep the same keys, which is
                # what lets the batcher turn them into columns in one go.
                norms = {k: v for k, v in opt.stats(norms=True).items() if k not in stats}
                if norms:
                    put(step, norms, keymap, len(norms))
        except Exception:
            if not failed[0]:
                failed[0] = True
                log.exception("curvecast: reading the optimizer's stats failed (ignored)")

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
            put(step, lrs, None, len(lrs))
        except Exception:
            if not failed[0]:
                failed[0] = True
                log.exception("curvecast: reading the learning rate failed (ignored)")

    is_sfplus = callable(getattr(optimizer, "stats", None))
    # ScheduleFree+'s step_stats: the same values as stats(), without a copy per step.
    view = isinstance(getattr(type(optimizer), "step_stats", None), property)
    return register(sfplus_hook if is_sfplus else lr_hook)


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
