"""Optimizer step time, state memory and host syncs: ScheduleFreePlus vs AdamW vs the reference.

Run from the repository root::

    python -m bench run optimizer            # full run (~10 minutes on 2 busy CPU cores)
    python -m bench run optimizer --quick    # smoke run: 1M parameters, few repeats
    python -m bench run optimizer --baseline-checkout DIR   # also DIR's optimizer, same rounds

What is measured, all in one process so the baselines share the conditions:

* **Step time.** Character transformers (``examples.charlm.CharTransformer``) of about 1M, 10M and
  50M parameters. Every optimizer gets its own copy of the same initial parameters and the same
  fixed gradients, and only ``step()`` is timed. Optimizers are timed round-robin (one step each
  per round), so a burst of load from other processes hits all of them alike; the table reports
  the median over rounds. Done at 1 and 2 intra-op threads (the machine has 2 cores).
* **Where the step size is computed**: the eager default on CPU (host scalars: one read of the
  step's sums, then Python floats) against ``device_scalars=True`` (the accelerators' default:
  tensor arithmetic, no read), and the same two for ``fused=True``, in the same rounds; this is
  the measurement behind the CPU defaults.
* **The fused update** (``fused=True``: ``torch.compile``), with host scalars (one compiled call
  for the update) and with device scalars (the whole step in one compiled call): step time in
  the same rounds, and the compile time -- the first step of a process, measured on its own
  with a fresh Inductor cache (``TORCHINDUCTOR_CACHE_DIR`` points to a new temporary directory),
  once per thread count.
* **A baseline checkout** (``--baseline-checkout DIR``): the default path of the optimizer in
  ``DIR`` (an older commit's ``sfplus/``), timed in the same rounds, so a change's cost on the
  CPU is a ratio measured in one run.
* **Block size** of the CPU per-tensor path (``sfplus.functional.CPU_BLOCK``) at 10M parameters
  (``--block-sizes``: printed, not part of the section).
* **State memory**: bytes of optimizer state per byte of parameters, and parameter-sized tensors
  per parameter including the parameter itself.
* **Host syncs per step**: every call that reads a tensor value into Python (``item``, ``tolist``,
  ``cpu``, ``numpy``, ``float()``, ``bool()``, ...) counted with a ``TorchFunctionMode``. On CPU
  these cost nothing; on an accelerator each is a device-to-host synchronisation (except reads of
  tensors that live on the host, such as AdamW's ``step`` counters).
"""

from __future__ import annotations

import functools
import gc
import importlib
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

import curvecast.sfplus.functional as sff
from bench._cli import parser, publish
from bench._report import checkout_commit, markdown_table
from curvecast.sfplus import ScheduleFreePlus
from curvecast.sfplus.reference import ReferenceScheduleFreePlus
from examples.charlm import CharTransformer

SIZES = {  # name -> CharTransformer(d_model, n_layers, n_heads)
    "1M": (128, 5, 4),
    "10M": (512, 3, 8),
    "50M": (1024, 4, 16),
}
SF_KW: dict[str, Any] = {"warmup_steps": 10, "weight_decay": 5.0}  # the heavier (decay) path
ADAMW_KW: dict[str, Any] = {"lr": 1e-3, "weight_decay": 0.1, "foreach": True}
LOSS = torch.tensor(3.0)  # the Polyak step only needs a positive loss value


@dataclass(frozen=True)
class Contender:
    name: str
    make: Callable[[list[torch.nn.Parameter]], Any]  # ScheduleFreePlus.step takes loss=
    takes_loss: bool


CONTENDERS = [
    Contender("AdamW (foreach)", lambda ps: torch.optim.AdamW(ps, **ADAMW_KW), False),
    Contender("ScheduleFreePlus (default)", lambda ps: ScheduleFreePlus(ps, **SF_KW), True),
    Contender(
        "ScheduleFreePlus (foreach=True)",
        lambda ps: ScheduleFreePlus(ps, foreach=True, **SF_KW),
        True,
    ),
    Contender(
        "ScheduleFreePlus (device_scalars=True)",
        lambda ps: ScheduleFreePlus(ps, device_scalars=True, **SF_KW),
        True,
    ),
    Contender(
        "ScheduleFreePlus (fused=True, device_scalars=False)",
        lambda ps: ScheduleFreePlus(ps, fused=True, device_scalars=False, **SF_KW),
        True,
    ),
    Contender(
        "ScheduleFreePlus (fused=True)",
        lambda ps: ScheduleFreePlus(ps, fused=True, **SF_KW),
        True,
    ),
    Contender("reference (Alg. 1)", lambda ps: ReferenceScheduleFreePlus(ps, **SF_KW), True),
]
TIMED = CONTENDERS[:6]  # interleaved round-robin; the reference gets rounds of its own
REFERENCE = CONTENDERS[6]
DEVICE_SCALARS = CONTENDERS[3]
FUSED = CONTENDERS[4]
FUSED_DEVICE = CONTENDERS[5]
COMPILED = (FUSED, FUSED_DEVICE)
#: (threads, contender name) -> its first step (the compilation).
COMPILE_SECONDS: dict[tuple[int, str], float] = {}
#: (threads, model, contender name) -> median seconds per step of the main rounds.
MEDIANS: dict[tuple[int, str, str], float] = {}


def baseline_contender(checkout: Path) -> Contender:
    """The default ScheduleFreePlus of another checkout (``DIR/sfplus``), importable beside
    ours: its package is copied to a temporary folder as ``baseline_sfplus`` (its imports of
    ``curvecast.sfplus`` rewritten; ``curvecast.contract`` stays ours)."""
    root = Path(tempfile.mkdtemp(prefix="curvecast-baseline-"))
    shutil.copytree(checkout / "sfplus", root / "baseline_sfplus")
    for path in (root / "baseline_sfplus").glob("*.py"):
        path.write_text(re.sub(r"\bcurvecast\.sfplus\b", "baseline_sfplus", path.read_text()))
    sys.path.insert(0, str(root))
    module = importlib.import_module("baseline_sfplus")
    name = f"baseline ({checkout_commit(checkout).split()[0]})"
    return Contender(name, lambda ps: module.ScheduleFreePlus(ps, **SF_KW), True)


class HostReads(TorchFunctionMode):
    """Counts calls that read a tensor's value into Python (a device sync on accelerators)."""

    NAMES = frozenset(
        {"item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__"}
    )

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if getattr(func, "__name__", "") in self.NAMES:
            self.count += 1
        return func(*args, **(kwargs or {}))


def make_problem(size: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Initial parameter values and fixed gradients of the model for ``size``."""
    d_model, n_layers, n_heads = SIZES[size]
    torch.manual_seed(0)
    model = CharTransformer(100, d_model=d_model, n_layers=n_layers, n_heads=n_heads)
    init = [p.detach().clone() for p in model.parameters()]
    gen = torch.Generator().manual_seed(1)
    grads = [torch.randn(p.shape, generator=gen) * 1e-3 for p in init]
    return init, grads


def instantiate(
    contender: Contender, init: list[torch.Tensor], grads: list[torch.Tensor]
) -> tuple[Any, list[torch.nn.Parameter]]:
    params = [torch.nn.Parameter(t.clone()) for t in init]
    for p, g in zip(params, grads, strict=True):
        p.grad = g  # shared and read-only: no optimizer writes to .grad
    return contender.make(params), params


def step(contender: Contender, opt: Any) -> None:
    if contender.takes_loss:
        opt.step(loss=LOSS)
    else:
        opt.step()


def time_round_robin(
    runners: list[tuple[str, Callable[[], None]]], rounds: int, warmup: int = 2
) -> dict[str, list[float]]:
    """Seconds per call of each runner, timed one call each per round (``rounds`` samples)."""
    for _ in range(warmup):
        for _, fn in runners:
            fn()
    times: dict[str, list[float]] = {name: [] for name, _ in runners}
    for _ in range(rounds):
        for name, fn in runners:
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def _cell(samples: list[float], base: list[float]) -> str:
    med, lo = statistics.median(samples), min(samples)
    ratio_med = med / statistics.median(base)
    ratio_min = lo / min(base)
    return f"{1e3 * med:.1f} ({ratio_med:.2f}x; min {ratio_min:.2f}x)"


def bench_step_times(sizes: list[str], threads: int, rounds: int,
                     timed: list[Contender]) -> list[list[object]]:
    """AdamW, ScheduleFreePlus (every path) interleaved; the reference in rounds of its own.

    The literal reference allocates several parameter-sized temporaries per step (about 1 GB
    at 50M parameters), which disturbs whatever runs next; it gets separate rounds against
    AdamW so that it cannot skew the main comparison.
    """
    torch.set_num_threads(threads)
    torch._dynamo.reset()  # compile again for this thread count (timed below)
    rows: list[list[object]] = []
    for size in sizes:
        init, grads = make_problem(size)
        n = sum(t.numel() for t in init)
        big = n > 20_000_000
        opts = [(c, *instantiate(c, init, grads)) for c in timed]
        for compiled in COMPILED:
            if (threads, compiled.name) not in COMPILE_SECONDS:
                fused_opt = next(o for c, o, _ in opts if c is compiled)
                t0 = time.perf_counter()
                step(compiled, fused_opt)
                seconds = COMPILE_SECONDS[threads, compiled.name] = time.perf_counter() - t0
                print(f"threads {threads}: {compiled.name} first step {seconds:.1f} s",
                      flush=True)
        runners: list[tuple[str, Callable[[], None]]] = [
            (c.name, functools.partial(step, c, o)) for c, o, _ in opts
        ]
        main = time_round_robin(runners, max(6, rounds // 2) if big else rounds)
        del opts, runners
        gc.collect()
        pair = [(c, *instantiate(c, init, grads)) for c in (CONTENDERS[0], REFERENCE)]
        ref_runners: list[tuple[str, Callable[[], None]]] = [
            (c.name, functools.partial(step, c, o)) for c, o, _ in pair
        ]
        ref = time_round_robin(ref_runners, 3 if big else max(3, rounds // 3), warmup=1)
        del pair, ref_runners
        gc.collect()
        for name, samples in main.items():
            MEDIANS[threads, size, name] = statistics.median(samples)
        base = main[CONTENDERS[0].name]
        row: list[object] = [
            threads,
            size,
            f"{n / 1e6:.1f}M",
            f"{1e3 * statistics.median(base):.1f}",
        ]
        row += [_cell(main[c.name], base) for c in timed[1:]]
        row.append(_cell(ref[REFERENCE.name], ref[CONTENDERS[0].name]))
        rows.append(row)
        print("threads", threads, size, row[3:], flush=True)
        del init, grads
        gc.collect()
    return rows


def bench_block_sizes(threads: int, rounds: int) -> list[list[object]]:
    """ScheduleFreePlus's CPU block size at 10M parameters, timed against AdamW."""
    torch.set_num_threads(threads)
    init, grads = make_problem("10M")
    adamw, _ = instantiate(CONTENDERS[0], init, grads)
    sfp, _ = instantiate(CONTENDERS[1], init, grads)
    attr = "CPU_BLOCK" if threads == 1 else "CPU_BLOCK_THREADED"
    original = getattr(sff, attr)
    per_thread = [1 << 14, 1 << 16, 1 << 18, 1 << 19, 1 << 20, 0]
    runners: list[tuple[str, Callable[[], None]]] = [("adamw", adamw.step)]

    def with_block(b: int) -> Callable[[], None]:
        def run() -> None:
            setattr(sff, attr, b)
            try:
                sfp.step(loss=LOSS)
            finally:
                setattr(sff, attr, original)

        return run

    runners += [(str(b), with_block(b)) for b in per_thread]
    times = time_round_robin(runners, rounds)
    med = {k: statistics.median(v) for k, v in times.items()}
    rows: list[list[object]] = []
    for b in per_thread:
        if b:
            label = f"{b * threads:,}" + (" (default)" if b == original else "")
        else:
            label = "unblocked"
        rows.append(
            [threads, label, f"{1e3 * med[str(b)]:.1f}", f"{med[str(b)] / med['adamw']:.2f}x"]
        )
    return rows


def bench_memory_and_syncs() -> list[list[object]]:
    init, grads = make_problem("1M")
    param_bytes = sum(t.numel() * t.element_size() for t in init)
    rows: list[list[object]] = []
    for c in (c for c in CONTENDERS if c not in COMPILED):  # fused: their eager twins' state
        opt, params = instantiate(c, init, grads)
        counts = []
        for _ in range(4):
            with HostReads() as reads:
                step(c, opt)
            counts.append(reads.count)
        state_bytes = 0
        big_tensors = 0
        for st in opt.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    state_bytes += v.numel() * v.element_size()
                    big_tensors += v.dim() > 0
        per_param = 1 + big_tensors / len(params)
        rows.append(
            [c.name, f"{state_bytes / param_bytes:.2f}", f"{per_param:g}", counts[-1], len(params)]
        )
    return rows


def _ratio_line(label: str, num: Contender | str, den: Contender | str,
                threads: list[int]) -> str:
    """``label``: the ratio of the medians of two contenders, per thread count and model."""
    num_name = num if isinstance(num, str) else num.name
    den_name = den if isinstance(den, str) else den.name
    cells = []
    for th in threads:
        ratios = [f"{size} {MEDIANS[th, size, num_name] / MEDIANS[th, size, den_name]:.2f}x"
                  for (t, size, name) in MEDIANS if t == th and name == num_name]
        cells.append(f"{th} thread(s): " + ", ".join(ratios))
    return f"{label}: " + "; ".join(cells) + ".  \n"


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__, quick="1M parameters only, few rounds")
    cli.add_argument("--rounds", type=int, default=None, help="timed rounds per size")
    cli.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    cli.add_argument("--baseline-checkout", type=Path, default=None,
                     help="also time DIR/sfplus's default path (an older checkout)")
    cli.add_argument("--block-sizes", action="store_true",
                     help="also time the CPU path's block sizes at 10M parameters (printed)")
    args = cli.parse_args(argv)
    # A cold Inductor cache, so that the compile time reported is what a first run pays.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="curvecast-bench-inductor-")
    sizes = ["1M"] if args.quick else list(SIZES)
    rounds = args.rounds or (3 if args.quick else 12)
    baseline = baseline_contender(args.baseline_checkout) if args.baseline_checkout else None
    timed = TIMED + ([baseline] if baseline else [])
    load_before = os.getloadavg()

    step_rows = [row for th in args.threads
                 for row in bench_step_times(sizes, th, rounds, timed)]
    if args.block_sizes:
        block_rows = [row for th in args.threads
                      for row in bench_block_sizes(th, max(3, rounds // 2))]
        print(markdown_table(["threads", "block", "ms/step", "vs AdamW"], block_rows))
    mem_rows = bench_memory_and_syncs()
    load_after = os.getloadavg()

    def ratio(cell: object) -> float:
        return float(str(cell).split("(")[1].split("x")[0])

    verdict, results = [], []
    columns = ["threads", "model", "params", "AdamW foreach"] + [c.name for c in timed[1:]]
    default_col, fused_col = columns.index(TIMED[1].name), columns.index(FUSED_DEVICE.name)
    for th in args.threads:
        big = [r for r in step_rows if r[0] == th and r[1] in ("10M", "50M")]
        if big:
            worst = max(ratio(r[default_col]) for r in big)
            worst_fused = max(ratio(r[fused_col]) for r in big)
            compile_s = ", ".join(
                f"{c.name.split('(')[1].rstrip(')')} "
                f"**{COMPILE_SECONDS.get((th, c.name), math.nan):.1f} s**" for c in COMPILED)
            verdict.append(
                f"{th} thread(s): fused=True **{worst_fused:.2f}x** "
                f"({'met' if worst_fused <= 1.0 else 'NOT met'}), the default path "
                f"**{worst:.2f}x** ({'met' if worst <= 1.0 else 'NOT met'}); the first fused "
                f"step (compiling): {compile_s}"
                + (" (a cold Inductor cache)" if th == args.threads[0] else " (recompiled)"))
            results.append(f"{th} thread(s) {worst_fused:.2f}× (fused) and {worst:.2f}× "
                           "(default)")
    ratios = (
        _ratio_line("`device_scalars=True` / the default (host scalars) on the CPU",
                    DEVICE_SCALARS, TIMED[1], args.threads)
        + _ratio_line("`fused=True`: device scalars (its default, one compiled call) / host "
                      "scalars", FUSED_DEVICE, FUSED, args.threads)
        + (_ratio_line(f"This checkout's default / the {baseline.name}'s, same rounds",
                       TIMED[1], baseline, args.threads) if baseline else "")
    )
    body = (
        "ScheduleFreePlus against `torch.optim.AdamW(foreach=True)` and the literal Algorithm 1 "
        "(`sfplus/reference.py`) on `examples/charlm.py` transformers, on CPU (torch "
        f"{torch.__version__}): the same parameters and fixed gradients for each, only `step()` "
        f"timed, round-robin; the median ms per step over {rounds} rounds (50M: half as many), "
        "its ratio to AdamW's, and the ratio of minimums. The reference runs in rounds of its "
        "own (its allocations disturb whatever runs next). ScheduleFreePlus with "
        "`weight_decay=5`, AdamW with 0.1. `default` is what CPU picks: the step size on the "
        "host (one read of the step's sums, free on a CPU) and the per-tensor path in "
        "cache-sized blocks; `device_scalars=True` computes the step size with tensor "
        "operations, as accelerators do by default; `fused=True` compiles the step with "
        "`torch.compile` (with device scalars, its default, one call for the whole step; compile "
        "time not in the step times)."
        + (f" `{baseline.name}`: that commit's default path, timed in the same rounds."
           if baseline else "")
        + f" Load average {load_before[0]:.1f} before, {load_after[0]:.1f} after, on "
        f"{os.cpu_count()} shared cores: the ratios, measured in the same rounds, are the "
        "result; the 2-thread rows are dominated by oversubscription.\n\n"
        "Goal, ≤ 1.0x AdamW's step at 10M and 50M parameters: "
        + "; ".join(verdict) + ".\n\n" + ratios + "\n"
        + markdown_table(columns + [REFERENCE.name], step_rows)
        + "\n\nState memory and host syncs, 1M-parameter model: optimizer-state bytes per "
        "parameter byte, parameter-sized tensors per parameter (itself included), and calls "
        "that read a tensor into Python during one `step()` (`HostReads`: a device sync on an "
        "accelerator, but for AdamW's host-resident `step` counters; with device scalars "
        "ScheduleFreePlus reads nothing):\n\n"
        + markdown_table(
            ["optimizer", "state/param bytes", "tensors/param", "host reads/step", "param tensors"],
            mem_rows,
        )
    )
    result = ("step time against AdamW's at 10M–50M parameters, the worst of the two: "
              + "; ".join(results) + " (goal ≤ 1.0×)" if results else
              "no 10M–50M model measured (a quick run): no verdict on the goal")
    return publish(args, "optimizer", "Optimizer step time on CPU: ScheduleFreePlus against AdamW",
                   body, result)
