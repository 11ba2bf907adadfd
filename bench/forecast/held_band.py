"""The forecast band past the last fitted step, its ends held, against the band as calibrated.

Held: each end at its lowest so far; calibrated: step by step (the code before); on the public
anytime curves and our runs.

``Fit.predict`` answers past the last fitted step with the calibrated band (the fitted curve
plus the calibration's multipliers times a scale). The multipliers are measured per
extrapolation ratio and are noisy from one ratio to the next, and the scale grows with the
horizon, so the band's ends could rise with the horizon while the curve falls: a later
step's forecast ruled out a loss a nearer one allowed. The product now holds each end at its
lowest since the last fitted step (``Fit.predict_many``).

Three candidates, all from the same fits in this run:

* ``raw``: the calibrated band at each step (the code before; ``Fit._raw_band_many``);
* ``held low end``: only the low end held (it can only widen the band);
* ``held ends`` (shipped): both ends held.

Fits: the fitted curve's forecasts only (the ``too_early`` and ``no_asymptote`` answers extend
the current loss instead and are not changed). Public anytime curves: the backtest protocol
(``forecast_calibrate``: fit from 5% to k = 10/20/30/50% of the run, horizons at the
calibration's ratios and the last point). Our runs (``bench/data``, ScheduleFree+ and the other
anytime runs): the eval loss up to 20/30/50% of the run with its config, every later eval point
a horizon. The calibration table is the shipped one, fitted on the public curves (so in-sample
for them, out-of-sample for our runs); holding the ends fits nothing, so the three candidates
share that caveat.

Usage: ``python -m bench run held_band [--no-write]``
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from bench._cli import parser, publish
from bench._corpus import load_runs
from bench._report import markdown_table, progress
from bench.forecast.forecast_calibrate import fit_prefix, horizon_indices, load_corpus
from curvecast.service.forecast import Fit
from curvecast.service.forecast.solver import fit_curve

CONFIDENCE = 0.9
PUBLIC_CUTS = (0.1, 0.2, 0.3, 0.5)
RUN_CUTS = (0.2, 0.3, 0.5)
CANDIDATES = ("raw", "held low end", "held ends (shipped)")


@dataclass
class Horizons:
    """One fit's forecasts at its horizons: the truth, whether each is the run's last point,
    and each candidate's ``(lo, hi)``."""

    truth: np.ndarray
    final: np.ndarray
    bands: dict[str, tuple[np.ndarray, np.ndarray]]


def score_fit(fit: Fit, horizons: np.ndarray, truth: np.ndarray, final: np.ndarray
              ) -> Horizons | None:
    """The three candidates' bands of one fit at ``horizons`` (None: not a curve forecast)."""
    if not fit.has_forecast or not fit._holds_band or horizons.size == 0:
        return None
    _, raw_lo, raw_hi = fit._raw_band_many(horizons, CONFIDENCE)
    _, lo, hi = fit.predict_many(horizons, CONFIDENCE)
    return Horizons(truth, final, {"raw": (raw_lo, raw_hi), "held low end": (lo, raw_hi),
                                   "held ends (shipped)": (lo, hi)})


def public_fits() -> Iterator[Horizons]:
    curves = [c for c in load_corpus() if c.anytime]
    for i, curve in enumerate(curves):
        if i % 50 == 0:
            progress("held_band", f"public curves {i}/{len(curves)}")
        for k in PUBLIC_CUTS:
            fit = fit_prefix(curve, k)
            if fit.fitted_upto_step is None:
                continue
            t0, tk = fit.fitted_from_step or 0.0, fit.fitted_upto_step
            idx = [(j, f) for j, f in horizon_indices(curve.steps, t0, tk) if curve.steps[j] > tk]
            if not idx:
                continue
            js = np.array([j for j, _ in idx])
            scored = score_fit(fit, curve.steps[js], curve.losses[js],
                               np.array([f for _, f in idx]))
            if scored is not None:
                yield scored


def run_fits() -> Iterator[Horizons]:
    runs = [r for r in load_runs() if r.anytime]
    progress("held_band", f"our runs ({len(runs)})")
    for run in runs:
        for k in RUN_CUTS:
            et, ev, _, _ = run.upto(k)
            fit = fit_curve(et, ev, config=run.config)
            later = run.eval_steps > (fit.fitted_upto_step or np.inf)
            final = np.zeros(int(later.sum()), dtype=bool)
            if final.size:
                final[-1] = True
            scored = score_fit(fit, run.eval_steps[later], run.eval_values[later], final)
            if scored is not None:
                yield scored


def summarise(label: str, fits: list[Horizons]) -> list[list[object]]:
    """Rows: coverage at the last point and at the others, median half-width, share changed."""
    truth = np.concatenate([f.truth for f in fits])
    final = np.concatenate([f.final for f in fits])
    rows: list[list[object]] = []
    raw_lo = np.concatenate([f.bands["raw"][0] for f in fits])
    raw_hi = np.concatenate([f.bands["raw"][1] for f in fits])
    for name in CANDIDATES:
        lo = np.concatenate([f.bands[name][0] for f in fits])
        hi = np.concatenate([f.bands[name][1] for f in fits])
        ok = np.isfinite(lo) & np.isfinite(hi)
        inside = (truth >= lo) & (truth <= hi)
        width = (hi - lo) / 2 / np.abs(truth) * 100
        changed = (lo < raw_lo) | (hi < raw_hi)
        cells = [f"{inside[ok & m].mean():.1%} ({int((ok & m).sum())})" for m in (final, ~final)]
        rows.append([label, name, *cells,
                     f"±{np.median(width[ok & final]):.2f}%", f"±{np.median(width[ok]):.2f}%",
                     f"{changed[ok].mean():.1%}"])
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__).parse_args(argv)
    public = list(public_fits())
    ours = list(run_fits())
    rows = summarise("public anytime curves", public) + summarise("our anytime runs", ours)
    table = markdown_table(
        ["fits", "band", "90% coverage, last point (n)", "other horizons (n)",
         "median half-width, last point", "all horizons", "horizons changed"], rows)
    body = (
        "Past the last fitted step `Fit.predict` answers with the calibrated band, whose "
        "multipliers are noisy from one extrapolation ratio to the next: its ends could rise "
        "while the curve falls. Candidates, from the same fits: `raw` (the calibrated band at "
        "each step), `held low end`, `held ends` (shipped: each end at its lowest since the "
        "last fitted step). Fitted-curve forecasts only (`too_early` and `no_asymptote` "
        "answers are not changed). Public anytime curves: fit from 5% to 10/20/30/50% of the "
        "run, horizons at the calibration's ratios and the last point; our runs: the eval loss "
        "up to 20/30/50% with its config, every later eval point a horizon. The calibration is "
        "the shipped one (in-sample for the public curves).\n\n" + table)
    shipped = [r for r in rows if str(r[1]).startswith("held ends")]
    raw = [r for r in rows if r[1] == "raw"]
    result = ("holding the band's ends keeps the 90% coverage at the last point ("
              + ", ".join(f"{s[2].split()[0]} against {r[2].split()[0]}"
                          for s, r in zip(shipped, raw, strict=True))
              + ") with a narrower band (" + ", ".join(f"{s[4]} against {r[4]}"
                                                       for s, r in zip(shipped, raw, strict=True))
              + ")")
    return publish(args, "held_band", "The forecast band past the data, held", body, result)
