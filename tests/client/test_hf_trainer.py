"""ScheduleFreePlus under the Hugging Face ``Trainer`` with curvecast's callback: real Trainer,
real tiny models built from configs (nothing downloaded), real server."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tests.client._helpers import get_run, series
from tests.client.test_integrations import require


def tiny_gpt2(transformers: Any) -> nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1,
                                     n_head=2)
    return transformers.GPT2LMHeadModel(config)


def token_data(n: int = 32) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 32, (n, 16), generator=g)
    ids[:, 8:] = ids[:, :8]  # learnable: the second half repeats the first
    return [{"input_ids": row, "labels": row} for row in ids]


class MSETiny(nn.Module):
    """A model that takes no loss kwargs: the Trainer averages its micro-batch losses."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, Any]:
        out = self.net(x)
        return {"loss": F.mse_loss(out, labels) if labels is not None else None, "logits": out}


def mse_data(n: int = 32) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [{"x": x, "labels": x.sum(0, keepdim=True)} for x in torch.randn(n, 4, generator=g)]


def make_probe(transformers: Any, optimizer: Any) -> Any:
    class Probe(transformers.TrainerCallback):
        """Runs after curvecast's callback: what the optimizer used, and where it stood."""

        def __init__(self) -> None:
            self.step_losses: list[float] = []
            self.mode_at_save: list[bool] = []
            self.mode_at_eval: list[bool] = []

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.step_losses.append(optimizer.stats()["loss"])

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.mode_at_save.append(optimizer.train_mode)

        def on_evaluate(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.mode_at_eval.append(optimizer.train_mode)

    return Probe()


def trainer_losses(trainer: Any) -> list[float]:
    return [row["loss"] for row in trainer.state.log_history if "loss" in row]


@pytest.mark.parametrize("accumulation", [1, 2])
def test_schedule_free_plus_trains_a_gpt2_under_the_trainer(
    accumulation: int, sqlite_server: str, spool_dir: Path, tmp_path: Path
) -> None:
    transformers = require("transformers")
    from curvecast.client.integrations.transformers import CurvecastCallback
    from curvecast.sfplus import ScheduleFreePlus

    model = tiny_gpt2(transformers)
    opt = ScheduleFreePlus(model.parameters(), warmup_steps=2)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=6, logging_steps=1, per_device_train_batch_size=4,
        gradient_accumulation_steps=accumulation, lr_scheduler_type="constant",
        max_grad_norm=0.0, eval_strategy="steps", eval_steps=3, save_strategy="steps",
        save_steps=3, report_to=[], use_cpu=True, disable_tqdm=True,
        run_name=f"gpt2-ga{accumulation}",
    )
    callback = CurvecastCallback(url=sqlite_server, project="client-hf-sfplus",
                                 spool_dir=spool_dir, flush_timeout=30)
    probe = make_probe(transformers, opt)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=token_data(),
                                   eval_dataset=token_data(8), optimizers=(opt, None),
                                   callbacks=[callback, probe])
    # GPT-2 takes num_items_in_batch: each micro-batch's loss is its share of the step's.
    assert trainer.model_accepts_loss_kwargs
    trainer.train()

    # The Polyak step saw each step's loss: what the Trainer logs as that step's loss (the mean
    # over its micro-batches), to the 4 decimals the Trainer rounds its logs to.
    logged = trainer_losses(trainer)
    assert len(logged) == len(probe.step_losses) == opt.step_count == 6
    assert probe.step_losses == pytest.approx(logged, abs=2e-4)
    # Evaluations and checkpoints at x; training resumed at y after each; x left at the end.
    assert probe.mode_at_eval == [False, False] and probe.mode_at_save == [False, False]
    assert not opt.train_mode
    first_eval, last_eval = [r["eval_loss"] for r in trainer.state.log_history if "eval_loss" in r]
    assert last_eval < first_eval

    monitor = callback.monitor
    assert monitor is not None and monitor.finished
    run = get_run(sqlite_server, monitor.run_id)
    assert run["status"] == "finished" and run["config"]["lr_schedule"] == "constant"
    stored = series(sqlite_server, monitor.run_id)
    assert stored["opt/eta"]["steps"] == stored["loss"]["steps"] == [1, 2, 3, 4, 5, 6]
    assert stored["opt/loss"]["values"] == pytest.approx(probe.step_losses, rel=1e-5)


def test_micro_batch_losses_are_averaged_for_models_without_loss_kwargs(
    sqlite_server: str, spool_dir: Path, tmp_path: Path
) -> None:
    transformers = require("transformers")
    from curvecast.client.integrations.transformers import CurvecastCallback
    from curvecast.sfplus import ScheduleFreePlus

    torch.manual_seed(0)
    model = MSETiny()
    opt = ScheduleFreePlus(model.parameters(), warmup_steps=2)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=4, logging_steps=1, per_device_train_batch_size=4,
        gradient_accumulation_steps=3, lr_scheduler_type="constant", save_strategy="no",
        report_to=[], use_cpu=True, disable_tqdm=True, max_grad_norm=0.0,  # see the next test
    )
    probe = make_probe(transformers, opt)
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=mse_data(), optimizers=(opt, None),
        callbacks=[CurvecastCallback(url=sqlite_server, spool_dir=spool_dir, flush_timeout=30),
                   probe],
    )
    assert not trainer.model_accepts_loss_kwargs
    trainer.train()
    assert probe.step_losses == pytest.approx(trainer_losses(trainer), abs=2e-4)
    assert opt.step_count == 4


def test_a_loss_the_callback_cannot_see_stops_training_with_a_reason(
    sqlite_server: str, spool_dir: Path, tmp_path: Path
) -> None:
    transformers = require("transformers")
    from curvecast.client.integrations.transformers import CurvecastCallback
    from curvecast.sfplus import ScheduleFreePlus

    torch.manual_seed(0)
    model = MSETiny()
    opt = ScheduleFreePlus(model.parameters())
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4,
        lr_scheduler_type="constant", save_strategy="no", report_to=[], use_cpu=True,
        disable_tqdm=True, max_grad_norm=0,  # no clipping: its warning is another test's
    )
    # The loss is computed by the Trainer from the logits: the model's own `loss` is None.
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=mse_data(), optimizers=(opt, None),
        compute_loss_func=lambda out, labels, num_items_in_batch=None: F.mse_loss(
            out["logits"], labels),
        callbacks=[callback := CurvecastCallback(url=sqlite_server, spool_dir=spool_dir,
                                                 flush_timeout=30)],
    )
    with pytest.raises(RuntimeError, match="had no scalar `loss`.*compute_loss_func"):
        trainer.train()
    assert opt.step_count == 0
    # The Trainer has no exception event for callbacks: the script marks the run itself.
    assert callback.monitor is not None and callback.monitor.finish("failed")
    assert get_run(sqlite_server, callback.monitor.run_id)["status"] == "failed"


def test_a_decaying_schedule_is_warned_about(tmp_path: Path, spool_dir: Path,
                                            sqlite_server: str) -> None:
    transformers = require("transformers")
    from curvecast.client.integrations.transformers import CurvecastCallback
    from curvecast.sfplus import ScheduleFreePlus

    torch.manual_seed(0)
    model = MSETiny()
    opt = ScheduleFreePlus(model.parameters())
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=4,
        save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, max_grad_norm=0,
    )  # lr_scheduler_type defaults to "linear"; no clipping (its warning: another test)
    callback = CurvecastCallback(url=sqlite_server, spool_dir=spool_dir, flush_timeout=30)
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=mse_data(), optimizers=(opt, None),
        callbacks=[callback],
    )
    with pytest.warns(UserWarning, match="lr_scheduler_type='constant'"):
        trainer.train()
    # The run says which schedule it ran: the forecast reads a decaying one as off_model.
    assert callback.monitor is not None
    assert get_run(sqlite_server, callback.monitor.run_id)["config"]["lr_schedule"] == "linear"


def _schedule_free_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if "ScheduleFreePlus" in str(w.message)]


def test_gradient_clipping_is_warned_about_and_is_why(tmp_path: Path, spool_dir: Path,
                                                      sqlite_server: str) -> None:
    """The Trainer's default max_grad_norm=1.0 shrinks the gradient but not the loss of the
    Polyak step: the same regression and seed diverge with it and train without it, and only
    the clipped run gets the warning."""
    transformers = require("transformers")
    from curvecast.client.integrations.transformers import CurvecastCallback
    from curvecast.sfplus import ScheduleFreePlus

    final: dict[float, float] = {}
    for clip in (1.0, 0.0):
        torch.manual_seed(0)
        model = MSETiny()
        opt = ScheduleFreePlus(model.parameters(), warmup_steps=2)
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / str(clip)), max_steps=4, logging_steps=1,
            per_device_train_batch_size=4, gradient_accumulation_steps=3,
            lr_scheduler_type="constant", save_strategy="no", report_to=[], use_cpu=True,
            disable_tqdm=True, max_grad_norm=clip,
        )
        trainer = transformers.Trainer(
            model=model, args=args, train_dataset=mse_data(), optimizers=(opt, None),
            callbacks=[CurvecastCallback(url=sqlite_server, spool_dir=spool_dir,
                                         flush_timeout=30)],
        )
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            trainer.train()
        ours = _schedule_free_warnings(record)
        if clip:
            assert len(ours) == 1 and "max_grad_norm=0" in ours[0], ours
        else:
            assert ours == []
        final[clip] = trainer_losses(trainer)[-1]
    first = trainer_losses(trainer)[0]
    assert final[0.0] < first, "without clipping the loss falls"
    assert final[1.0] > first, "with it the steps are too large: the loss rises"
