"""PyTorch Lightning integration: ``CurvecastCallback``.

Usage::

    from curvecast.client.integrations.lightning import CurvecastCallback

    trainer = L.Trainer(callbacks=[CurvecastCallback(project="lm", run_name="gpt-120m")])
    trainer.fit(model)

It creates a :class:`~curvecast.client.Monitor` on the global-zero rank (or uses the one you
pass), watches the trainer's optimizers (ScheduleFree+ telemetry, or learning rates), and logs at
``trainer.global_step``: the training loss of every batch (``outputs["loss"]``) and whatever
the module ``self.log``\\ s (``trainer.callback_metrics``, each value once, when it changes).

ScheduleFree+ keeps two points: y, where gradients are taken, and x, the averaged model that
should be evaluated and shipped. The callback switches every schedule-free optimizer (anything
with ``train()``/``eval()`` and ``train_mode``) to x when validation, testing or prediction
starts and at the end of each training epoch (so ``ModelCheckpoint``, which Lightning always
runs after other callbacks, saves x), back to y before the next training batch, and leaves x in
the model when ``fit`` ends. A checkpoint saved by hand in the middle of an epoch holds y
(resuming from it is still exact: the optimizer's state records which point the model holds).

Works with ``lightning`` (``lightning.pytorch``) or, if that is not installed, the standalone
``pytorch_lightning`` package.
"""

from __future__ import annotations

import logging
from typing import Any

try:
    from lightning.pytorch import Callback, LightningModule, Trainer
except ImportError:  # pragma: no cover - the standalone package
    from pytorch_lightning import Callback, LightningModule, Trainer  # type: ignore[assignment]

from curvecast.client._monitor import Monitor
from curvecast.client.integrations._common import (
    is_schedule_free,
    json_safe,
    scalar_metrics,
    unwrap_optimizer,
)
from curvecast.contract import TRAIN_LOSS_KEY

__all__ = ["CurvecastCallback"]

log = logging.getLogger("curvecast.client")


class CurvecastCallback(Callback):
    """Stream a Lightning run to curvecast; switch ScheduleFree+ between x and y.

    Args:
        monitor: a monitor to use (you finish it). Default: one is created on the global-zero
            rank from ``monitor_kwargs`` (config defaults to the module's ``hparams``,
            ``total_steps`` to ``max_steps``) and finished when ``fit`` ends.
        watch: watch the trainer's optimizers (``Monitor.watch``).
        switch_schedule_free: switch schedule-free optimizers between x and y (see above).
        **monitor_kwargs: passed to :class:`~curvecast.client.Monitor` (``url``, ``project``, ...).
    """

    def __init__(
        self,
        monitor: Monitor | None = None,
        *,
        watch: bool = True,
        switch_schedule_free: bool = True,
        **monitor_kwargs: Any,
    ) -> None:
        super().__init__()
        self.monitor = monitor
        self._owns_monitor = monitor is None
        self._monitor_kwargs = monitor_kwargs
        self._watch = watch
        self._switch = switch_schedule_free
        self._handles: list[Any] = []
        self._seen: dict[str, Any] = {}

    # -- monitor lifecycle -----------------------------------------------------------------

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Create the monitor (global-zero rank only)."""
        if self.monitor is not None or not trainer.is_global_zero:
            return
        kwargs = dict(self._monitor_kwargs)
        if "config" not in kwargs and getattr(pl_module, "hparams", None):
            kwargs["config"] = json_safe(dict(pl_module.hparams))
        if "total_steps" not in kwargs and (trainer.max_steps or 0) > 0:
            kwargs["total_steps"] = trainer.max_steps
        self.monitor = Monitor(**kwargs)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Watch the optimizers; make sure the model holds y."""
        self._to_y(trainer)
        if self.monitor is None or not self._watch or self._handles:
            return
        for optimizer in trainer.optimizers:
            # The post-step hook runs inside optimizer.step(), before Lightning counts the step.
            self._handles.append(
                self.monitor.watch(
                    unwrap_optimizer(optimizer), step_fn=lambda: trainer.global_step + 1
                )
            )

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Stop watching; finish a monitor this callback created once ``fit`` is over."""
        if stage != "fit":
            return
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self.monitor is not None and self._owns_monitor and not self.monitor.finished:
            self.monitor.finish()

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        """Mark the run failed (a monitor this callback created)."""
        if self.monitor is not None and self._owns_monitor and not self.monitor.finished:
            self.monitor.finish("failed")

    # -- metrics ---------------------------------------------------------------------------

    def _log_changed(self, trainer: Trainer, extra: dict[str, Any] | None = None) -> None:
        monitor = self.monitor
        if monitor is None or monitor.finished:
            return
        changed = []
        for key, value in trainer.callback_metrics.items():
            if self._seen.get(key) is not value:
                self._seen[key] = value
                changed.append((key, value))
        metrics = scalar_metrics(changed)
        for key, value in (extra or {}).items():
            metrics.setdefault(key, value)
        if metrics:
            monitor.log(trainer.global_step, metrics)

    def on_train_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Log the batch's loss and newly logged metrics at ``global_step``."""
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        logged = scalar_metrics([(TRAIN_LOSS_KEY, loss)]) if loss is not None else None
        self._log_changed(trainer, logged)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Log validation metrics at ``global_step``."""
        if not trainer.sanity_checking:
            self._log_changed(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Log epoch-level metrics; hold x for the end-of-epoch checkpoint."""
        self._log_changed(trainer)
        self._to_x(trainer)

    # -- x / y switching -------------------------------------------------------------------

    def _schedule_free(self, trainer: Trainer) -> list[Any]:
        if not self._switch:
            return []
        optimizers = [unwrap_optimizer(o) for o in trainer.optimizers]
        return [o for o in optimizers if is_schedule_free(o)]

    def _to_x(self, trainer: Trainer) -> None:
        for optimizer in self._schedule_free(trainer):
            optimizer.eval()

    def _to_y(self, trainer: Trainer) -> None:
        for optimizer in self._schedule_free(trainer):
            if not optimizer.train_mode:
                optimizer.train()

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Train at y."""
        self._to_y(trainer)

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Validate at x."""
        self._to_x(trainer)

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Test at x."""
        self._to_x(trainer)

    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Predict at x."""
        self._to_x(trainer)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Leave the averaged model x in the module after ``fit``."""
        self._to_x(trainer)
