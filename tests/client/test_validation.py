"""Programmer errors raise at once, in the caller's thread, with a message that says what to fix."""

from __future__ import annotations

import math
import random
import threading
import tracemalloc
import warnings
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from curvecast.client import Monitor
from tests.client._helpers import FakeTransport


@pytest.fixture
def mon(spool_dir: Path):
    monitor = Monitor(project="p", transport=FakeTransport(), spool_dir=spool_dir)
    yield monitor
    monitor.finish(timeout=5)


@pytest.mark.parametrize(
    ("metrics", "error", "match"),
    [
        ({"bad name": 1.0}, ValueError, r"invalid metric name 'bad name'"),
        ({"x" * 201: 1.0}, ValueError, "invalid metric name"),
        ({"loss": "0.5"}, TypeError, r"metric 'loss': str '0.5' is not a number"),
        ({"loss": None}, TypeError, r"metric 'loss': None is not a number.*float\('nan'\)"),
        ({"flag": True}, TypeError, r"metric 'flag': True is not a number"),
        ({"loss": [1.0]}, TypeError, r"metric 'loss': list"),
        ({"loss": torch.ones(3)}, ValueError, r"shape \(3,\) is not a scalar.*t\.mean\(\)"),
        # One element is not enough: the docs promise 0-d tensors, and the error says how.
        ({"loss": torch.ones(1)}, ValueError,
         r"metric 'loss': a tensor of shape \(1,\) is not a scalar \(0-d\).*t\.squeeze\(\)"),
        ({"loss": torch.ones(1, 1)}, ValueError, r"shape \(1, 1\) is not a scalar \(0-d\)"),
        ({"loss": np.ones(1)}, ValueError, r"array of shape \(1,\) is not a scalar.*a\.item\(\)"),
        ({"loss": torch.tensor(True)}, TypeError, r"torch.bool tensor is not a real number"),
        ({"z": torch.tensor(1 + 2j)}, TypeError, "not a real number"),
    ],
)
def test_bad_metrics_raise(mon: Monitor, metrics, error, match) -> None:
    with pytest.raises(error, match=match):
        mon.log(1, metrics)


@pytest.mark.parametrize(
    ("step", "error", "match"),
    [
        (-1, ValueError, "step must be between 0 and 2\\*\\*62, got -1"),
        (2**63, ValueError, "step must be between"),
        (1.5, TypeError, "step must be an int, got float"),
        (True, TypeError, "step must be a Python int, got bool"),
        (torch.tensor(3), TypeError, r"call int\(\) on it"),
        ("3", TypeError, "step must be an int"),
    ],
)
def test_bad_steps_raise(mon: Monitor, step, error, match) -> None:
    with pytest.raises(error, match=match):
        mon.log(step, loss=1.0)


def test_accepted_values(mon: Monitor) -> None:
    mon.log(np.int64(3), a=1, b=2.5, c=np.float32(0.25), d=Fraction(1, 4), e=math.nan,
            f=math.inf, g=torch.tensor(1.5), h=np.array(2.0), j=10**400)
    mon.log(4, {"eval/loss": 1.0, "x-y.z_w": 2.0})


def test_a_cpu_tensor_is_read_at_once_without_its_graph_or_a_warning(mon: Monitor) -> None:
    """A loss on the CPU is stored as its value (no graph, nothing left to read later), without
    torch's warning about reading a tensor that requires grad, and what the loop does to the
    tensor after log() does not change what was logged."""
    w = torch.ones((), requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for step in (1, 2):  # the second call takes log()'s path for a tensor type seen before
            loss = w * 2
            mon.log(step, loss=loss, tokens=torch.tensor(7))
            _, _, stored, _ = mon._buffer[-1]
            assert stored == {"loss": 2.0, "tokens": 7}
            assert type(stored["loss"]) is float
    buffer = torch.tensor(0.5)
    mon.log(3, acc=buffer)
    buffer.fill_(0.25)  # a running metric updated in place
    assert mon._buffer[-1][2] == {"acc": 0.5}


def test_a_large_tensor_is_refused_without_reading_it(mon: Monitor) -> None:
    """A weight matrix logged by mistake is refused before its elements are read: no Python
    list of a million floats (tens of MB) is built on the way to the error."""
    weights = torch.ones(1000, 1000)
    mon.log(1, loss=torch.tensor(0.5))  # log()'s path for a tensor type seen before
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"shape \(1000, 1000\) is not a scalar"):
            mon.log(2, loss=torch.tensor(0.25), w=weights)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, f"log() allocated {peak:,} bytes refusing a large tensor"


def test_a_tensor_type_seen_before_is_still_checked(mon: Monitor) -> None:
    mon.log(1, loss=torch.tensor(0.5))
    with pytest.raises(ValueError, match=r"shape \(1,\) is not a scalar"):
        mon.log(2, loss=torch.tensor([0.5]))
    with pytest.raises(TypeError, match="torch.bool tensor is not a real number"):
        mon.log(2, loss=torch.tensor(True))
    with pytest.raises(TypeError, match="not a real number"):
        mon.log(2, loss=torch.tensor(1 + 2j))
    mon.log(2, loss=torch.tensor(7))  # an int tensor is a number


def test_step_going_backwards_warns_once_per_key(mon: Monitor) -> None:
    mon.log(10, loss=1.0, lr=0.1)
    with pytest.warns(RuntimeWarning, match="'loss' logged at step 5 after step 10") as record:
        mon.log(5, loss=2.0)
        mon.log(4, loss=3.0)  # not again
    assert len(record) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mon.log(11, loss=1.0, lr=0.1)  # forward again: fine


@pytest.mark.parametrize("seed", range(20))
def test_backwards_warnings_match_a_per_name_reference(spool_dir: Path, seed: int) -> None:
    """``log()`` checks names only when they differ from the last call's, or the step goes
    back: over random calls mixing shapes and steps, it warns exactly when a per-name record
    of the last step would (once per name)."""
    rng = random.Random(seed)
    shapes = [("loss", "lr"), ("loss",), ("eval/loss", "loss"), ("lr", "loss"), ("acc",)]
    monitor = Monitor(project="p", transport=FakeTransport(), spool_dir=spool_dir,
                      flush_interval=60)
    last: dict[str, int] = {}
    expected: list[str] = []
    step = 0
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(300):
            step = max(0, step + rng.choice([1, 1, 1, 0, -3]))
            names = rng.choice(shapes) if rng.random() < 0.3 else shapes[0]
            for name in names:
                if step < last.get(name, -1) and name not in expected:
                    expected.append(name)
                last[name] = step
            monitor.log(step, dict.fromkeys(names, 1.0))
    warned = [str(w.message).split("'")[1] for w in record if w.category is RuntimeWarning]
    assert warned == expected
    monitor.finish(timeout=5)


def test_a_new_name_is_checked_after_many_calls_with_the_same_names(mon: Monitor) -> None:
    for step in range(100):
        mon.log(step, loss=1.0, lr=0.1)
    with pytest.raises(ValueError, match="invalid metric name 'bad name'"):
        mon.log(100, {"loss": 1.0, "bad name": 2.0})
    mon.log(101, loss=1.0, lr=0.1)


def test_log_after_finish_raises(spool_dir: Path) -> None:
    monitor = Monitor(project="p", transport=FakeTransport(), spool_dir=spool_dir)
    monitor.finish(timeout=5)
    with pytest.raises(RuntimeError, match="after finish"):
        monitor.log(1, loss=1.0)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"project": "has space"}, ValueError, "invalid project 'has space'"),
        ({"run_name": "a\nb"}, ValueError, "invalid run_name"),
        ({"run_id": "not-a-uuid"}, ValueError, "run_id must be a UUID"),
        ({"config": {"lr": float("nan")}}, ValueError, "finite numbers only"),
        ({"config": {"model": object()}}, TypeError, "JSON-serialisable"),
        ({"total_steps": 0}, ValueError, r"config\['total_steps'\] must be an integer >= 1"),
        ({"config": {"c_warmup": 1.5}}, ValueError, r"config\['c_warmup'\]"),
        ({"config": {"weight_decay": -1}}, ValueError, r"config\['weight_decay'\]"),
        ({"config": {"fit_key": "eval loss"}}, ValueError, "invalid metric name"),
        ({"url": "127.0.0.1:8000"}, ValueError, "url must look like http://host:port"),
        ({"url": "http://127.0.0.1:80000"}, ValueError, r"url 'http://127.0.0.1:80000': Port out"),
        ({"url": "http://localhost:eight"}, ValueError, "url 'http://localhost:eight': Port could"),
        ({"norms_every": -1}, ValueError, "norms_every must be >= 0"),
    ],
)
def test_bad_construction_raises(spool_dir: Path, kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        Monitor(project=kwargs.pop("project", "p"), spool_dir=spool_dir, **kwargs)


def test_watch_needs_an_optimizer(mon: Monitor) -> None:
    with pytest.raises(TypeError, match="watch\\(\\) needs a torch.optim.Optimizer"):
        mon.watch(object())
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ValueError, match="invalid metric name"):
        mon.watch(opt, prefix="bad prefix ")


class _Recorder(torch.Tensor):
    """A tensor that records which thread runs which torch function on it."""

    calls: list[tuple[str, str]] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        cls.calls.append((threading.current_thread().name, name))
        return super().__torch_function__(func, types, args, kwargs or {})


def test_logging_a_tensor_reads_it_only_in_the_background(spool_dir: Path) -> None:
    """No value read (item/to/stack/tolist: a device sync on CUDA) in the training thread, for a
    tensor that is not a plain CPU one (a subclass here, as DTensor or a CUDA tensor would be)."""
    transport = FakeTransport()
    monitor = Monitor(project="p", transport=transport, spool_dir=spool_dir)
    loss = torch.tensor(0.75).as_subclass(_Recorder)
    _Recorder.calls.clear()
    monitor.log(1, loss=loss)
    monitor.log(2, loss=loss)  # a tensor type seen before: log()'s own check, no read either
    in_training_thread = {name for thread, name in _Recorder.calls
                          if thread == threading.current_thread().name}
    assert in_training_thread <= {"numel", "__get__"}, in_training_thread  # metadata only
    assert monitor.finish(timeout=10)
    background = {name for thread, name in _Recorder.calls if thread.startswith("curvecast")}
    assert background & {"__float__", "to", "stack", "reshape"}  # read there (a CPU tensor: float)
    [body] = [b for m, _, b in transport.requests if m == "POST"]
    assert b'"loss":[0.75,0.75]' in body
