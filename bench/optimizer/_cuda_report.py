"""The BENCHMARKS.md section of ``bench.optimizer_cuda`` from its results files.

Apart from the measurement so that a results file from the GPU machine can be reported here;
a results file names its own contenders and their roles (``result["contenders"]``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench._report import markdown_table

__all__ = ["merge", "report"]


def _goal(met: bool | None) -> str:
    return "n/a" if met is None else ("met" if met else "**NOT met**")


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs' results as one (a second run that measured the sizes a first one had no
    time for): the later run's model sizes win; the other parts come from the first run that
    has them."""
    out = {**results[0], "sizes": {}, "errors": {}}
    for result in results:
        out["sizes"].update(result["sizes"])
        for part in ("agreement", "recompiles", "mixed"):
            if not out.get(part) and result.get(part):
                out[part] = result[part]
        out["errors"].update(result.get("errors") or {})
    out["errors"] = {k: v for k, v in out["errors"].items() if k not in out["sizes"]}
    return out


def report(result: dict[str, Any], kept_in: list[Path] | None) -> tuple[str, str]:
    """The section's text from a results file (``kept_in``: where the files are kept), and its
    one-line result: how many of the goals were met."""
    if any("contenders" not in r for r in result["sizes"].values()):
        raise SystemExit("a results file of this benchmark before device scalars (its own "
                         "commit's bench/optimizer_cuda.py reports it)")
    roles = result["contenders"]
    names: list[str] = roles["order"]
    # Smallest model first (bench.optimizer_cuda runs them in another order).
    result = {**result, "sizes": dict(sorted(result["sizes"].items(),
                                             key=lambda item: item[1]["params"]))}
    rows, reads = [], []
    for size, r in result["sizes"].items():
        cs = r["contenders"]
        base, fused = cs.get(roles["adamw_foreach"]), cs.get(roles["adamw_fused"])
        row: list[object] = [size, f"{r['params'] / 1e6:.1f}M"]
        for name in names:
            c = cs.get(name)
            if c is None:
                row.append(r["skipped"].get(name, "-")[:14])
            elif name == roles["adamw_foreach"]:
                row.append(f"{c['ms']:.3f}")
            else:
                parts = [f"{c['ms'] / base['ms']:.2f}x" if base else "",
                         f"{c['ms'] / fused['ms']:.2f}x fused" if fused else ""]
                row.append(f"{c['ms']:.3f} ({'; '.join(p for p in parts if p)})")
        rows.append(row)
    host_rows = [[size, *(f"{r['contenders'][n]['host_ms']:.3f}" if n in r["contenders"]
                          else "-" for n in names)] for size, r in result["sizes"].items()]
    first = next(iter(result["sizes"].values()), None)
    if first:
        for name in names:
            c = first["contenders"].get(name)
            if c:
                reads.append([name, c["host_reads"],
                              "-" if c["cuda_syncs"] is None else c["cuda_syncs"]])
    compile_rows = [[size, *(f"{r['contenders'][c]['compile_s']:.1f}"
                             if c in r["contenders"] else "-" for c in roles["compiled"])]
                    for size, r in result["sizes"].items()]

    def ratio(size: str, name: str, to: str) -> float | None:
        cs = result["sizes"].get(size, {}).get("contenders", {})
        return cs[name]["ms"] / cs[to]["ms"] if name in cs and to in cs else None

    goals: list[list[object]] = []
    sf_names = [n for n in names if n.startswith("SF+")]
    device_paths = [roles["default"], roles["fused"], roles["graphed"]]
    reads_ok = [first["contenders"][n]["host_reads"] == 0 for n in device_paths
                if first and n in first["contenders"]]
    goals.append(["0 host reads per step (device-scalar paths)",
                  ", ".join(f"{n}: {first['contenders'][n]['host_reads']}"
                            for n in device_paths if first and n in first["contenders"]),
                  _goal(all(reads_ok) if reads_ok else None)])
    for sizes, to, limit in ((("1M", "10M", "50M", "200M"), roles["adamw_foreach"], 1.0),
                             (("200M", "1B"), roles["adamw_fused"], 1.3)):
        for size in sizes:
            best = [(ratio(size, n, to), n) for n in sf_names]
            best = [b for b in best if b[0] is not None]
            if best:
                value, name = min(best)
                default = ratio(size, roles["default"], to)
                goals.append([f"<= {limit:.1f}x {to} at {size}",
                              f"best {value:.2f}x ({name})"
                              + (f"; default {default:.2f}x" if default is not None else ""),
                              _goal(value <= limit)])
    agree = dict(result.get("agreement") or {})
    agree_model = agree.pop("model", "1M")
    agree_skipped = {k[len("skipped:"):]: v for k, v in agree.items() if k.startswith("skip")}
    agree = {k: v for k, v in agree.items() if not k.startswith("skip")}
    if agree:
        worst = max(max(v["y"], v["x"]) for v in agree.values())
        goals.append(["parity with Algorithm 1 after 20 float32 steps (<= 1e-6)",
                      f"worst {worst:.1e}", _goal(worst <= 1e-6)])
    rec = dict(result.get("recompiles") or {})
    rec_failed = {n: v["error"] for n, v in rec.items() if "error" in v}
    rec = {n: v for n, v in rec.items() if "error" not in v}
    if rec_failed:
        goals.append(["no recompiles after the first step over 1,000 steps with a changing "
                      "step size", "failed: " + "; ".join(f"{n}: {e[:80]}"
                                                          for n, e in rec_failed.items()),
                      _goal(False)])
    if rec:
        goals.append(["no recompiles after the first step over 1,000 steps with a changing "
                      "step size",
                      ", ".join(f"{n}: {v['graphs_after_first_step']} new graphs over "
                                f"{v['steps']} steps" for n, v in rec.items()),
                      _goal(all(v["graphs_after_first_step"] == 0 for v in rec.values()))])
    agree_text = "; ".join(f"{n}: y {v['y']:.1e}, x {v['x']:.1e}" for n, v in agree.items())
    if agree_skipped:
        agree_text += "; failed: " + "; ".join(f"{n}: {e[:80]}" for n, e in agree_skipped.items())
    mixed = result.get("mixed") or {}
    mixed_text = (", ".join(f"{k} {v:.1e}" for k, v in mixed["relative_difference"].items())
                  + f" after {mixed['steps']} steps; host reads of a step: "
                  f"{mixed['host_reads']}") if mixed else "not measured"
    errors = result.get("errors") or {}
    kept = (" (the results are kept in " + ", ".join(f"`{p.as_posix()}`" for p in kept_in)
            + ")" if kept_in else "")
    met = sum(1 for g in goals if g[2] == "met")
    outcome = (f"{met} of {len(goals)} goals met on {result['device']}: "
               + "; ".join(f"{g[0]}: {g[1]}" for g in goals[:3]))
    text = (
        "Made on the GPU machine with `PYTHONPATH=. python3 -m bench run optimizer_cuda --out "
        f"$OUT/optimizer_cuda.json`{kept}; the machine line above is where this report was "
        f"written. Measured on {result['device']} with torch {result['torch']}. Float32 "
        f"parameters, fixed gradients, a loss tensor on the device; ScheduleFree+ with "
        f"{result['sf_kw']}; {result['steps']} steps between two CUDA events, round-robin, "
        f"median of {result['rounds']} rounds; in brackets the ratio to `AdamW(foreach=True)` "
        "and to `AdamW(fused=True)` in the same rounds. `device scalars`: the step size "
        "computed on the GPU (the default there); `host scalars`: read on the host once a step "
        "(the CPU's default); `fused`: the whole step in one `torch.compile` call; `CUDA "
        "graph`: that call with `compile_mode=\"reduce-overhead\"`.\n\n"
        "### Goals\n\n" + markdown_table(["goal", "measured", ""], goals) +
        "\n\n### Milliseconds per step\n\n"
        + markdown_table(["model", "params", *names], rows) +
        "\n\nHost milliseconds to issue a step (the CPU's share; a step that never waits for "
        "the GPU overlaps it with the GPU's work):\n\n"
        + markdown_table(["model", *names], host_rows) +
        "\n\nCalls that read a tensor into Python during one step (`HostReads`), and the "
        "synchronising calls CUDA's sync debug mode reported in one step:\n\n"
        + markdown_table(["optimizer", "host reads", "CUDA syncs"], reads) +
        "\n\nFirst step of each compiled path (seconds; the compilation, with a fresh Inductor "
        "cache for the process):\n\n"
        + markdown_table(["model", *roles["compiled"]], compile_rows) +
        f"\n\nAgreement with the literal Algorithm 1 after 20 float32 steps of the "
        f"{agree_model} model, largest |difference| over the largest |parameter|: "
        f"{agree_text}.  \nbfloat16 + float32 groups, the compiled step against the eager one: "
        f"{mixed_text}."
        + (f"\n\nParts that failed or were not run: {', '.join(errors)} (details in the "
           "results file)." if errors else "")
    )
    return text, outcome
