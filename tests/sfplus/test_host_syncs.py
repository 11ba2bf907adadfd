"""Host reads: none per step with device scalars (one with host scalars), none for stats()
with host scalars and one per step with device scalars, and none for the step_stats mapping.

On CPU there is no device to wait for, so we count what *would* be a synchronisation on an
accelerator: every call that reads a tensor's value into Python (``item``, ``tolist``, ``cpu``,
``float()``, ``bool()``, ...), intercepted with a ``TorchFunctionMode``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from curvecast.sfplus import ScheduleFreePlus, _fused
from curvecast.sfplus.reference import ReferenceScheduleFreePlus

from .conftest import batches, loss_fn, make_model

HOST_READS = {"item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__"}


class HostReads(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if getattr(func, "__name__", "") in HOST_READS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _reads_per_step(opt_cls: type, loss_as_float: bool = False, **kw: Any) -> int:
    model = make_model(dtype=torch.float32)
    opt = opt_cls(model.parameters(), warmup_steps=2, weight_decay=1.0, **kw)
    counts = []
    for batch in batches(4):
        loss = loss_fn(model, batch)
        loss.backward()
        value: Any = loss.item() if loss_as_float else loss
        with HostReads() as reads:
            opt.step(loss=value)
        counts.append(reads.count)
        opt.zero_grad()
    assert len(set(counts[1:])) == 1, counts
    return counts[-1]


def test_one_host_read_per_step_with_host_scalars() -> None:
    assert _reads_per_step(ScheduleFreePlus, foreach=True) == 1
    assert _reads_per_step(ScheduleFreePlus, foreach=False) == 1
    assert _reads_per_step(ScheduleFreePlus, loss_as_float=True) == 1


@pytest.mark.parametrize("kw", [
    {"foreach": True}, {"foreach": False}, {"foreach": True, "loss_as_float": True},
    {"foreach": False, "loss_as_float": True},
])
def test_no_host_read_per_step_with_device_scalars(kw: dict[str, Any]) -> None:
    # What accelerators do by default, forced on the CPU: the loss, the sums, the Polyak step
    # and the averaging weight stay tensors from the reduction to the update.
    assert _reads_per_step(ScheduleFreePlus, device_scalars=True, **kw) == 0


def test_no_host_read_per_step_in_the_fused_step_with_device_scalars(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The compiled step's code, run uncompiled (the compiled one: test_device_scalars).
    monkeypatch.setattr(_fused, "step_kernel", lambda mode=None: _fused.step_many_)
    assert _reads_per_step(ScheduleFreePlus, device_scalars=True, fused=True) == 0
    assert _reads_per_step(ScheduleFreePlus, fused=True) == 0  # fused's default, CPU included
    assert _reads_per_step(ScheduleFreePlus, device_scalars=True, fused=True,
                           loss_as_float=True) == 0


def test_the_literal_reference_reads_once_per_parameter() -> None:
    # For contrast (and to prove the counter works): the oracle reads two values per parameter.
    n_params = len(list(make_model().parameters()))
    assert _reads_per_step(ReferenceScheduleFreePlus) >= 2 * n_params


def test_stats_are_free_and_norms_cost_one_read() -> None:
    model = make_model(dtype=torch.float32)
    opt = ScheduleFreePlus(model.parameters())
    loss = loss_fn(model, batches(1)[0])
    loss.backward()
    opt.step(loss=loss)
    with HostReads() as reads:
        opt.stats()
    assert reads.count == 0
    with HostReads() as reads:
        opt.stats(norms=True)
    assert reads.count == 1


def test_device_statistics_are_read_when_asked_once_per_step() -> None:
    """With device scalars the step hands its statistics over unread (``step_stats`` holds 0-d
    tensors); ``stats()`` reads them in one transfer and keeps the floats."""
    model = make_model(dtype=torch.float32)
    opt = ScheduleFreePlus(model.parameters(), device_scalars=True)
    for batch in batches(2):
        loss = loss_fn(model, batch)
        loss.backward()
        opt.step(loss=loss)
        with HostReads() as reads:
            mapping = opt.step_stats
            assert isinstance(mapping["eta"], torch.Tensor) and mapping["eta"].ndim == 0
            assert type(mapping["step"]) is float
        assert reads.count == 0
        with HostReads() as reads:
            first = opt.stats()
            again = opt.stats()
        assert reads.count == 1 and first == again
        assert all(type(v) is float for v in first.values())
        assert first["eta"] == mapping["eta"].item()
