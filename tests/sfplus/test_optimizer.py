"""Behaviour of the public API: modes, the loss contract, stats, validation, the Polyak details."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from curvecast import contract, sfplus
from curvecast.sfplus import NORM_STATS_KEYS, STATS_KEYS, ScheduleFreePlus, _stats
from curvecast.sfplus._stats import weight_norms

from .conftest import VOCAB, batches, loss_fn, make_model, params_of, train


def test_public_names() -> None:
    assert sfplus.__all__ == ["NORM_STATS_KEYS", "STATS_KEYS", "ScheduleFreePlus"]
    assert issubclass(ScheduleFreePlus, torch.optim.Optimizer)


def test_training_reduces_the_loss_and_x_beats_y() -> None:
    model = make_model(dtype=torch.float32)
    opt = ScheduleFreePlus(model.parameters(), warmup_steps=10)
    data = batches(150)
    losses = train(model, opt, data)
    assert sum(losses[-20:]) / 20 < 0.6 * sum(losses[:5]) / 5
    held_out = batches(8, seed=99)
    with torch.no_grad():
        at_y = sum(loss_fn(model, b).item() for b in held_out)
        with opt.averaged(model):
            at_x = sum(loss_fn(model, b).item() for b in held_out)
    assert at_x < at_y


# ---- train / eval ----------------------------------------------------------------------------


def test_eval_train_swap_is_exact_and_idempotent() -> None:
    model = make_model()
    opt = ScheduleFreePlus(model.parameters(), warmup_steps=5, weight_decay=1.0)
    train(model, opt, batches(30))
    y = params_of(model)
    assert opt.train_mode
    opt.eval()
    x = params_of(model)
    opt.eval()  # idempotent: a second call changes nothing
    assert all(torch.equal(a, b) for a, b in zip(params_of(model), x, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(x, y, strict=True))
    opt.train()
    opt.train()
    # y -> x -> y: exact up to one rounding of the parameter (float64 here).
    for a, b in zip(params_of(model), y, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-15)


def test_x_is_the_average_and_y_the_interpolation() -> None:
    """Check the stored representation against its definition: y = beta x + (1 - beta) z."""
    model = make_model()
    opt = ScheduleFreePlus(model.parameters(), sf_beta=0.8)
    train(model, opt, batches(12))
    y = params_of(model)
    z = [yy + opt.state[p]["z_minus_y"] for yy, p in zip(y, model.parameters(), strict=True)]
    opt.eval()
    x = params_of(model)
    for xx, yy, zz in zip(x, y, z, strict=True):
        torch.testing.assert_close(0.8 * xx + 0.2 * zz, yy, rtol=1e-12, atol=1e-14)


def test_step_in_eval_mode_is_refused() -> None:
    model = make_model()
    opt = ScheduleFreePlus(model.parameters())
    opt.eval()
    loss = loss_fn(model, batches(1)[0])
    loss.backward()
    with pytest.raises(RuntimeError, match=r"eval mode.*train\(\)"):
        opt.step(loss=loss)


def test_averaged_context_restores_modes_even_on_error() -> None:
    model = make_model()
    opt = ScheduleFreePlus(model.parameters())
    train(model, opt, batches(10))
    y = params_of(model)
    model.train()
    with pytest.raises(KeyError), opt.averaged(model):
        assert not opt.train_mode and not model.training
        raise KeyError("boom")
    assert opt.train_mode and model.training
    for a, b in zip(params_of(model), y, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-15)
    # Entered in eval mode, it stays in eval mode.
    opt.eval()
    with opt.averaged():
        pass
    assert not opt.train_mode


# ---- the loss contract -----------------------------------------------------------------------


def test_loss_as_float_tensor_or_closure_give_the_same_step() -> None:
    data = batches(5)
    finals = []
    for mode in ("tensor", "float", "closure"):
        model = make_model()
        opt = ScheduleFreePlus(model.parameters())
        for batch in data:
            if mode == "closure":

                def closure(batch=batch, model=model, opt=opt) -> torch.Tensor:
                    opt.zero_grad()
                    loss = loss_fn(model, batch)
                    loss.backward()
                    return loss

                returned = opt.step(closure)
                assert isinstance(returned, torch.Tensor)
            else:
                loss = loss_fn(model, batch)
                loss.backward()
                opt.step(loss=loss if mode == "tensor" else loss.item())
                opt.zero_grad()
        finals.append(params_of(model))
    for other in finals[1:]:
        assert all(torch.equal(a, b) for a, b in zip(finals[0], other, strict=True))


def test_missing_or_double_loss_is_a_clear_error() -> None:
    model = make_model()
    opt = ScheduleFreePlus(model.parameters())
    loss = loss_fn(model, batches(1)[0])
    loss.backward()
    with pytest.raises(ValueError, match=r"needs the loss.*step\(loss=loss\)"):
        opt.step()
    with pytest.raises(ValueError, match="not both"):
        opt.step(lambda: loss, loss=loss)
    with pytest.raises(ValueError, match="scalar"):
        opt.step(loss=torch.ones(3))
    with pytest.raises(ValueError, match="float or a 0-d tensor"):
        opt.step(loss="1.0")  # type: ignore[arg-type]
    assert opt.step_count == 0


# ---- the Polyak step -------------------------------------------------------------------------


def test_constant_gradient_gives_a_constant_denominator() -> None:
    """The public reference writes the bias-corrected EMA back into the raw EMA, so with
    polyak_beta > 0 its denominator compounds. Ours must stay at sqrt(pi/2) * ||g||_1."""
    torch.manual_seed(0)
    a = torch.randn(50, dtype=torch.float64)
    w = torch.nn.Parameter(torch.zeros(50, dtype=torch.float64))
    opt = ScheduleFreePlus([w], polyak_beta=0.9)
    expected = math.sqrt(math.pi / 2) * a.abs().sum().item()
    for _ in range(30):
        loss = (a * w).sum() + 100.0  # linear: the gradient is a, whatever w is
        loss.backward()
        opt.step(loss=loss)
        opt.zero_grad()
        assert opt.stats()["denom_ema"] == pytest.approx(expected, rel=1e-12)
        assert opt.stats()["grad_l1"] == pytest.approx(a.abs().sum().item(), rel=1e-12)


def test_eta_follows_the_formula_and_f_star_changes_it_mid_run() -> None:
    data = batches(25)
    model = make_model()
    opt = ScheduleFreePlus(model.parameters(), polyak_beta=0.5, warmup_steps=0)
    train(model, opt, data[:20])
    s = opt.stats()
    assert s["numerator"] == pytest.approx(s["loss"] + s["inner"], rel=1e-12)
    assert s["eta"] == pytest.approx(max(0.0, s["numerator"]) / s["denom_ema"], rel=1e-12)
    assert s["alpha"] == pytest.approx(s["eta"], rel=1e-12)  # lr = 1, no warmup

    twin_state = copy.deepcopy(opt.state_dict())  # state_dict() holds live tensors, as in torch
    twin_model = make_model()
    twin_model.load_state_dict(model.state_dict())
    twin = ScheduleFreePlus(twin_model.parameters(), polyak_beta=0.5, warmup_steps=0)
    twin.load_state_dict(twin_state)

    for group in opt.param_groups:
        group["f_star"] = 0.5
    train(model, opt, data[20:21])
    train(twin_model, twin, data[20:21])
    changed, base = opt.stats(), twin.stats()
    assert changed["loss"] == base["loss"]
    assert changed["numerator"] == pytest.approx(base["numerator"] - 0.5, rel=1e-12)
    assert changed["eta"] == pytest.approx(
        base["eta"] * (base["numerator"] - 0.5) / base["numerator"], rel=1e-9
    )
    assert changed["eta"] < base["eta"]


def test_negative_numerator_clips_the_step_to_zero() -> None:
    model = make_model()
    opt = ScheduleFreePlus(model.parameters(), f_star=100.0)
    train(model, opt, batches(3))
    s = opt.stats()
    assert s["numerator"] < 0 and s["eta"] == 0.0 and s["alpha"] == 0.0


def test_warmup_and_c_warmup_schedules() -> None:
    model = make_model()
    opt = ScheduleFreePlus(model.parameters(), lr=0.5, warmup_steps=4)
    seen = []
    train(model, opt, batches(10), on_step=lambda i: seen.append(opt.stats()))
    assert [s["warmup"] for s in seen[:5]] == [0.25, 0.5, 0.75, 1.0, 1.0]
    for s in seen:
        assert s["alpha"] == pytest.approx(s["warmup"] * 0.5 * s["eta"], rel=1e-12)
    # c_warmup defaults to 2 x warmup: no averaging for 8 steps. Step 9 carries the first
    # weight (c = w_9 / W_9 = 1 by definition); from step 10 on, c < 1.
    assert [s["c"] for s in seen[:9]] == [1.0] * 9
    assert seen[9]["c"] < 1.0
    assert opt.config()["c_warmup"] == 8


def test_sf_beta_anneals_log_linearly() -> None:
    model = make_model()
    opt = ScheduleFreePlus(model.parameters(), sf_beta=0.9, sf_beta_max=0.99, anneal_steps=10)
    betas = []
    train(model, opt, batches(12), on_step=lambda i: betas.append(opt.stats()["sf_beta"]))
    assert betas[4] == pytest.approx(1 - 10 ** (-1 - 0.5), rel=1e-12)  # halfway in log(1 - beta)
    assert betas[9:] == [pytest.approx(0.99)] * 3


# ---- parameters without gradients, groups ----------------------------------------------------


def test_parameters_without_gradients_and_empty_groups() -> None:
    model = make_model()
    frozen = torch.nn.Parameter(torch.ones(4, dtype=torch.float64))
    opt = ScheduleFreePlus(
        [{"params": []}, {"params": list(model.parameters())}, {"params": [frozen], "lr": 0.1}]
    )
    train(model, opt, batches(5))
    assert torch.equal(frozen, torch.ones(4, dtype=torch.float64))
    assert frozen not in opt.state or "z_minus_y" not in opt.state[frozen]
    opt.eval()
    opt.train()
    assert set(opt.stats()) == set(STATS_KEYS)


def test_all_groups_empty_is_refused() -> None:
    with pytest.raises(ValueError, match="no parameters"):
        ScheduleFreePlus([{"params": []}])


def test_a_refused_param_group_is_not_added() -> None:
    model = make_model()
    opt = ScheduleFreePlus([model.emb.weight])
    with pytest.raises(ValueError, match=r"Invalid lr \(parameter group 1\)"):
        opt.add_param_group({"params": [model.fc1.weight], "lr": -1.0})
    with pytest.raises(ValueError, match="polyak_beta must be the same"):
        opt.add_param_group({"params": [model.fc1.weight], "polyak_beta": 0.5})
    assert len(opt.param_groups) == 1
    opt.add_param_group({"params": [model.fc1.weight], "lr": 0.5})
    assert len(opt.param_groups) == 2


def test_shared_hyperparameters_must_agree_across_groups() -> None:
    model = make_model()
    with pytest.raises(ValueError, match="sf_beta must be the same in every parameter group"):
        ScheduleFreePlus(
            [{"params": [model.emb.weight]}, {"params": [model.fc1.weight], "sf_beta": 0.7}]
        )
    opt = ScheduleFreePlus([{"params": [model.emb.weight]}, {"params": [model.fc1.weight]}])
    opt.param_groups[0]["f_star"] = 1.0  # only one group: refused at the next step
    loss = loss_fn(model, batches(1)[0])
    loss.backward()
    with pytest.raises(ValueError, match="f_star must be the same"):
        opt.step(loss=loss)


def test_per_group_lr_scales_alpha() -> None:
    model = make_model()
    opt = ScheduleFreePlus(
        [
            {"params": [model.emb.weight, model.fc1.weight], "lr": 1.0},
            {
                "params": [
                    model.norm.weight,
                    model.norm.bias,
                    model.fc1.bias,
                    model.fc2.weight,
                    model.fc2.bias,
                ],
                "lr": 0.25,
            },
        ]
    )
    train(model, opt, batches(5))
    glob = opt.state[model.emb.weight]["sfplus"]
    assert glob["gamma_max"][1] == pytest.approx(0.25 * glob["gamma_max"][0], rel=1e-12)


# ---- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("lr", -1.0),
        ("lr", math.nan),
        ("lr", torch.tensor(1.0)),
        ("betas", (0.9,)),
        ("betas", (1.0, 0.95)),
        ("betas", (0.9, -0.1)),
        ("eps", -1e-8),
        ("weight_decay", -0.1),
        ("weight_decay", math.inf),
        ("sf_beta", 0.0),
        ("sf_beta", 1.0),
        ("sf_beta_max", 1.5),
        ("anneal_steps", -1),
        ("anneal_steps", 2.5),
        ("warmup_steps", -5),
        ("warmup_steps", True),
        ("c_warmup", -1),
        ("r", -0.5),
        ("weight_lr_power", -1.0),
        ("polyak_beta", 1.0),
        ("polyak_beta", -0.1),
        ("f_star", math.inf),
        ("f_star", "0"),
        ("foreach", "yes"),
    ],
)
def test_invalid_hyperparameters_are_refused_by_name(name: str, value: object) -> None:
    model = make_model()
    with pytest.raises(ValueError, match=rf"Invalid {name}"):
        ScheduleFreePlus(model.parameters(), **{name: value})
    with pytest.raises(ValueError, match=rf"Invalid {name} \(parameter group 0\)"):
        ScheduleFreePlus([{"params": model.parameters(), name: value}])


# ---- observability ---------------------------------------------------------------------------


def test_stats_keys_types_and_hook_contract() -> None:
    model = make_model()
    opt = ScheduleFreePlus(model.parameters(), weight_decay=2.0)
    assert opt.stats() == {}
    seen: list[dict[str, float]] = []
    opt.register_step_post_hook(lambda o, args, kwargs: seen.append(o.stats()))
    train(model, opt, batches(3))
    assert len(seen) == 3 and [s["step"] for s in seen] == [1.0, 2.0, 3.0]
    assert set(seen[-1]) == set(STATS_KEYS)
    assert all(type(v) is float for v in seen[-1].values())
    loss = loss_fn(model, batches(1)[0])
    loss.backward()
    opt.step(loss=loss)
    full = opt.stats(norms=True)
    assert set(full) == set(STATS_KEYS) | set(NORM_STATS_KEYS)
    assert all(type(v) is float and math.isfinite(v) for v in full.values())


def test_stats_keys_are_the_contracts_in_the_order_stats_returns_them() -> None:
    assert STATS_KEYS == contract.OPTIMIZER_STATS
    assert NORM_STATS_KEYS == contract.NORM_STATS
    model = make_model()
    opt = ScheduleFreePlus(model.parameters())
    train(model, opt, batches(2))
    assert tuple(opt.stats()) == STATS_KEYS
    assert tuple(opt.stats(norms=True)) == STATS_KEYS + NORM_STATS_KEYS


def test_config_is_plain_json() -> None:
    model = make_model()
    opt = ScheduleFreePlus(model.parameters(), lr=0.5, warmup_steps=10, weight_decay=20.0)
    cfg = json.loads(json.dumps(opt.config()))
    assert cfg["optimizer"] == "ScheduleFreePlus"
    assert cfg["lr"] == 0.5 and cfg["weight_decay"] == 20.0
    assert cfg["warmup_steps"] == 10 and cfg["c_warmup"] == 20
    assert cfg["polyak_beta"] == 0.9 and cfg["betas"] == [0.9, 0.95]
    assert cfg["num_parameters"] == sum(p.numel() for p in model.parameters())


def test_memory_is_three_buffers_per_parameter() -> None:
    model = make_model(dtype=torch.float32)
    opt = ScheduleFreePlus(model.parameters())
    train(model, opt, batches(2))
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    state_bytes = sum(
        t.numel() * t.element_size()
        for st in opt.state.values()
        for t in st.values()
        if isinstance(t, torch.Tensor)
    )
    assert state_bytes == 3 * param_bytes  # + the parameter itself (y) = 4; AdamW keeps 3


def test_bfloat16_parameters_step() -> None:
    model = make_model(dtype=torch.bfloat16)
    opt = ScheduleFreePlus(model.parameters(), warmup_steps=5)
    losses = train(model, opt, batches(40))
    assert all(math.isfinite(v) for v in opt.stats(norms=True).values())
    assert sum(losses[-5:]) < sum(losses[:5])


@pytest.mark.parametrize("join_numel", [_stats.JOIN_NUMEL, 300])
def test_norm_stats_count_every_tensor_once_whichever_way_it_is_reduced(
    monkeypatch: pytest.MonkeyPatch, join_numel: int
) -> None:
    """On the CPU small tensors are flattened together and reduced at once (in several goes
    when they pass JOIN_NUMEL elements); big, strided and half-precision ones one by one; a
    parameter without its ``z - y`` buffer or without a gradient adds no such sums. Every
    tensor is counted once: the norms equal the iterates' norms computed directly."""
    monkeypatch.setattr(_stats, "JOIN_NUMEL", join_numel)
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(*shape))
              for shape in [(64,), (300, 200), (10, 10), (7,), (128, 64), (3, 5)]]
    params.append(torch.nn.Parameter(torch.randn(32, 16).t()))  # strided
    params.append(torch.nn.Parameter(torch.randn(40, dtype=torch.bfloat16)))
    params.append(torch.nn.Parameter(torch.randn(50, dtype=torch.float64)))
    assert params[1].numel() >= _stats.SMALL_NUMEL > params[0].numel()
    for p in params:
        p.grad = torch.randn_like(p)
    params[2].grad = None  # no gradient this step
    # z - y buffers of the parameters' layout (the strided one strided), not small beside them
    deltas: list[torch.Tensor | None] = [torch.randn_like(p) for p in params]
    deltas[3] = None  # no buffer yet (a parameter before its first step)
    beta = 0.8
    stats = weight_norms(zip(params, deltas, strict=True), sf_beta_prev=beta,
                         train_mode=True)  # the parameters hold y

    def direct(k: float) -> float:
        total = 0.0
        for p, d in zip(params, deltas, strict=True):
            v = p.detach().double() + (k * d.double() if d is not None else 0.0)
            total += float((v * v).sum())
        return math.sqrt(total)

    assert stats["y_l2"] == pytest.approx(direct(0.0), rel=1e-6)
    assert stats["z_l2"] == pytest.approx(direct(1.0), rel=1e-6)
    assert stats["x_l2"] == pytest.approx(direct(1.0 - 1.0 / beta), rel=1e-6)
    grads = [p.grad.double() for p in params if p.grad is not None]
    assert len(grads) == len(params) - 1
    assert stats["grad_l2"] == pytest.approx(math.sqrt(sum(float((g * g).sum()) for g in grads)),
                                             rel=1e-6)


def test_works_with_vocab_sized_logits() -> None:
    # Guard for the conftest model itself (used by every test): the shapes line up.
    model = make_model()
    assert model(torch.arange(VOCAB)).shape == (VOCAB, VOCAB)


@pytest.mark.parametrize("foreach", [False, True])
def test_norm_stats_sum_over_parameters_of_several_dtypes(foreach: bool) -> None:
    # Accelerators sum the squares with one foreach norm per dtype (the CPU only when asked):
    # either way a model mixing dtypes gets every tensor counted once, half precision
    # accumulated in float32.
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(64, 32, dtype=dtype))
              for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float32)]
    opt = ScheduleFreePlus(params, warmup_steps=2)
    for _ in range(5):
        loss = sum((p.float() ** 2).mean() for p in params)
        loss.backward()
        opt.step(loss=loss)
    glob = opt._global()
    stats = weight_norms(  # train mode: the parameters hold y; .grad is the last step's
        ((p, opt.state[p]["z_minus_y"]) for p in params),
        sf_beta_prev=float(glob["sf_beta_prev"]), train_mode=True, foreach=foreach)
    y_direct = math.sqrt(sum((p.double() ** 2).sum().item() for p in params))
    g_direct = math.sqrt(sum((p.grad.double() ** 2).sum().item() for p in params))
    assert stats["y_l2"] == pytest.approx(y_direct, rel=1e-5)
    assert stats["grad_l2"] == pytest.approx(g_direct, rel=1e-5)
    default = opt.stats(norms=True)  # the CPU's default route
    assert all(stats[k] == pytest.approx(default[k], rel=1e-5) for k in stats)
    assert all(math.isfinite(stats[k]) and stats[k] > 0 for k in ("x_l2", "z_l2"))
