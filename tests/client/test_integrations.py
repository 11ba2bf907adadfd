"""The framework integrations, with the real libraries, training a tiny model for a few steps
against a real server."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from tests.client._helpers import get_run, point_counts, series
from tests.conftest import require


def loaders(n: int = 12) -> tuple[torch.utils.data.DataLoader, torch.utils.data.DataLoader]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    return (torch.utils.data.DataLoader(data, batch_size=4),
            torch.utils.data.DataLoader(data, batch_size=4))


def test_lightning_callback_logs_and_switches_schedule_free(
    sqlite_server: str, spool_dir: Path, tmp_path: Path
) -> None:
    L = require("lightning.pytorch")
    from curvecast.client.integrations.lightning import CurvecastCallback
    from curvecast.sfplus import ScheduleFreePlus

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.save_hyperparameters({"hidden": 8, "note": object()})
            self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.mse_loss(self.net(x), y)
            self.log("train_mse", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", F.mse_loss(self.net(x), y))

        def configure_optimizers(self):
            return ScheduleFreePlus(self.parameters(), warmup_steps=2, weight_decay=5.0)

    modes: list[tuple[str, bool]] = []

    class Probe(L.Callback):  # runs after CurvecastCallback (and before ModelCheckpoint)
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            modes.append(("train", trainer.optimizers[0].train_mode))

        def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, *args):
            if not trainer.sanity_checking:
                modes.append(("val", trainer.optimizers[0].train_mode))

        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            modes.append(("checkpoint", trainer.optimizers[0].train_mode))

    callback = CurvecastCallback(url=sqlite_server, project="client-lightning",
                                 spool_dir=spool_dir, flush_timeout=30)
    trainer = L.Trainer(max_epochs=2, limit_val_batches=1, callbacks=[callback, Probe()],
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, accelerator="cpu", devices=1)
    module = Tiny()
    train, val = loaders()
    trainer.fit(module, train, val)

    assert ("train", False) not in modes and ("val", True) not in modes
    assert ("checkpoint", False) in modes and ("checkpoint", True) not in modes
    assert {m for m, _ in modes} == {"train", "val", "checkpoint"}
    assert not trainer.optimizers[0].train_mode  # the model holds x after fit

    monitor = callback.monitor
    assert monitor is not None and monitor.finished
    run = get_run(sqlite_server, monitor.run_id)
    assert run["status"] == "finished"
    assert run["config"]["hidden"] == 8 and run["config"]["weight_decay"] == 5.0
    counts = point_counts(sqlite_server, monitor.run_id)
    assert counts["loss"] == 6 and counts["train_mse"] == 6 and counts["opt/eta"] == 6
    assert counts["val_loss"] == 2
    stored = series(sqlite_server, monitor.run_id)
    assert stored["opt/eta"]["steps"] == stored["loss"]["steps"] == [1, 2, 3, 4, 5, 6]
    assert stored["val_loss"]["steps"] == [3, 6]


class HFTiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)

    def forward(self, x, labels=None):
        out = self.net(x)
        return {"loss": F.mse_loss(out, labels), "logits": out}


def test_transformers_callback_logs_trainer_logs_and_optimizer(
    sqlite_server: str, spool_dir: Path, tmp_path: Path
) -> None:
    transformers = require("transformers")
    from curvecast.client.integrations.transformers import CurvecastCallback

    g = torch.Generator().manual_seed(0)
    data = [{"x": x, "labels": x.sum(0, keepdim=True)} for x in torch.randn(16, 4, generator=g)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=4, logging_steps=1, per_device_train_batch_size=4,
        eval_strategy="steps", eval_steps=2, report_to=[], save_strategy="no", use_cpu=True,
        disable_tqdm=True, learning_rate=0.01, run_name="hf-tiny",
    )
    callback = CurvecastCallback(url=sqlite_server, project="client-hf", spool_dir=spool_dir,
                                 flush_timeout=30)
    trainer = transformers.Trainer(model=HFTiny(), args=args, train_dataset=data,
                                   eval_dataset=data, callbacks=[callback])
    trainer.train()

    monitor = callback.monitor
    assert monitor is not None and monitor.finished
    run = get_run(sqlite_server, monitor.run_id)
    assert run["status"] == "finished" and run["name"] == "hf-tiny"
    assert run["config"]["total_steps"] == 4 and run["config"]["trainer"]["learning_rate"] == 0.01
    counts = point_counts(sqlite_server, monitor.run_id)
    assert counts["loss"] == 4 and counts["learning_rate"] == 4 and counts["grad_norm"] == 4
    # The Trainer makes two parameter groups (with and without weight decay).
    assert counts["eval/loss"] == 2 and counts["opt/lr/0"] == counts["opt/lr/1"] == 4
    stored = series(sqlite_server, monitor.run_id)
    assert stored["opt/lr/0"]["steps"] == stored["loss"]["steps"] == [1, 2, 3, 4]
    assert stored["opt/lr/0"]["values"] == stored["learning_rate"]["values"]
    assert stored["eval/loss"]["steps"] == [2, 4]
