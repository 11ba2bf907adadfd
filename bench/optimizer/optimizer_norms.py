"""The cost of ScheduleFree+'s weight and gradient norms against the optimizer's own step.

The norms are what ``stats(norms=True)`` adds and ``Monitor.watch()`` asks for every
``norms_every`` steps. Models: the MLP of ``client_overhead`` (6 tensors) and ``examples.charlm``'s
CharTransformer at about 1M and 10M parameters (64 and 40 tensors) plus a deep MLP of 98 small
tensors (24 blocks of Linear + LayerNorm), where a per-tensor cost shows most. Each model gets
20 real training steps, then rounds of: one ``step()`` (gradients kept), one norms call (with
a baseline: step, norms, step, baseline norms, the two norms in turns); the median over rounds
of each, on the thread's CPU clock (CPU) or with a device synchronisation around each call
(CUDA). Baseline in the same run: the step itself. With
``--baseline-checkout DIR`` the norms of ``DIR/sfplus/_stats.py`` with its ``functional.py``
(an older checkout) are timed
in the same rounds, on the same optimizer state.

Usage: ``python -m bench run optimizer_norms [--device cuda] [--baseline-checkout DIR]
[--no-write]``
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from bench._cli import parser, publish
from bench._report import checkout_commit, markdown_table
from curvecast.sfplus import ScheduleFreePlus
from curvecast.sfplus import _stats as current_stats
from curvecast.sfplus._state import DELTA
from examples.charlm import CharTransformer


def models() -> dict[str, Callable[[], tuple[nn.Module, torch.Tensor, torch.Tensor]]]:
    def mlp() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
        model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(),
                              nn.Linear(512, 10))
        return model, torch.randn(64, 256), torch.randint(0, 10, (64,))

    def deep() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
        layers: list[nn.Module] = []
        for _ in range(24):
            layers += [nn.Linear(128, 128), nn.LayerNorm(128), nn.GELU()]
        return nn.Sequential(*layers, nn.Linear(128, 10)), torch.randn(32, 128), \
            torch.randint(0, 10, (32,))

    def charlm(d: int, layers: int, heads: int) -> Callable[[], Any]:
        def make() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
            model = CharTransformer(96, d_model=d, n_layers=layers, n_heads=heads,
                                    block_size=64)
            x = torch.randint(0, 96, (8, 64))
            return model, x, torch.randint(0, 96, (8, 64))
        return make

    return {"MLP 256-512-512-10 (client_overhead)": mlp,
            "deep MLP, 24 x (Linear 128 + LayerNorm)": deep,
            "CharTransformer ~1M": charlm(128, 5, 4),
            "CharTransformer ~10M": charlm(512, 3, 8)}


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_stats(checkout: Path) -> ModuleType:
    """``sfplus/_stats.py`` of an older checkout, as a module of its own, with that checkout's
    ``sfplus/functional.py`` (its reductions, ``F.sumsq`` and ``F.dot``) in place of ours."""
    module = _load("baseline_stats", checkout / "sfplus/_stats.py")
    module.F = _load("baseline_functional", checkout / "sfplus/functional.py")  # type: ignore[attr-defined]
    return module


def measure(make: Callable[[], Any], device: torch.device, rounds: int,
            baseline: ModuleType | None) -> dict[str, Any]:
    torch.manual_seed(0)
    model, x, y = make()
    model, x, y = model.to(device), x.to(device), y.to(device)
    opt = ScheduleFreePlus(model.parameters(), warmup_steps=5, weight_decay=5.0)

    def loss_of() -> torch.Tensor:
        out = model(x)
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    for _ in range(20):
        loss = loss_of()
        loss.backward()
        opt.step(loss=loss)
        opt.zero_grad(set_to_none=False)
    loss = loss_of()
    loss.backward()
    fixed = loss.detach()

    def norms_of(module: ModuleType) -> Callable[[], Any]:
        def call() -> Any:
            glob = opt._global()
            return module.weight_norms(
                ((p, opt.state.get(p, {}).get(DELTA)) for g in opt.param_groups
                 for p in g["params"]),
                sf_beta_prev=float(glob["sf_beta_prev"]), train_mode=bool(glob["train_mode"]))
        return call

    calls: dict[str, Callable[[], Any]] = {"step": lambda: opt.step(loss=fixed),
                                           "norms": norms_of(current_stats)}
    if baseline is not None:
        calls["norms, baseline checkout"] = norms_of(baseline)
    cuda = device.type == "cuda"

    def timed(call: Callable[[], Any]) -> float:
        if cuda:
            torch.cuda.synchronize()
            start = time.perf_counter()
            call()
            torch.cuda.synchronize()
            return time.perf_counter() - start
        start = time.thread_time()
        call()
        return time.thread_time() - start

    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(3):  # warm-up
        for call in calls.values():
            call()
    norms = [name for name in calls if name != "step"]
    for r in range(rounds):
        # Each norms call right after a step, as in training, the two codes taking turns
        # (the one after the other finds the tensors in cache).
        for name in norms if r % 2 == 0 else norms[::-1]:
            samples["step"].append(timed(calls["step"]))
            samples[name].append(timed(calls[name]))
    tensors = sum(1 for _ in model.parameters())
    params = sum(p.numel() for p in model.parameters())
    return {"tensors": tensors, "params": params,
            **{name: statistics.median(s) * 1e6 for name, s in samples.items()}}


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__)
    cli.add_argument("--device", default="cpu")
    cli.add_argument("--rounds", type=int, default=30)
    cli.add_argument("--baseline-checkout", type=Path, default=None)
    args = cli.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    baseline = load_stats(args.baseline_checkout) if args.baseline_checkout else None
    rows = []
    for name, make in models().items():
        r = measure(make, device, args.rounds, baseline)
        row: list[object] = [name, r["tensors"], f"{r['params']:,}", f"{r['step']:.0f}",
                             f"{r['norms']:.0f}", f"**{r['norms'] / r['step']:.2f}**"]
        if baseline is not None:
            old = r["norms, baseline checkout"]
            row += [f"{old:.0f}", f"{old / r['step']:.2f}", f"**{r['norms'] / old:.2f}**"]
        rows.append(row)
        print(row, flush=True)
    unit = "µs (device synchronised)" if device.type == "cuda" else "µs CPU (one thread)"
    headers = ["model", "tensors", "parameters", f"step(), {unit}", "norms, this code",
               "norms / step"]
    if baseline is not None:
        headers += ["norms, baseline checkout", "baseline norms / step", "this / baseline"]
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    base_name = (checkout_commit(args.baseline_checkout).split()[0]
                 if args.baseline_checkout else "")
    text = (f"Device: {where}, torch {torch.__version__}. Median of {args.rounds} rounds; each "
            "round a `step()` then a norms call (`weight_norms`, what `stats(norms=True)` adds) "
            "on the same state, after 20 training steps. Baseline: the optimizer's step, same "
            "rounds"
            + (f"; and the norms of a checkout of `{base_name}` (a step before each of the two "
               "norms calls, their order alternating)" if baseline is not None else "")
            + ".\n\n" + markdown_table(headers, rows))
    shares = [float(str(row[5]).strip("*")) for row in rows]
    result = f"the norms cost {min(shares):.2f}–{max(shares):.2f}× a step on {where}"
    if baseline is not None:
        vs = [float(str(row[8]).strip("*")) for row in rows]
        result += f", {min(vs):.2f}–{max(vs):.2f}× the baseline checkout's norms"
    cuda = device.type == "cuda"
    return publish(args, "optimizer_norms" + ("_cuda" if cuda else ""),
                   "ScheduleFree+'s norms against its step" + (" on CUDA" if cuda else ""),
                   text, result)
