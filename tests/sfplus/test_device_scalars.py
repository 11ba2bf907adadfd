"""The step size on the device (``device_scalars=True``, the default on accelerators), on CPU.

Parity with the reference and the host-read counts are in test_reference_parity.py and
test_host_syncs.py; here: the compiled one-call step (compiled once, whatever the step size or
the hyper-parameters do), statistics read lazily, checkpoints, mixed dtypes and validation.
"""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch

from curvecast.sfplus import ScheduleFreePlus, _fused

from .conftest import batches, loss_fn, make_model, max_rel_diff, params_of, train

KW = {"warmup_steps": 5, "c_warmup": 8, "weight_decay": 5.0, "anneal_steps": 30, "r": 1.0}


def _mixed_model() -> tuple[torch.nn.Module, list[dict[str, object]]]:
    """The test model with its first layer in bfloat16 (its own parameter group, with its own
    lr) and the rest in float32: the groups and dtypes of a mixed-precision model."""
    model = make_model(dtype=torch.float32)
    model.emb.to(torch.bfloat16)
    model.norm.to(torch.bfloat16)
    half = [*model.emb.parameters(), *model.norm.parameters()]
    rest = [p for p in model.parameters() if all(p is not q for q in half)]
    return model, [{"params": half, "lr": 0.5}, {"params": rest}]


def _mixed_loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    h = model.norm(model.emb(x)).float()
    return torch.nn.functional.cross_entropy(
        model.fc2(torch.nn.functional.gelu(model.fc1(h))), y)


def test_the_compiled_step_compiles_once_over_1000_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """fused=True with device scalars: one compiled call per step for a bfloat16 group and a
    float32 group together; the step size changes every step, and lr and f_star are changed
    by hand, and the graph compiled at the first step serves all 1,000 (tens of seconds to
    compile on CPU)."""
    from torch._dynamo.utils import counters

    calls: list[bool] = []
    real_run = _fused.run_step

    def counting_run(*args, **kwargs):  # type: ignore[no-untyped-def]
        result = real_run(*args, **kwargs)
        calls.append(result is not None)
        return result

    monkeypatch.setattr(_fused, "run_step", counting_run)
    data = batches(1000, batch_size=8)
    runs = {}
    for compiled in (True, False):
        if not compiled:  # the same step, uncompiled: what the compiled one must agree with
            monkeypatch.setattr(_fused, "step_kernel", lambda mode=None: _fused.step_many_)
        model, groups = _mixed_model()
        opt = ScheduleFreePlus(groups, fused=True, device_scalars=True, **KW)
        etas, graphs = [], []
        steps = 1000 if compiled else 20
        for i, batch in enumerate(data[:steps]):
            if i == 300:
                for group in opt.param_groups:
                    group["f_star"] = 0.5
            if i == 600:
                opt.param_groups[1]["lr"] = 0.25
            loss = _mixed_loss(model, batch)
            loss.backward()
            opt.step(loss=loss)
            opt.zero_grad()
            if i < 20 or i % 100 == 0:
                etas.append(opt.stats()["eta"])
            graphs.append(counters["stats"]["unique_graphs"])
            if i == 19:
                runs[compiled] = params_of(model)
        if compiled:
            assert len(calls) == 1000 and all(calls), "the compiled step did not run"
            assert graphs[-1] == graphs[0], "the step recompiled"
            assert len(set(etas)) >= 10  # the step size did change
            assert all(math.isfinite(v) for v in opt.stats(norms=True).values())
    compiled_run, eager_run = runs[True], runs[False]
    for p, q in zip(compiled_run, eager_run, strict=True):
        tol = 2e-2 if p.dtype == torch.bfloat16 else 1e-4  # rounding, fed back for 20 steps
        assert (p.float() - q.float()).abs().max() <= tol * q.float().abs().max()


def test_statistics_are_each_steps_and_read_only_when_asked() -> None:
    """``step_stats`` is a new mapping each step whose device values are never overwritten: a
    reference kept for later (as the client hook's records are) reads that step's values."""
    model = make_model()
    opt = ScheduleFreePlus(model.parameters(), device_scalars=True, **KW)
    kept, expected = [], []
    for batch in batches(6):
        loss = loss_fn(model, batch)
        loss.backward()
        opt.step(loss=loss)
        opt.zero_grad()
        kept.append(opt.step_stats)
        expected.append(opt.stats())
    for mapping, stats in zip(kept, expected, strict=True):
        assert {k: float(v) for k, v in mapping.items()} == stats
    assert [s["step"] for s in expected] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def test_device_and_host_scalars_give_the_same_steps_and_f_star_changes_both() -> None:
    data = batches(25)
    runs = []
    for device_scalars in (False, True):
        model = make_model()
        opt = ScheduleFreePlus(model.parameters(), device_scalars=device_scalars, **KW)
        train(model, opt, data[:20])
        for group in opt.param_groups:
            group["f_star"] = 0.25
        stats = []
        train(model, opt, data[20:], on_step=lambda i, opt=opt, stats=stats: stats.append(
            opt.stats()))
        runs.append((params_of(model), stats))
    (host_params, host_stats), (device_params, device_stats) = runs
    assert max_rel_diff(device_params, host_params) < 1e-12
    for h, d in zip(host_stats, device_stats, strict=True):
        assert d == pytest.approx(h, rel=1e-12, abs=1e-15)
    assert all(s["numerator"] == pytest.approx(s["loss"] + s["inner"] - 0.25, rel=1e-12)
               for s in device_stats)


def _save(model: torch.nn.Module, opt: torch.optim.Optimizer) -> bytes:
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    return buf.getvalue()


@pytest.mark.parametrize("resume_on_device", [True, False], ids=["device", "host"])
def test_a_checkpoint_carries_the_device_scalars_as_python_numbers(resume_on_device: bool) -> None:
    """``state_dict()`` reads the device's EMA, gamma_max and weight sums back into the plain
    Python numbers a checkpoint holds; a run resumed from it, with the scalars on the device
    or the host, continues as if uninterrupted."""
    data = batches(30)
    model = make_model()
    opt = ScheduleFreePlus(model.parameters(), device_scalars=True, **KW)
    train(model, opt, data)
    expected = params_of(model)

    model = make_model()
    opt = ScheduleFreePlus(model.parameters(), device_scalars=True, **KW)
    train(model, opt, data[:15])
    blob = _save(model, opt)
    glob = opt.state[model.emb.weight]["sfplus"]
    assert type(glob["denom_ema"]) is float and glob["denom_ema"] > 0
    assert all(type(v) is float for v in (*glob["gamma_max"], *glob["weight_sum"]))
    assert glob["weight_sum"][0] > 0  # averaging started (c_warmup = 8): it was written back

    ckpt = torch.load(io.BytesIO(blob), weights_only=True)
    model = make_model(seed=7)
    model.load_state_dict(ckpt["model"])
    opt = ScheduleFreePlus(model.parameters(), device_scalars=resume_on_device, **KW)
    opt.load_state_dict(ckpt["opt"])
    assert opt.param_groups[0]["device_scalars"] is True  # saved with the groups, like fused
    for group in opt.param_groups:
        group["device_scalars"] = resume_on_device
    train(model, opt, data[15:])
    if resume_on_device:
        assert all(torch.equal(a, b) for a, b in zip(params_of(model), expected, strict=True))
    else:
        assert max_rel_diff(params_of(model), expected) < 1e-12


def test_checkpoints_from_before_device_scalars_load_with_the_default() -> None:
    model = make_model()
    opt = ScheduleFreePlus(model.parameters(), **KW)
    train(model, opt, batches(3))
    sd = copy.deepcopy(opt.state_dict())
    for group in sd["param_groups"]:
        del group["device_scalars"]
    fresh = ScheduleFreePlus(model.parameters(), **KW)
    fresh.load_state_dict(sd)
    assert fresh.param_groups[0]["device_scalars"] is None
    train(model, fresh, batches(2))
    assert fresh.step_count == 5


def test_deepcopy_and_a_group_added_later_keep_the_device_scalars() -> None:
    model = make_model()
    body = [p for n, p in model.named_parameters() if not n.startswith("fc2")]
    opt = ScheduleFreePlus(body, device_scalars=True, **KW)
    train(model, opt, batches(12))
    clone = copy.deepcopy(opt)
    assert clone.stats() == opt.stats()
    gamma_max = clone.state_dict()["state"][0]["sfplus"]["gamma_max"][0]
    assert gamma_max == opt.stats()["gamma_max"]
    opt.add_param_group({"params": list(model.fc2.parameters()), "lr": 0.5})
    alphas: list[float] = []  # the first group's (lr 1)
    train(model, opt, batches(3, seed=5), on_step=lambda i: alphas.append(opt.stats()["alpha"]))
    glob = opt.state[model.emb.weight]["sfplus"]
    opt.state_dict()  # reads the device values back
    assert len(glob["gamma_max"]) == 2
    assert glob["gamma_max"][0] >= gamma_max  # carried over, not restarted at eps
    assert glob["gamma_max"][1] == pytest.approx(0.5 * max(alphas), rel=1e-12)  # from eps


def test_bfloat16_and_mixed_groups_train_on_the_eager_device_path() -> None:
    model, groups = _mixed_model()
    opt = ScheduleFreePlus(groups, device_scalars=True, warmup_steps=5)
    losses = []
    for batch in batches(40):
        loss = _mixed_loss(model, batch)
        loss.backward()
        opt.step(loss=loss)
        opt.zero_grad()
        losses.append(loss.item())
    assert sum(losses[-5:]) < sum(losses[:5])
    assert all(math.isfinite(v) for v in opt.stats(norms=True).values())


def test_device_scalars_and_compile_mode_are_validated() -> None:
    model = make_model()
    with pytest.raises(ValueError, match="Invalid device_scalars"):
        ScheduleFreePlus(model.parameters(), device_scalars="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Invalid compile_mode.*reduce-overhead"):
        ScheduleFreePlus(model.parameters(), compile_mode="fast")
    with pytest.raises(ValueError, match="device_scalars must be the same"):
        ScheduleFreePlus([{"params": [model.emb.weight], "device_scalars": True},
                          {"params": [model.fc1.weight]}])
