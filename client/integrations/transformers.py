"""Hugging Face ``transformers`` integration: ``CurvecastCallback`` for the ``Trainer``.

Usage::

    from curvecast import ScheduleFreePlus
    from curvecast.client.integrations.transformers import CurvecastCallback

    opt = ScheduleFreePlus(model.parameters())
    args = TrainingArguments(..., lr_scheduler_type="constant",    # schedule-free: no decay
                             max_grad_norm=0)                       # no clipping (see below)
    trainer = Trainer(model=model, args=args, train_dataset=ds, optimizers=(opt, None),
                      callbacks=[CurvecastCallback(project="lm", run_name="bert-small")])
    trainer.train()

Logs everything the Trainer logs (``loss``, ``learning_rate``, ``grad_norm``, ...; evaluation
metrics ``eval_*`` become ``eval/*``) at ``state.global_step``, and watches the optimizer
(ScheduleFree+ telemetry, or learning rates) on the main process. A monitor this callback
creates is finished when training ends (``finish_on_train_end``); pass your own ``Monitor`` to
keep logging afterwards (``trainer.evaluate()``).

ScheduleFree+ under the Trainer, on every rank:

* **The loss reaches the Polyak step.** The Trainer calls ``optimizer.step()`` with no
  arguments. The callback records the loss the model returns for each training micro-batch (a
  forward hook) and, just before the optimizer step, hands the step's loss to
  :meth:`~curvecast.sfplus.ScheduleFreePlus.provide_loss`: the mean over the
  gradient-accumulation micro-batches -- the value the Trainer itself logs as ``loss``. When the
  Trainer normalises the loss by the number of label tokens of the whole step (models that take
  ``num_items_in_batch``), each micro-batch's loss is already its share and they are summed.
  A loss computed outside the model (``label_smoothing_factor``, ``compute_loss_func``) is not
  seen: training then stops with an error that says so.
* **x for evaluation and saving, y for training.** Before a step's evaluation or checkpoint
  the callback switches the optimizer to ``eval()`` (the parameters hold the averaged point x,
  which is what should be evaluated and shipped), back to ``train()`` when the next step begins,
  and leaves x in the model when training ends, as the Lightning callback does. Resuming from
  such a checkpoint is exact: the optimizer's state records which point the model holds.
* **No schedule.** A learning-rate scheduler multiplies ScheduleFree+'s Polyak step; the
  Trainer's default ``lr_scheduler_type="linear"`` would decay it to 0, so the callback warns
  unless the scheduler is ``constant`` (or ``constant_with_warmup``).
* **No clipping.** The Trainer clips gradients at ``max_grad_norm=1.0`` by default. Clipping
  shrinks the gradient in the Polyak step's denominator but not the loss in its numerator, so
  every clipped step is larger than the method's: a linear regression went from loss 4.8 to
  1e21 in four steps with it, and trained without (``tests/client/test_hf_trainer.py``). The
  callback warns unless ``max_grad_norm`` is 0; ScheduleFree+'s weight decay is what keeps it
  stable.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from curvecast.client._monitor import Monitor
from curvecast.client.integrations._common import (
    is_schedule_free,
    json_safe,
    scalar_metrics,
    unwrap_optimizer,
)

__all__ = ["CurvecastCallback"]

log = logging.getLogger("curvecast.client")


class CurvecastCallback(TrainerCallback):
    """Stream a ``transformers.Trainer`` run to curvecast.

    Args:
        monitor: a monitor to use. Default: one is created on the main process from
            ``monitor_kwargs`` (config defaults to the ``TrainingArguments``, ``total_steps`` to
            ``state.max_steps``).
        watch: watch the optimizer (``Monitor.watch``).
        switch_schedule_free: hand the loss to a ScheduleFree+ optimizer and switch it between
            x and y (see the module docstring); ``False`` leaves both to you.
        finish_on_train_end: finish a monitor this callback created when training ends.
        **monitor_kwargs: passed to :class:`~curvecast.client.Monitor` (``url``, ``project``, ...).
    """

    def __init__(
        self,
        monitor: Monitor | None = None,
        *,
        watch: bool = True,
        switch_schedule_free: bool = True,
        finish_on_train_end: bool = True,
        **monitor_kwargs: Any,
    ) -> None:
        self.monitor = monitor
        self._owns_monitor = monitor is None
        self._monitor_kwargs = monitor_kwargs
        self._watch = watch
        self._switch = switch_schedule_free
        self._finish = finish_on_train_end
        self._handle: Any = None
        self._schedule_free: Any = None  # the unwrapped ScheduleFree+ optimizer, if any
        self._loss_hook: torch.utils.hooks.RemovableHandle | None = None
        self._micro_losses: list[torch.Tensor] = []
        self._losses_are_shares = False  # normalised by the whole step's token count
        self._loss_scale = 1
        self._missing_loss = False

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        optimizer: Any = None,
        **kwargs: Any,
    ) -> None:
        """Attach to a ScheduleFree+ optimizer (every rank); create the monitor and watch the
        optimizer (main process)."""
        self._attach_schedule_free(args, optimizer, kwargs.get("model"), kwargs.get("lr_scheduler"))
        if not state.is_world_process_zero:
            return
        if self.monitor is None:
            options = dict(self._monitor_kwargs)
            # to_dict() masks secrets such as hub_token.
            trainer_args = args.to_dict()  # type: ignore[no-untyped-call]
            # lr_schedule: a decaying schedule tells the forecast the curve is off its model.
            kind = str(getattr(args, "lr_scheduler_type", "")).rsplit(".", 1)[-1].lower()
            options.setdefault("config", {"trainer": json_safe(trainer_args),
                                          "lr_schedule": kind or None})
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

    # -- ScheduleFree+: the loss for the Polyak step, and x / y switching ---------------------

    def _attach_schedule_free(
        self, args: TrainingArguments, optimizer: Any, model: Any, lr_scheduler: Any
    ) -> None:
        inner = unwrap_optimizer(optimizer) if optimizer is not None else None
        if not (
            self._switch
            and inner is not None
            and callable(getattr(inner, "provide_loss", None))
            and is_schedule_free(inner)
        ):
            return
        self._schedule_free = inner
        if model is not None and self._loss_hook is None:
            self._loss_hook = model.register_forward_hook(self._record_loss, with_kwargs=True)
        # Under average_tokens_across_devices the Trainer divides by the token count of all
        # ranks and multiplies the loss by the number of processes afterwards; the optimizer
        # averages the ranks' losses, so each rank's share is scaled the same way here.
        if getattr(args, "average_tokens_across_devices", False):
            self._loss_scale = max(1, int(getattr(args, "world_size", 1)))
        kind = str(getattr(args, "lr_scheduler_type", "")).rsplit(".", 1)[-1].lower()
        if lr_scheduler is not None and kind not in ("constant", "constant_with_warmup"):
            warnings.warn(
                f"ScheduleFreePlus is schedule-free, but the Trainer's lr_scheduler_type is "
                f"{kind or lr_scheduler!r}: the schedule multiplies the Polyak step (the default "
                f"'linear' decays it to 0). Pass lr_scheduler_type='constant' in the "
                f"TrainingArguments.",
                UserWarning,
                stacklevel=2,
            )
        clip = getattr(args, "max_grad_norm", None)
        if clip is not None and clip > 0:
            warnings.warn(
                f"ScheduleFreePlus under gradient clipping (the Trainer's max_grad_norm={clip:g}"
                f"): clipping shrinks the gradient but not the loss of the Polyak step, so a "
                f"clipped step is larger than ScheduleFree+'s and training can diverge. Pass "
                f"max_grad_norm=0 in the TrainingArguments (the optimizer's weight decay keeps "
                f"it stable).",
                UserWarning,
                stacklevel=2,
            )

    def _record_loss(
        self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        """Forward hook: keep the loss of every training micro-batch (detached, no sync)."""
        if not (module.training and torch.is_grad_enabled()):
            return  # evaluation, or a forward pass that will not be stepped on
        if isinstance(output, Mapping):
            loss = output.get("loss")
        elif isinstance(output, tuple | list) and output:
            loss = output[0]
        else:
            loss = getattr(output, "loss", None)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            self._missing_loss = True
            return
        self._micro_losses.append(loss.detach().reshape(()))
        self._losses_are_shares = kwargs.get("num_items_in_batch") is not None

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Train at y."""
        optimizer = self._schedule_free
        if optimizer is not None and not optimizer.train_mode:
            optimizer.train()
        self._micro_losses.clear()
        self._missing_loss = False

    def on_pre_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Hand the step's loss (the mean over its micro-batches) to ScheduleFree+."""
        optimizer = self._schedule_free
        if optimizer is None:
            return
        losses, self._micro_losses = self._micro_losses, []
        if not losses:
            why = (
                "the model's output had no scalar `loss`"
                if self._missing_loss
                else "no training forward pass of the model was seen"
            )
            raise RuntimeError(
                f"CurvecastCallback could not give ScheduleFreePlus the loss of step "
                f"{state.global_step + 1}: {why}. ScheduleFree+ needs the loss the gradients "
                f"came from; return it from the model as `loss` (a loss computed in the Trainer "
                f"by label_smoothing_factor or compute_loss_func is not seen), or subclass the "
                f"Trainer and call optimizer.provide_loss(loss) before the step."
            )
        total = torch.stack(losses).sum()
        step_loss = total * self._loss_scale if self._losses_are_shares else total / len(losses)
        optimizer.provide_loss(step_loss)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Hold x for the evaluation or checkpoint the Trainer runs after this step."""
        if self._schedule_free is not None and (control.should_evaluate or control.should_save):
            self._schedule_free.eval()

    def on_train_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        """Leave x in the model; stop watching; finish a monitor this callback created."""
        if self._loss_hook is not None:
            self._loss_hook.remove()
            self._loss_hook = None
        if self._schedule_free is not None:
            self._schedule_free.eval()
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if self.monitor is not None and self._owns_monitor and self._finish:
            if not self.monitor.finished:
                self.monitor.finish()
