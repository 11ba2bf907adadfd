"""``Monitor.watch()``: what the optimizer hook sends, checked against the optimizer itself."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from curvecast.client import Monitor
from curvecast.contract import NORM_STATS, OPTIMIZER_STATS
from tests.client._helpers import FakeTransport


def _sent(transport: FakeTransport) -> dict[tuple[str, int], float]:
    """(key, step) -> value of every point POSTed."""
    out: dict[tuple[str, int], float] = {}
    for method, _, body in transport.requests:
        if method == "POST":
            assert body is not None
            data = json.loads(body)
            for key, column in data["values"].items():
                for step, value in zip(data["steps"], column, strict=True):
                    if value is not None:
                        assert (key, step) not in out
                        out[key, step] = value
    return out


def test_watch_sends_exactly_the_optimizers_statistics(spool_dir: Path) -> None:
    """Every step's stats() under ``opt/`` (the optimizer's own ``step`` is the row, not a
    metric), the norms only every ``norms_every`` steps, with the values stats(norms=True)
    gives; nothing else, and log()'s points beside them."""
    from curvecast import sfplus

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = sfplus.ScheduleFreePlus(model.parameters(), warmup_steps=2, weight_decay=1.0)
    transport = FakeTransport()
    mon = Monitor(project="p", transport=transport, spool_dir=spool_dir, norms_every=3)
    mon.watch(opt)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    expected: dict[tuple[str, int], float] = {}
    for step in range(1, 8):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step(loss=loss)
        # The parameters and gradients are still those the hook saw.
        stats = opt.stats(norms=step % 3 == 0)
        opt.zero_grad()
        mon.log(step, loss=loss)
        expected.update({(f"opt/{k}", step): v for k, v in stats.items() if k != "step"})
        expected["loss", step] = loss.item()
    assert mon.finish(timeout=10)
    sent = _sent(transport)
    assert sent == expected
    assert {k for k, _ in sent} == {f"opt/{k}" for k in (*OPTIMIZER_STATS, *NORM_STATS)
                                    if k != "step"} | {"loss"}
    assert {s for k, s in sent if k == "opt/x_l2"} == {3, 6}
    assert mon.stats()["points_logged"] == len(expected)


def test_watch_hands_device_statistics_to_the_batcher_unread(spool_dir: Path) -> None:
    """With the step size on the device, the step and the hook read no tensor in the training
    thread (the records hold the step's 0-d tensors); the batcher thread reads them, and what
    is sent is what stats() reads."""
    from curvecast import sfplus
    from tests.sfplus.test_host_syncs import HostReads

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = sfplus.ScheduleFreePlus(model.parameters(), warmup_steps=2, weight_decay=1.0,
                                  device_scalars=True)
    transport = FakeTransport()
    mon = Monitor(project="p", transport=transport, spool_dir=spool_dir, norms_every=3)
    mon.watch(opt)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    expected: dict[tuple[str, int], float] = {}
    for step in range(1, 8):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        with HostReads() as reads:
            opt.step(loss=loss)  # and the hook, a step post-hook
        # Norm steps read the norms in the hook (asked for, and documented to cost a sync).
        assert reads.count == (0 if step % 3 else 2)
        assert isinstance(opt.step_stats["eta"], torch.Tensor)
        stats = opt.stats(norms=step % 3 == 0)
        opt.zero_grad()
        expected.update({(f"opt/{k}", step): v for k, v in stats.items() if k != "step"})
    assert mon.finish(timeout=10)
    assert _sent(transport) == expected


def test_step_stats_is_each_steps_own_mapping() -> None:
    """What the hook relies on to append ``step_stats`` without copying it: a new mapping each
    step, never changed afterwards, equal to stats()."""
    from curvecast import sfplus

    param = torch.nn.Parameter(torch.ones(3))
    opt = sfplus.ScheduleFreePlus([param], warmup_steps=1)
    seen = []
    for _ in range(3):
        param.grad = torch.full((3,), 0.5)
        opt.step(loss=1.0)
        assert dict(opt.step_stats) == opt.stats()
        seen.append((opt.step_stats, dict(opt.step_stats)))
    assert len({id(view) for view, _ in seen}) == 3
    assert all(dict(view) == copy for view, copy in seen)
    assert [copy["step"] for _, copy in seen] == [1.0, 2.0, 3.0]


def test_the_hook_stops_at_finish(spool_dir: Path) -> None:
    """After finish() a watched optimizer keeps stepping and nothing more is buffered."""
    from curvecast import sfplus

    param = torch.nn.Parameter(torch.ones(3))
    opt = sfplus.ScheduleFreePlus([param], warmup_steps=1)
    mon = Monitor(project="p", transport=FakeTransport(), spool_dir=spool_dir, norms_every=1)
    mon.watch(opt)
    param.grad = torch.full((3,), 0.5)
    opt.step(loss=1.0)
    assert mon.finish(timeout=10)
    logged = mon.stats()["points_logged"]
    assert logged == len(OPTIMIZER_STATS) - 1 + len(NORM_STATS)
    opt.step(loss=1.0)
    assert mon.stats()["points_logged"] == logged and mon.stats()["buffered"] == 0


def test_a_step_reads_the_clock_once(spool_dir: Path) -> None:
    """``log()`` at the step the hook just recorded takes the hook's wall time (a step's points
    share one); at a step the hook did not record, it reads the clock itself."""
    from curvecast import sfplus

    ticks = iter(range(1000, 2000))
    param = torch.nn.Parameter(torch.ones(3))
    opt = sfplus.ScheduleFreePlus([param], warmup_steps=1)
    transport = FakeTransport()
    mon = Monitor(project="p", transport=transport, spool_dir=spool_dir, norms_every=0,
                  wall_clock=lambda: float(next(ticks)))
    mon.watch(opt)
    param.grad = torch.full((3,), 0.5)
    opt.step(loss=1.0)  # step 1: the hook reads the clock (1000)
    mon.log(1, loss=1.0)  # the same step: no reading
    mon.log(2, loss=0.5)  # a step the hook has not recorded: its own reading (1001)
    assert mon.finish(timeout=10)
    [body] = [json.loads(b) for m, _, b in transport.requests if m == "POST" and b]
    assert body["steps"] == [1, 2] and body["wall_time"] == [1000.0, 1001.0]
