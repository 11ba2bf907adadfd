"""Gradient-norm drift on real ScheduleFree+ runs: what drives it, and what the alert rules say.

Run from the repository root (after ``python -m bench run sfplus_corpus`` has trained the runs)::

    python -m bench run drift_study        # analyse + replay every corpus run, write BENCHMARKS.md

For every ScheduleFree+ run of the corpus (``bench/data/sfplus_corpus``) it measures, from the
end of the alert burn-in (the contract's ``alert_burn_in``) to the end of the run:

* the gradient-norm growth: the median of log ||g||_1 (logged every step) over the last 5% of
  the run minus its median over the 5% right after the burn-in, as a factor; the same for
  ||g||_2 (every 10 steps); and the largest growth reached at any step (same windows);
* the change of the weight norms ||x|| (the averaged model) and ||z|| (the AdamC iterate);
* the final and best eval loss (at x);

and replays the run through the service's alert rules exactly as the worker would see it
streamed (:func:`curvecast.service.alerting.engine.replay`), recording which rules fired and
when (as a fraction of the run). The trend rule's targets are checked: every run whose gradient
norm grew >= 4x gets ``grad_norm_trend`` before 60% of its length; no run that stayed within
2x gets anything from any drift rule.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass

import numpy as np

from bench import _corpus
from bench._cli import parser, publish
from bench._report import markdown_table
from curvecast.contract import EVAL_LOSS_KEYS, TRAIN_LOSS_KEY, RunConfig, telemetry_key
from curvecast.service.alerting.engine import replay
from curvecast.service.alerting.rules import RULES, Series
from curvecast.service.alerting.rules.stats import rolling_median

#: The lambda sweep proper: one size, batch 32, no annealing, only lambda varies.
SWEEP_NAME = re.compile(r"^[sm]-wd[0-9.]+$")
DRIFT_RULES = ("grad_norm_drift", "grad_norm_trend", "weight_norm_drift")
WINDOW_FRAC = 0.05


@dataclass(frozen=True)
class RunDrift:
    """What one run measured and what the rules said."""

    name: str
    optimizer: str
    size: str
    weight_decay: float
    batch: int
    anneal: bool
    growth_l1: float
    growth_l2: float
    max_growth_l1: float
    growth_at_60: float
    x_change: float
    z_change: float
    final_eval: float
    best_eval: float
    fired: dict[str, float]  # rule -> first firing step / total_steps
    diverged_at: int | None = None  # first step with a non-finite training loss


def level_growth(
    steps: np.ndarray, values: np.ndarray, burn: int, total: int
) -> tuple[float, float, float]:
    """(growth at the end, largest growth at any step, growth at 60% of the run), as factors."""
    window = max(20, int(round(WINDOW_FRAC * total)))
    logs = np.log(np.where(values > 0, values, np.nan))
    ref_mask = (steps > burn) & (steps <= burn + window)
    ref = float(np.nanmedian(logs[ref_mask]))
    at = steps[steps >= burn + 2 * window]
    levels = rolling_median(steps, logs, window, at) - ref
    end = float(levels[-1])
    at60 = levels[at <= int(0.6 * total)]
    return (
        math.exp(end),
        math.exp(float(np.nanmax(levels))),
        math.exp(float(at60[-1]) if at60.size else math.nan),
    )


def _change(run: _corpus.CorpusRun, key: str, burn: int) -> float:
    if key not in run.series:  # AdamW runs have no z (and plain AdamW no x)
        return math.nan
    steps, values = run.series[key]
    window = max(20, int(round(WINDOW_FRAC * run.total_steps)))
    start = values[(steps > burn) & (steps <= burn + window)]
    end = values[steps > run.total_steps - window]
    return float(np.median(end) / np.median(start))


def measure(run: _corpus.CorpusRun) -> RunDrift:
    """Growth factors, loss and the rules' verdicts of one run."""
    cfg = RunConfig.read(run.config)
    burn = cfg.alert_burn_in()
    total = run.total_steps
    g1, g1_max, g1_60 = level_growth(*run.series[telemetry_key("grad_l1")], burn, total)
    g2, _, _ = level_growth(*run.series[telemetry_key("grad_l2")], burn, total)
    events = replay({k: Series.of(s, v) for k, (s, v) in run.series.items()}, run.config, chunk=50)
    fired: dict[str, float] = {}
    for ev in events:
        if ev.kind == "firing" and ev.rule not in fired:
            fired[ev.rule] = ev.step / total
    spec = run.meta["spec"]
    loss_steps, losses = run.series[TRAIN_LOSS_KEY]
    bad = np.flatnonzero(~np.isfinite(losses))
    _, evals = run.series[EVAL_LOSS_KEYS[0]]
    return RunDrift(
        name=run.name,
        optimizer=run.optimizer,
        size=f"d{spec['d_model']}x{spec['n_layers']}",
        weight_decay=float(spec["weight_decay"]),
        batch=int(spec["batch_size"]),
        anneal=bool(spec["anneal"]),
        growth_l1=g1,
        growth_l2=g2,
        max_growth_l1=g1_max,
        growth_at_60=g1_60,
        x_change=_change(run, telemetry_key("x_l2"), burn),
        z_change=_change(run, telemetry_key("z_l2"), burn),
        final_eval=float(evals[-1]),
        best_eval=float(np.nanmin(evals)),
        fired=fired,
        diverged_at=int(loss_steps[bad[0]]) if bad.size else None,
    )


def _fired_text(fired: dict[str, float]) -> str:
    return ", ".join(f"{r} @{100 * f:.0f}%" for r, f in fired.items()) or "-"


def _targets(rows: list[RunDrift]) -> list[str]:
    """The trend rule's two targets, each with its worst case (the headroom)."""
    params = RULES["grad_norm_trend"].default_config().params
    rise, floor = params["rise_factor"], params["min_factor"]
    grew = [r for r in rows if r.growth_l1 >= 4]
    quiet = [r for r in rows if r.max_growth_l1 <= 2]
    caught = [r for r in grew if r.fired.get("grad_norm_trend", 2.0) < 0.6]
    false = [r for r in quiet if any(k in r.fired for k in DRIFT_RULES)]
    by_rule = {rule: [r.name for r in quiet if rule in r.fired] for rule in DRIFT_RULES}
    lines = [
        f"- Runs whose ‖g‖₁ grew >= 4x after the burn-in: {len(grew)}; warned by "
        f"`grad_norm_trend` (rise_factor {rise:g}) before 60% of the run: {len(caught)}"
        + (
            f" (latest at {100 * max(r.fired['grad_norm_trend'] for r in caught):.0f}%; the "
            f"smallest growth at 60% among them is x{min(r.growth_at_60 for r in grew):.2f})"
            if caught
            else ""
        )
        + ".",
        f"- Runs that stayed within 2x (largest growth at any step): {len(quiet)}; with any "
        f"drift-rule alert: {len(false)}"
        + (f" ({', '.join(r.name for r in false)})" if false else "")
        + (
            f"; the largest growth among them is x{max(r.max_growth_l1 for r in quiet):.2f} "
            f"against min_factor {floor:g} (below it the rule cannot fire)"
            if quiet
            else ""
        )
        + ".",
        "  Per rule, runs within x2 it fired on: "
        + "; ".join(
            f"`{rule}` {len(names)}" + (f" ({', '.join(names)})" if names else "")
            for rule, names in by_rule.items()
        )
        + ".",
    ]
    return lines


def _relation(rows: list[RunDrift]) -> list[str]:
    """Spearman rank correlations per model size of the lambda sweep runs."""
    out = []
    for size in sorted({r.size for r in rows}):
        sweep = [r for r in rows if r.size == size and SWEEP_NAME.match(r.name)]
        if len(sweep) < 4:
            continue
        wd = [r.weight_decay for r in sweep]
        growths, finals = [r.growth_l1 for r in sweep], [r.final_eval for r in sweep]
        lambdas = ", ".join(f"{v:g}" for v in sorted(wd))
        out.append(
            f"- {size}, batch 32, lambda {lambdas}: rank correlation of lambda with ‖g‖₁ "
            f"growth {_spearman(wd, [r.growth_l1 for r in sweep]):+.2f}, with the final eval "
            f"loss {_spearman(wd, [r.final_eval for r in sweep]):+.2f}; of the growth with the "
            f"final eval loss {_spearman(growths, finals):+.2f}."
        )
    return out


def _spearman(a: list[float], b: list[float]) -> float:
    """Rank correlation; a NaN (a run that diverged) ranks last, as the worst value."""
    ra = np.argsort(np.argsort(np.nan_to_num(a, nan=np.inf))).astype(float)
    rb = np.argsort(np.argsort(np.nan_to_num(b, nan=np.inf))).astype(float)
    return float(np.corrcoef(ra, rb)[0, 1])


def report(rows: list[RunDrift]) -> tuple[str, str, str]:
    """The section's body (the lambda sweep's runs), its one-line result, and the table of
    every run of the corpus (printed, not written)."""
    sweep = [r for r in rows if SWEEP_NAME.match(r.name)]
    return _body(rows, _table(sweep)), _result(rows), _table(rows)


def _table(rows: list[RunDrift]) -> str:
    return markdown_table(
        [
            "run",
            "optimizer",
            "size",
            "batch",
            "anneal",
            "lambda",
            "‖g‖₁ growth",
            "max",
            "at 60%",
            "‖g‖₂ growth",
            "‖x‖ change",
            "‖z‖ change",
            "final eval",
            "best eval",
            "rules fired (first, % of run)",
        ],
        [
            [
                r.name,
                r.optimizer,
                r.size,
                r.batch,
                "yes" if r.anneal else "no",
                f"{r.weight_decay:g}",
                f"x{r.growth_l1:.2f}",
                f"x{r.max_growth_l1:.2f}",
                f"x{r.growth_at_60:.2f}",
                f"x{r.growth_l2:.2f}",
                f"x{r.x_change:.2f}",
                f"x{r.z_change:.2f}",
                f"NaN from step {r.diverged_at}" if r.diverged_at else f"{r.final_eval:.3f}",
                f"{r.best_eval:.3f}",
                _fired_text(r.fired),
            ]
            for r in rows
        ],
    )


def _body(rows: list[RunDrift], sweep_table: str) -> str:
    return "\n".join(
        [
            "Every run of the corpus (`bench/data/sfplus_corpus`), from the end of the alert "
            "burn-in to the end of the run (medians over 5% windows, log space), and replayed "
            "through the alert rules as the worker would see it streamed. The table: the lambda "
            "sweep's runs (the bench prints every run's row).",
            "",
            sweep_table,
            "",
            "What drives it:",
            *_relation(rows),
            "",
            "The trend rule's targets:",
            *_targets(rows),
        ]
    )


def _result(rows: list[RunDrift]) -> str:
    median_growth = statistics.median(r.growth_l1 for r in rows if r.optimizer == "sfplus")
    grew = [r for r in rows if r.growth_l1 >= 4]
    caught = [r for r in grew if r.fired.get("grad_norm_trend", 2.0) < 0.6]
    quiet = [r for r in rows if r.max_growth_l1 <= 2]
    false = [r for r in quiet if any(k in r.fired for k in DRIFT_RULES)]
    result = (f"median ‖g‖₁ growth x{median_growth:.2f} over the ScheduleFree+ runs; "
              f"`grad_norm_trend` warned {len(caught)} of the {len(grew)} runs that grew ≥ 4x "
              f"before 60% of the run; drift rules fired on {len(false)} of the {len(quiet)} "
              "that stayed within 2x")
    return result


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__).parse_args(argv)
    names = _corpus.names()
    rows = []
    for i, name in enumerate(names, 1):
        print(f"[drift] {i}/{len(names)} {name}", flush=True)
        rows.append(measure(_corpus.load(name)))
    body, result, every_run = report(rows)
    return publish(args, "drift", "Gradient-norm drift on the lambda sweep (ScheduleFree+)",
                   body, result, details=every_run)
