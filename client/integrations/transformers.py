"""Hugging Face ``transformers`` integration: ``CurvecastCallback`` for the ``Trainer``.

Usage::

    from curvecast.client.integrations.transformers import CurvecastCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[CurvecastCallback(project="lm", run_name="bert-small")])
    trainer.train()

Logs everything the Trainer logs (``loss``, ``learning_rate``, ``grad_norm``, ...; evaluation
metrics ``eval_*`` become ``eval/*``) at ``state.global_step``, and watches the optimizer
(ScheduleFree+ telemetry, or learning rates) on the main process. A monitor this callback
creates is finished when training ends (``finish_on_train_end``); pass your own ``Monitor`` to
keep logging afterwards (``trainer.evaluate()``).

Note: the ``Trainer`` calls ``optimizer.step()`` without arguments, and ScheduleFree+ needs the
loss for its Polyak step, so using ScheduleFree+ under the ``Trainer`` needs a ``Trainer`` that
passes it; the telemetry is then logged like any other optimizer's.
"""

from __future__ import annotations

import logging
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from curvecast.client._monitor import Monitor
from curvecast.client.integrations._common import json_safe, scalar_metrics, unwrap_optimizer

__all__ = ["CurvecastCallback"]

log = logging.getLogger("curvecast.client")


class CurvecastCallback(TrainerCallback):
    """Stream a ``transformers.Trainer`` run to curvecast.

    Args:
        monitor: a monitor to use. Default: one is created on the main process from
            ``monitor_kwargs`` (config defaults to the ``TrainingArguments``, ``total_steps`` to
            ``state.max_steps``).
        watch: watch the optimizer (``Monitor.watch``).
        finish_on_train_end: finish a monitor this callback created when training ends.
        **monitor_kwargs: passed to :class:`~curvecast.client.Monitor` (``url``, ``project``, ...).
    """

    def __init__(
        self,
        monitor: Monitor | None = None,
        *,
        watch: bool = True,
        finish_on_train_end: bool = True,
        **monitor_kwargs: Any,
    ) -> None:
        self.monitor = monitor
        self._owns_monitor = monitor is None
        self._monitor_kwargs = monitor_kwargs
        self._watch = watch
        self._finish = finish_on_train_end
        self._handle: Any = None

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        optimizer: Any = None,
        **kwargs: Any,
    ) -> None:
        """Create the monitor (main process) and watch the optimizer."""
        if not state.is_world_process_zero:
            return
        if self.monitor is None:
            options = dict(self._monitor_kwargs)
            # to_dict() masks secrets such as hub_token.
            trainer_args = args.to_dict()  # type: ignore[no-untyped-call]
            options.setdefault("config", {"trainer": json_safe(trainer_args)})
            if state.max_steps and state.max_steps > 0:
                options.setdefault("total_steps", int(state.max_steps))
            options.setdefault("run_name", args.run_name or None)
            self.monitor = Monitor(**options)
        if self._watch and optimizer is not None and self._handle is None:
            # The post-step hook runs before the Trainer increments global_step.
            self._handle = self.monitor.watch(
                unwrap_optimizer(optimizer), step_fn=lambda: state.global_step + 1
            )

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Log the Trainer's logs at ``state.global_step``."""
        monitor = self.monitor
        if monitor is None or monitor.finished or not logs:
            return
        rename = {k: "eval/" + k[len("eval_") :] for k in logs if k.startswith("eval_")}
        metrics = scalar_metrics(logs.items(), rename)
        if metrics:
            monitor.log(int(state.global_step), metrics)

    def on_train_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        """Stop watching; finish a monitor this callback created."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if self.monitor is not None and self._owns_monitor and self._finish:
            if not self.monitor.finished:
                self.monitor.finish()
