"""ScheduleFreePlus on CUDA: every goal of the step computed on the device, measured in one run.

Step time against torch's AdamW (multi-tensor and fused), host syncs per step, and agreement
with the literal Algorithm 1, measured on a machine with a GPU. The GPU machine cannot edit this
repository, so the run is in two halves::

    # on the GPU machine, from the repository root (it starts no new model size after
    # --budget-s seconds, so that it ends within a 10-minute command):
    PYTHONPATH=. python3 -m bench run optimizer_cuda --out $OUT/optimizer_cuda.json
    # here, with that file copied to bench/data/: the BENCHMARKS.md section
    python -m bench run optimizer_cuda --report bench/data/optimizer_cuda_h200_device_scalars.json

    python -m bench run optimizer_cuda --smoke   # the same run on the CPU, tiny and quick

The results file is written again after every finished part, so a run stopped by its time limit
still returns what it measured; ``--budget-s`` stops starting new model sizes after that many
seconds (``--sizes 10M 50M --out b.json`` measures the ones left in a second run, and
``--report a.json b.json`` merges the two). What is measured, in one process so the baselines
share the conditions:

* **Step time** of every path against ``AdamW(foreach=True)`` and ``AdamW(fused=True)``:
  character transformers (``examples.charlm``) of about 1M, 10M, 50M, 200M and 1B parameters
  (float32; 1B with fewer contenders, for memory; a size that does not fit is recorded as
  such), each optimizer with its own copy of the same initial parameters and fixed gradients.
  Every optimizer runs ``STEPS`` steps between two CUDA events, round-robin, ``--rounds`` times;
  the median milliseconds per step, and the host time to issue them (the CPU's share: a step
  that never waits for the device is bounded by it at small sizes).
* **Host reads per step**: calls that read a tensor into Python, counted with a
  ``TorchFunctionMode`` (``bench.optimizer.optimizer.HostReads``; each waits for the GPU), and
  CUDA's own count of synchronising calls (``torch.cuda.set_sync_debug_mode``, which also sees a
  blocking host-to-device copy).
* **Agreement** with the literal Algorithm 1 (``sfplus/reference.py``): after 20 float32 steps of
  the 1M model, the largest |difference| of a parameter (``y``, and ``x`` after ``eval()``) over
  the largest |parameter|, for every path; and for a bfloat16 + float32 model (two parameter
  groups), the compiled step against the eager one.
* **Compilation**: the first step of each compiled path (a fresh Inductor cache for the
  process), and the graphs compiled over 1,000 steps whose step size changes every step (with
  ``lr`` and ``f_star`` also changed by hand mid-run): 0 is the goal.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import statistics
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench._cli import parser, publish
from bench.optimizer._cuda_report import merge, report
from bench.optimizer.optimizer import SF_KW, Contender, HostReads
from curvecast.sfplus import ScheduleFreePlus, _fused
from curvecast.sfplus.reference import ReferenceScheduleFreePlus
from examples.charlm import CharTransformer

#: name -> CharTransformer(d_model, n_layers, n_heads): about 1M ... 1B parameters, in the
#: order they are run (the goals against fused AdamW before the middle sizes, in case the
#: time budget runs out).
CUDA_SIZES = {
    "1M": (128, 5, 4), "200M": (2048, 4, 16), "1B": (4096, 5, 32), "10M": (512, 3, 8),
    "50M": (1024, 4, 16),
}
#: The ``--smoke`` run's models (CPU): every path, compiled ones included, and the move from
#: one model to the next, in a few minutes.
SMOKE_SIZES = {"tiny": (32, 1, 2), "small": (48, 1, 2)}
#: Steps between the two CUDA events of one timing (one step is too short to time alone).
STEPS = 10
ADAMW_KW: dict[str, Any] = {"lr": 1e-3, "weight_decay": 0.1}


def _sf(**kw: Any) -> Callable[[list[torch.nn.Parameter]], Any]:
    return lambda ps: ScheduleFreePlus(ps, **SF_KW, **kw)


ADAMW_FOREACH = Contender("AdamW (foreach)", lambda ps: torch.optim.AdamW(
    ps, foreach=True, **ADAMW_KW), False)
ADAMW_FUSED = Contender("AdamW (fused)", lambda ps: torch.optim.AdamW(
    ps, fused=True, **ADAMW_KW), False)
# device_scalars=True is CUDA's default; spelled out so that --smoke (CPU) runs the same paths.
HOST = Contender("SF+ host scalars (foreach)", _sf(device_scalars=False, foreach=True), True)
DEFAULT = Contender("SF+ device scalars, foreach (default)", _sf(device_scalars=True), True)
PER_TENSOR = Contender("SF+ device scalars, per tensor",
                       _sf(device_scalars=True, foreach=False), True)
FUSED_HOST = Contender("SF+ fused, host scalars", _sf(fused=True, device_scalars=False), True)
FUSED = Contender("SF+ fused (device scalars)", _sf(fused=True, device_scalars=True), True)
GRAPHED = Contender("SF+ fused + CUDA graph", _sf(
    fused=True, device_scalars=True, compile_mode="reduce-overhead"), True)
REFERENCE = Contender("reference (Alg. 1)", lambda ps: ReferenceScheduleFreePlus(ps, **SF_KW),
                      True)
#: Timed round-robin, the baselines first. The fused path with host scalars (the one before
#: device scalars; earlier runs have it at every size) only on the smallest model: its
#: compilation would cost the GPU session a minute per size.
TIMED = [ADAMW_FOREACH, ADAMW_FUSED, HOST, DEFAULT, FUSED_HOST, FUSED, GRAPHED]
TIMED_OTHERS = [c for c in TIMED if c is not FUSED_HOST]
#: At 1B parameters (16 GB of ScheduleFree+ state per contender): the ones that matter.
TIMED_LARGEST = [ADAMW_FOREACH, ADAMW_FUSED, DEFAULT, FUSED, GRAPHED]
COMPILED = (FUSED_HOST, FUSED, GRAPHED)
#: The paths whose agreement with the reference is measured.
AGREEING = [HOST, DEFAULT, PER_TENSOR, FUSED_HOST, FUSED, GRAPHED]
LOSS_VALUE = 3.0  # the Polyak step only needs a positive loss


def make_problem(size: str, sizes: dict[str, tuple[int, int, int]], device: str
                 ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Initial parameters and fixed gradients (``1e-3 N(0, 1)``), made on ``device``."""
    d_model, n_layers, n_heads = sizes[size]
    torch.manual_seed(0)
    with torch.device(device):
        model = CharTransformer(100, d_model=d_model, n_layers=n_layers, n_heads=n_heads)
    init = [p.detach() for p in model.parameters()]
    gen = torch.Generator(device=device).manual_seed(1)
    grads = [torch.randn(p.shape, generator=gen, device=device) * 1e-3 for p in init]
    return init, grads


def instantiate(contender: Contender, init: list[torch.Tensor], grads: list[torch.Tensor]
                ) -> tuple[Any, list[torch.nn.Parameter]]:
    params = [torch.nn.Parameter(t.clone()) for t in init]
    for p, g in zip(params, grads, strict=True):
        p.grad = g  # shared and read-only: no optimizer writes to .grad
    return contender.make(params), params


class Runner:
    """Steps one optimizer; the loss is a tensor on the device, as in a training loop."""

    def __init__(self, contender: Contender, opt: Any, device: str) -> None:
        self.contender, self.opt = contender, opt
        self.loss = torch.tensor(LOSS_VALUE, device=device)

    def step(self) -> None:
        if self.contender.takes_loss:
            self.opt.step(loss=self.loss)
        else:
            self.opt.step()


def _compile_failure() -> str | None:
    """Why ``torch.compile`` failed for the last step, if it did (the optimizer then uses its
    eager update for the rest of the process, with a warning); cleared, so that the next
    compiled path gets its own try."""
    reason = _fused._failed
    _fused._failed = None
    return None if reason is None else f"compilation failed: {reason[:300]}"


class CudagraphMessages(logging.Handler):
    """Inductor's messages about CUDA graphs (why one was skipped), kept for the results."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "cudagraph" in message.lower() and message[:300] not in self.messages:
            self.messages.append(message[:300])


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class CountingReads(HostReads):
    """``HostReads`` around a step whose compiled call runs outside the mode: a compiled
    function called under a ``TorchFunctionMode`` is compiled again for it (and reads nothing
    inside: ``fullgraph=True`` refuses any graph break, a read included)."""

    def __enter__(self) -> CountingReads:
        real_step, real_many = _fused.run_step, _fused.run_many

        def outside(fn: Callable[..., Any]) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                with torch.overrides._pop_mode_temporarily():
                    return fn(*args, **kwargs)
            return call

        self._restore = (real_step, real_many)
        _fused.run_step, _fused.run_many = outside(real_step), outside(real_many)  # type: ignore[method-assign]
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        _fused.run_step, _fused.run_many = self._restore  # type: ignore[method-assign]


def _host_reads(runner: Runner, device: str) -> dict[str, int | None]:
    """Host reads of one step and, on CUDA, the synchronising calls CUDA's sync debug mode
    reports."""
    with CountingReads() as reads:
        runner.step()
    out: dict[str, int | None] = {"host_reads": reads.count, "cuda_syncs": None}
    if device == "cuda":
        _sync(device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                runner.step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        out["cuda_syncs"] = sum("synchroniz" in str(w.message) for w in caught)
    return out


def time_size(size: str, sizes: dict[str, tuple[int, int, int]], device: str, rounds: int,
              timed: list[Contender]) -> dict[str, Any]:
    """Step times of ``timed`` on one model (round-robin), compile times, host reads."""
    # A new parameter list compiles anew anyway; forgetting the last model's graphs keeps
    # dynamo under its limit of graphs per function (and frees their CUDA graphs' memory).
    torch._dynamo.reset()
    if device == "cuda":
        from torch._inductor import cudagraph_trees

        cudagraph_trees.reset_cudagraph_trees()
        torch.cuda.empty_cache()
    init, grads = make_problem(size, sizes, device)
    out: dict[str, Any] = {"params": sum(t.numel() for t in init), "contenders": {},
                           "skipped": {}}
    runners: list[Runner] = []
    for c in timed:
        try:
            opt, _ = instantiate(c, init, grads)
            runner = Runner(c, opt, device)
            _sync(device)
            t0 = time.perf_counter()
            runner.step()  # a compiled path compiles here
            _sync(device)
            first = time.perf_counter() - t0
            for _ in range(2):
                runner.step()
            _sync(device)
        except Exception as exc:  # noqa: BLE001 - out of memory, or a path broken here
            out["skipped"][c.name] = f"{type(exc).__name__}: {str(exc)[:300]}"
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
            continue
        failed = _compile_failure()
        if failed:  # it fell back to the eager update: its times would be mislabelled
            out["skipped"][c.name] = failed
            continue
        runners.append(runner)
        out["contenders"][c.name] = {"compile_s": first if c in COMPILED else None,
                                     "first_step_s": first}
    times: dict[str, list[float]] = {r.contender.name: [] for r in runners}
    host: dict[str, list[float]] = {r.contender.name: [] for r in runners}
    for _ in range(rounds):
        for r in runners:
            _sync(device)
            if device == "cuda":
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
            t0 = time.perf_counter()
            for _ in range(STEPS):
                r.step()
            issued = time.perf_counter() - t0
            if device == "cuda":
                end.record()
                end.synchronize()
                times[r.contender.name].append(start.elapsed_time(end) / STEPS)
            else:
                times[r.contender.name].append(issued * 1e3 / STEPS)
            host[r.contender.name].append(issued * 1e3 / STEPS)
    for r in runners:
        entry = out["contenders"][r.contender.name]
        entry["ms"] = statistics.median(times[r.contender.name])
        entry["ms_min"] = min(times[r.contender.name])
        entry["host_ms"] = statistics.median(host[r.contender.name])
        entry.update(_host_reads(r, device))
    del runners
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def _relative(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    diff = max(float((p.detach().float() - q.detach().float()).abs().max())
               for p, q in zip(a, b, strict=True))
    return diff / max(float(q.detach().float().abs().max()) for q in b)


def agreement(size: str, sizes: dict[str, tuple[int, int, int]], device: str,
              steps: int = 20) -> dict[str, Any]:
    """Each path against the literal Algorithm 1 after ``steps`` float32 steps (y and x)."""
    init, grads = make_problem(size, sizes, device)
    ref_opt, ref_params = instantiate(REFERENCE, init, grads)
    ref = Runner(REFERENCE, ref_opt, device)
    for _ in range(steps):
        ref.step()
    ref_y = [p.detach().clone() for p in ref_params]
    ref_opt.eval()
    out: dict[str, Any] = {"model": size}
    for c in AGREEING:
        try:
            opt, params = instantiate(c, init, grads)
            runner = Runner(c, opt, device)
            for _ in range(steps):
                runner.step()
        except Exception as exc:  # noqa: BLE001 - the other paths still count
            out["skipped:" + c.name] = f"{type(exc).__name__}: {str(exc)[:300]}"
            continue
        failed = _compile_failure()
        if failed:
            out["skipped:" + c.name] = failed
            continue
        y = [p.detach().clone() for p in params]
        opt.eval()
        out[c.name] = {"y": _relative(y, ref_y), "x": _relative(params, ref_params)}
    return out


def _mixed_model(device: str) -> tuple[torch.nn.Module, list[dict[str, Any]]]:
    torch.manual_seed(0)
    with torch.device(device):
        model = CharTransformer(100, d_model=128, n_layers=2, n_heads=4)
    model.tok.to(torch.bfloat16)
    half = list(model.tok.parameters())
    rest = [p for p in model.parameters() if all(p is not q for q in half)]
    return model, [{"params": half, "lr": 0.5}, {"params": rest}]


def mixed_agreement(device: str, steps: int = 20) -> dict[str, Any]:
    """A bfloat16 group and a float32 group: the compiled step against the eager one (both with
    device scalars) after ``steps`` steps on fixed gradients, and the compiled step's reads."""
    results: dict[str, list[torch.Tensor]] = {}
    reads = None
    for name, kw in (("eager", {}), ("fused", {"fused": True})):
        model, groups = _mixed_model(device)
        gen = torch.Generator(device=device).manual_seed(3)
        for p in model.parameters():
            p.grad = (torch.randn(p.shape, generator=gen, device=device) * 1e-3).to(p.dtype)
        opt = ScheduleFreePlus(groups, device_scalars=True, **SF_KW, **kw)
        loss = torch.tensor(LOSS_VALUE, device=device)
        for _ in range(steps):
            opt.step(loss=loss)
        if name == "fused":
            with CountingReads() as counter:
                opt.step(loss=loss)
            reads = counter.count
            opt.step(loss=loss)
        else:
            opt.step(loss=loss)
            opt.step(loss=loss)
        results[name] = [p.detach().clone() for p in model.parameters()]
        dtypes = sorted({str(p.dtype) for p in model.parameters()})
    by_dtype: dict[str, float] = {}
    for p, q in zip(results["fused"], results["eager"], strict=True):
        key = str(q.dtype)
        by_dtype[key] = max(by_dtype.get(key, 0.0), _relative([p], [q]))
    return {"dtypes": dtypes, "relative_difference": by_dtype, "host_reads": reads,
            "steps": steps + 2}


def recompiles(size: str, sizes: dict[str, tuple[int, int, int]], device: str,
               steps: int) -> dict[str, Any]:
    """Graphs compiled after the first step over ``steps`` steps of each compiled path with
    device scalars: the step size changes every step (the loss changes), ``f_star`` at a
    third of the run and ``lr`` at two thirds."""
    from torch._dynamo.utils import counters

    out: dict[str, Any] = {}
    init, grads = make_problem(size, sizes, device)
    for c in (FUSED, GRAPHED):
        try:
            out[c.name] = _recompiles_of(c, init, grads, device, steps, counters)
        except Exception as exc:  # noqa: BLE001 - the other path still counts
            out[c.name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        failed = _compile_failure()
        if failed:
            out[c.name] = {"error": failed}
    return out


def _recompiles_of(c: Contender, init: list[torch.Tensor], grads: list[torch.Tensor],
                   device: str, steps: int, counters: Any) -> dict[str, Any]:
    opt, _ = instantiate(c, init, grads)
    etas: set[float] = set()
    before = after_first = 0
    _sync(device)
    t0 = time.perf_counter()
    for i in range(steps):
        if i == steps // 3:
            for group in opt.param_groups:
                group["f_star"] = 0.5
        if i == 2 * steps // 3:
            opt.param_groups[0]["lr"] = 0.25
        loss = torch.full((), LOSS_VALUE + math.sin(i), device=device)
        if i == 0:
            before = counters["stats"]["unique_graphs"]
        opt.step(loss=loss)
        if i == 0:
            _sync(device)
            after_first = counters["stats"]["unique_graphs"]
            t0 = time.perf_counter()
        if i % max(1, steps // 10) == 0:
            etas.add(opt.stats()["eta"])
    _sync(device)
    elapsed = time.perf_counter() - t0
    return {
        "steps": steps, "graphs_first_step": after_first - before,
        "graphs_after_first_step": counters["stats"]["unique_graphs"] - after_first,
        "distinct_step_sizes_seen": len(etas),
        "ms_per_step_with_stats_reads": elapsed * 1e3 / max(1, steps - 1),
        "inductor_counters": {k: v for k, v in counters["inductor"].items()
                              if "cudagraph" in k},
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    device = args.device
    sizes = SMOKE_SIZES if args.smoke else CUDA_SIZES
    small = next(iter(sizes))
    # A fresh Inductor cache, so the first compiled step is a real compilation.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
    started = time.perf_counter()
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__, "rounds": args.rounds, "steps": STEPS, "sf_kw": SF_KW,
        "smoke": args.smoke, "sizes": {}, "errors": {},
        # What the report needs to know about the contenders (the file describes itself).
        "contenders": {
            "order": [c.name for c in TIMED], "compiled": [c.name for c in COMPILED],
            "adamw_foreach": ADAMW_FOREACH.name, "adamw_fused": ADAMW_FUSED.name,
            "default": DEFAULT.name, "fused": FUSED.name, "graphed": GRAPHED.name,
        },
    }

    messages = CudagraphMessages()
    logging.getLogger("torch").addHandler(messages)
    if device == "cuda":
        # Inductor says why it skipped a CUDA graph in its performance hints.
        torch._logging.set_logs(perf_hints=True)

    def save() -> None:
        result["elapsed_s"] = time.perf_counter() - started
        result["cudagraph_messages"] = messages.messages
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))

    def part(name: str, fn: Callable[[], Any]) -> Any:
        print(f"[optimizer_cuda] {name} ...", flush=True)
        try:
            value = fn()
        except Exception:  # noqa: BLE001 - record and go on: the run is one-shot
            result["errors"][name] = traceback.format_exc()[-2000:]
            print(result["errors"][name], flush=True)
            value = None
        print(f"[optimizer_cuda] {name}: {json.dumps(value)[:600]}", flush=True)
        save()
        return value

    # The smallest model first: its compiled graphs then serve the agreement and the 1,000
    # steps (same shapes: no new compilation), which come before the bigger models.
    chosen = [small] if args.quick else [n for n in sizes if not args.sizes or n in args.sizes]
    for size in chosen:
        if size != chosen[0] and time.perf_counter() - started > args.budget_s:
            result["errors"][size] = f"not run: the {args.budget_s:.0f} s budget was spent"
            save()
            continue
        timed = TIMED if size == small else TIMED_LARGEST if size == "1B" else TIMED_OTHERS
        value = part(size, lambda size=size, timed=timed: time_size(
            size, sizes, device, args.rounds, timed))
        if value is not None:
            result["sizes"][size] = value
            save()
        if size == small:
            result["agreement"] = part("agreement", lambda: agreement(small, sizes, device))
            result["recompiles"] = part("recompiles", lambda: recompiles(
                small, sizes, device, 50 if args.smoke else 1000))
            result["mixed"] = part("mixed", lambda: mixed_agreement(device))
    return result


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__, quick="the smallest model only")
    cli.add_argument("--out", type=Path, help="measure here; write the results as JSON")
    cli.add_argument("--report", type=Path, nargs="+",
                     help="write the section from results files (several: merged)")
    cli.add_argument("--sizes", nargs="+", choices=list(CUDA_SIZES),
                     help="measure these model sizes only (default: all); the agreement and "
                     "compile counts come with the smallest")
    cli.add_argument("--device", default="cuda", help="cuda (cpu: a smoke test)")
    cli.add_argument("--rounds", type=int, default=None)
    cli.add_argument("--smoke", action="store_true",
                     help="on the CPU, a tiny model, few rounds: checks the run end to end")
    cli.add_argument("--budget-s", type=float, default=420.0,
                     help="start no new model size after this many seconds")
    args = cli.parse_args(argv)
    if args.report:
        result = merge([json.loads(path.read_text()) for path in args.report])
        text, outcome = report(result, args.report)
        return publish(args, "optimizer_cuda", "Optimizer step time on CUDA", text, outcome)
    if args.smoke:
        args.device = "cpu"
        args.sizes = None
    args.rounds = args.rounds or (2 if args.smoke else 10)
    result = measure(args)
    text, outcome = report(result, [args.out] if args.out else None)
    print(f"Result: {outcome}\n\n{text}")
    return 0
