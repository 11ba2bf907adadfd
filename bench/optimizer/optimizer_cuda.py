"""ScheduleFreePlus on CUDA: step time against torch's AdamW, host syncs and Algorithm 1.

Step time against torch's AdamW (multi-tensor and fused), host syncs per step, and agreement
with the literal Algorithm 1, measured on a machine with a GPU. The GPU machine cannot edit this
repository, so the run is in two halves::

    python -m bench run optimizer_cuda --out cuda.json      # on the GPU machine
    python -m bench run optimizer_cuda --report cuda.json   # here: the BENCHMARKS.md section

What is measured, in one process so the baselines share the conditions (``optimizer``
measures the same on the CPU; its models, gradients and contenders are reused):

* **Step time.** Character transformers of about 1M, 10M, 50M and 200M parameters (float32),
  each optimizer with its own copy of the same initial parameters and fixed gradients. Every
  optimizer runs ``STEPS`` steps between two CUDA events, round-robin, ``--rounds`` times; the
  table gives the median milliseconds per step and its ratio to AdamW in the same rounds.
* **The fused update** (``fused=True``, ``torch.compile``): its step time, and its first step
  (the compilation) with a fresh Inductor cache.
* **Host syncs per step**: calls that read a tensor's value into Python, counted with a
  ``TorchFunctionMode`` (``optimizer.HostReads``); on CUDA each one waits for the GPU.
* **Agreement**: the parameters after 20 steps of each path (the default multi-tensor path and
  the fused one), against ``sfplus/reference.py``'s literal Algorithm 1 on the same GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench._cli import parser, publish
from bench._report import markdown_table
from bench.optimizer.optimizer import (
    CONTENDERS,
    FUSED,
    REFERENCE,
    SF_KW,
    SIZES,
    Contender,
    HostReads,
    instantiate,
    make_problem,
    step,
)

#: A model of about 200M parameters besides bench.optimizer's, for a GPU.
CUDA_SIZES = {**SIZES, "200M": (2048, 4, 16)}
#: Steps between the two CUDA events of one timing (one step is too short to time alone).
STEPS = 10
ADAMW_FUSED = Contender("AdamW (fused)", lambda ps: torch.optim.AdamW(
    ps, lr=1e-3, weight_decay=0.1, fused=True), False)
#: Timed round-robin: the baseline first.
TIMED = [CONTENDERS[0], ADAMW_FUSED, CONTENDERS[1], CONTENDERS[2], FUSED]


def _on(device: str, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.to(device) for t in tensors]


def time_steps(size: str, device: str, rounds: int) -> dict[str, Any]:
    """Median ms per step of each contender (round-robin), the fused compile time, and the
    host reads of one step."""
    init, grads = make_problem(size)
    init, grads = _on(device, init), _on(device, grads)
    opts = [(c, instantiate(c, init, grads)[0]) for c in TIMED]
    out: dict[str, Any] = {"params": sum(t.numel() for t in init), "compile_s": None}
    for c, opt in opts:  # warm-up; the fused path's first step compiles
        t0 = time.perf_counter()
        step(c, opt)
        if device == "cuda":
            torch.cuda.synchronize()
        if c is FUSED:
            out["compile_s"] = time.perf_counter() - t0
        for _ in range(2):
            step(c, opt)
    times: dict[str, list[float]] = {c.name: [] for c in TIMED}
    for _ in range(rounds):
        for c, opt in opts:
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                    enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                for _ in range(STEPS):
                    step(c, opt)
                end.record()
                end.synchronize()
                times[c.name].append(start.elapsed_time(end) / STEPS)
            else:
                t0 = time.perf_counter()
                for _ in range(STEPS):
                    step(c, opt)
                times[c.name].append((time.perf_counter() - t0) * 1e3 / STEPS)
    out["ms"] = {name: statistics.median(v) for name, v in times.items()}
    out["ms_min"] = {name: min(v) for name, v in times.items()}
    reads = {}
    for c, opt in opts:
        with HostReads() as mode:
            step(c, opt)
        reads[c.name] = mode.count
    out["host_reads"] = reads
    del opts
    return out


def agreement(device: str, steps: int = 20) -> dict[str, float]:
    """Largest |difference| of the parameters after ``steps`` steps, relative to the largest
    |parameter|, of each ScheduleFreePlus path against the literal Algorithm 1."""
    init, grads = make_problem("1M")
    init, grads = _on(device, init), _on(device, grads)
    ref_opt, ref_params = instantiate(REFERENCE, init, grads)
    for _ in range(steps):
        step(REFERENCE, ref_opt)
    scale = max(float(p.detach().abs().max()) for p in ref_params)
    out = {}
    for c in (CONTENDERS[1], FUSED):
        opt, params = instantiate(c, init, grads)
        for _ in range(steps):
            step(c, opt)
        diff = max(float((p.detach() - r.detach()).abs().max())
                   for p, r in zip(params, ref_params, strict=True))
        out[c.name] = diff / scale
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    device = args.device
    # A fresh Inductor cache, so the fused path's first step is a real compilation.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
    sizes = ["1M"] if args.quick else list(CUDA_SIZES)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__, "rounds": args.rounds, "steps": STEPS, "sizes": {},
        "sf_kw": SF_KW,
    }
    for size in sizes:
        SIZES[size] = CUDA_SIZES[size]  # make_problem reads optimizer's table
        print(f"[optimizer_cuda] {size} ...", flush=True)
        result["sizes"][size] = time_steps(size, device, args.rounds)
        print(f"[optimizer_cuda] {size}: {result['sizes'][size]['ms']}", flush=True)
    result["agreement"] = agreement(device)
    return result


def report(result: dict[str, Any], kept_in: Path | None) -> tuple[str, str]:
    """The section's text from a results file (``kept_in``: where that file is kept), and its
    one-line result."""
    base = TIMED[0].name
    headers = ["model", "params", *[c.name for c in TIMED]]
    rows = []
    for size, r in result["sizes"].items():
        row: list[object] = [size, f"{r['params'] / 1e6:.1f}M"]
        for c in TIMED:
            ms = r["ms"][c.name]
            row.append(f"{ms:.3f}" if c.name == base else
                       f"{ms:.3f} ({ms / r['ms'][base]:.2f}x; min "
                       f"{r['ms_min'][c.name] / r['ms_min'][base]:.2f}x)")
        rows.append(row)
    any_size = next(iter(result["sizes"].values()))
    reads = [[c.name, any_size["host_reads"][c.name]] for c in TIMED]
    compile_s = ", ".join(f"{s} {r['compile_s']:.1f} s" for s, r in result["sizes"].items()
                          if r["compile_s"] is not None)
    agree = ", ".join(f"{name}: {d:.1e}" for name, d in result["agreement"].items())
    kept = f" (results kept in `{kept_in.as_posix()}`)" if kept_in else ""
    text = (
        f"Measured on {result['device']} with torch {result['torch']} by `python -m bench run "
        f"optimizer_cuda --out cuda.json --rounds {result['rounds']}`{kept}; the machine line "
        "is where this report was written. Float32 parameters, fixed gradients (`optimizer`'s "
        f"models and contenders, ScheduleFree+ with {result['sf_kw']}); {result['steps']} steps "
        f"between two CUDA events, round-robin, median of {result['rounds']} rounds; in brackets "
        "the ratio to `AdamW(foreach=True)` in the same rounds (median, and of the fastest "
        "round). The default (`foreach=None`) is the multi-tensor path on CUDA. Milliseconds per "
        "step:\n\n" + markdown_table(headers, rows) +
        "\n\nCalls that read a tensor into Python during one step (ScheduleFreePlus's one "
        "read, the sums for the Polyak step size, waits for the GPU; AdamW(foreach)'s read "
        "host-resident step counters):\n\n"
        + markdown_table(["optimizer", "host reads per step"], reads) +
        f"\n\nFirst `fused=True` step of each model (compiling, a fresh Inductor cache): "
        f"{compile_s}. Largest |difference| of a parameter from the literal Algorithm 1 "
        f"(`sfplus/reference.py`) after 20 steps of the 1M model, over the largest |parameter|: "
        f"{agree}."
    )
    ratio = {c.name: [r["ms"][c.name] / r["ms"][base] for r in result["sizes"].values()]
             for c in TIMED}
    default, fused = TIMED[2].name, TIMED[-1].name
    largest = next(reversed(result["sizes"]))
    outcome = (f"ScheduleFreePlus's step {min(ratio[default]):.2f}–{max(ratio[default]):.2f}× "
               f"`AdamW(foreach=True)`'s (default path), fused=True {ratio[fused][-1]:.2f}× at "
               f"{largest} parameters; {any_size['host_reads'][default]} host read per step")
    return text, outcome


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__, quick="the 1M model only")
    cli.add_argument("--out", type=Path, help="measure here; write the results as JSON")
    cli.add_argument("--report", type=Path, help="write the section from a results file")
    cli.add_argument("--device", default="cuda", help="cuda (cpu: a smoke test)")
    cli.add_argument("--rounds", type=int, default=15)
    args = cli.parse_args(argv)
    if args.report:
        text, outcome = report(json.loads(args.report.read_text()), args.report)
        return publish(args, "optimizer_cuda", "Optimizer step time on CUDA", text, outcome)
    result = measure(args)
    print("\n\n".join(report(result, args.out)))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0
