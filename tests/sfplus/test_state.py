"""Checkpointing: state_dict()/load_state_dict() resume a run exactly, in either mode."""

from __future__ import annotations

import copy
import io

import pytest
import torch

from curvecast.sfplus import ScheduleFreePlus

from .conftest import batches, make_model, params_of, train

FULL = {"warmup_steps": 10, "c_warmup": 25, "weight_decay": 5.0, "anneal_steps": 80, "r": 1.0}


def _save(model: torch.nn.Module, opt: torch.optim.Optimizer) -> bytes:
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    return buf.getvalue()


def _load(blob: bytes, foreach: bool | None) -> tuple[torch.nn.Module, ScheduleFreePlus]:
    ckpt = torch.load(io.BytesIO(blob), weights_only=True)
    model = make_model(
        seed=123, dtype=torch.float32
    )  # different init: everything must come from the file
    model.load_state_dict(ckpt["model"])
    opt = ScheduleFreePlus(model.parameters(), foreach=foreach, **FULL)
    opt.load_state_dict(ckpt["opt"])
    return model, opt


@pytest.mark.parametrize("foreach", [True, False], ids=["foreach", "per-tensor"])
def test_resume_at_step_50_is_identical_to_an_uninterrupted_run(foreach: bool) -> None:
    data = batches(100)
    model = make_model(dtype=torch.float32)
    opt = ScheduleFreePlus(model.parameters(), foreach=foreach, **FULL)
    train(model, opt, data)
    expected_y, expected_stats = params_of(model), opt.stats()
    opt.eval()
    expected_x = params_of(model)

    model = make_model(dtype=torch.float32)
    opt = ScheduleFreePlus(model.parameters(), foreach=foreach, **FULL)
    train(model, opt, data[:50])
    blob = _save(model, opt)
    del model, opt

    model, opt = _load(blob, foreach)
    assert opt.step_count == 50
    train(model, opt, data[50:])
    # Bit-for-bit: the same operations on the same numbers.
    assert all(torch.equal(a, b) for a, b in zip(params_of(model), expected_y, strict=True))
    assert opt.stats() == expected_stats
    opt.eval()
    assert all(torch.equal(a, b) for a, b in zip(params_of(model), expected_x, strict=True))


def test_checkpoint_saved_in_eval_mode_resumes_in_eval_mode() -> None:
    data = batches(40)
    model = make_model(dtype=torch.float32)
    opt = ScheduleFreePlus(model.parameters(), **FULL)
    train(model, opt, data[:20])
    opt.eval()  # the usual advice: save the averaged model
    blob = _save(model, opt)
    opt.train()
    train(model, opt, data[20:])
    expected = params_of(model)

    model, opt = _load(blob, None)
    assert not opt.train_mode  # the parameters hold x, and the optimizer knows it
    opt.train()
    train(model, opt, data[20:])
    assert all(torch.equal(a, b) for a, b in zip(params_of(model), expected, strict=True))


def test_scalars_stay_exact_python_numbers_through_a_checkpoint() -> None:
    model = make_model(
        dtype=torch.bfloat16
    )  # tensors are cast to bf16 on load; scalars must not be
    opt = ScheduleFreePlus(model.parameters())
    train(model, opt, batches(5))
    glob = copy.deepcopy(opt.state[model.emb.weight]["sfplus"])
    ckpt = torch.load(io.BytesIO(_save(model, opt)), weights_only=True)
    fresh = ScheduleFreePlus(model.parameters())
    fresh.load_state_dict(ckpt["opt"])
    loaded = fresh.state[model.emb.weight]["sfplus"]
    assert loaded == glob
    assert type(loaded["denom_ema"]) is float and type(loaded["step"]) is int


def test_old_checkpoints_get_defaults_for_missing_hyperparameters() -> None:
    model = make_model()
    opt = ScheduleFreePlus(model.parameters(), f_star=0.25)
    train(model, opt, batches(3))
    sd = copy.deepcopy(opt.state_dict())
    for group in sd["param_groups"]:
        del group["polyak_beta"], group["foreach"]
    fresh = ScheduleFreePlus(model.parameters(), f_star=0.25)
    fresh.load_state_dict(sd)
    assert fresh.param_groups[0]["polyak_beta"] == 0.9
    assert fresh.param_groups[0]["foreach"] is None
    assert fresh.param_groups[0]["f_star"] == 0.25
    train(model, fresh, batches(2))
    assert fresh.step_count == 5


def test_checkpoints_from_before_the_new_defaults_keep_their_hyperparameters() -> None:
    """The defaults became weight_decay=5, warmup_steps=500; a checkpoint written with the old
    ones (0, 0, stored in its parameter groups) must resume as it was trained, bit for bit."""
    data = batches(6)
    model, reference_model = make_model(), make_model()
    reference_model.load_state_dict(model.state_dict())
    old = ScheduleFreePlus(model.parameters(), weight_decay=0.0, warmup_steps=0)
    reference = ScheduleFreePlus(reference_model.parameters(), weight_decay=0.0, warmup_steps=0)
    train(model, old, data[:3])
    train(reference_model, reference, data)
    ckpt = torch.load(io.BytesIO(_save(model, old)), weights_only=True)

    resumed_model = make_model()
    resumed_model.load_state_dict(ckpt["model"])
    resumed = ScheduleFreePlus(resumed_model.parameters())  # today's defaults
    assert resumed.defaults["weight_decay"] == 5.0 and resumed.defaults["warmup_steps"] == 500
    resumed.load_state_dict(ckpt["opt"])
    assert resumed.param_groups[0]["weight_decay"] == 0.0
    assert resumed.param_groups[0]["warmup_steps"] == 0
    train(resumed_model, resumed, data[3:])
    for p, q in zip(resumed_model.parameters(), reference_model.parameters(), strict=True):
        assert torch.equal(p, q)

    # A pickled optimizer (``torch.save(opt)``) goes through __setstate__ and keeps them too,
    # even one pickled before ``fused`` existed (absent from its groups and its own defaults).
    old.defaults.pop("fused")
    for group in old.param_groups:
        group.pop("fused")
    unpickled = copy.deepcopy(old)
    assert unpickled.param_groups[0]["weight_decay"] == 0.0
    assert unpickled.param_groups[0]["warmup_steps"] == 0
    assert unpickled.param_groups[0]["fused"] is None
    for param in (q for group in unpickled.param_groups for q in group["params"]):
        param.grad = torch.ones_like(param)  # the copy holds copies of the parameters
    unpickled.step(loss=1.0)
    assert unpickled.step_count == 4


def test_optimizer_survives_deepcopy() -> None:
    model = make_model()
    opt = ScheduleFreePlus(model.parameters())
    train(model, opt, batches(3))
    clone = copy.deepcopy(opt)
    assert clone.step_count == 3 and clone.stats() == opt.stats()
