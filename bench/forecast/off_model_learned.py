"""``off_model`` from the loss alone, learned: a classifier over shape statistics, cross-validated.

The goal: ``off_model`` on at least 90% of decaying runs by half of their decay and on at most
5% of anytime curves, from the loss. ``off_model_loss_only`` scored single statistics (the
shipped detector, the recent third's concavity, shrinking noise, an annealing term); each fell
far short alone. This bench asks whether they do together: a logistic regression over the
statistics of one window, its weights and its threshold fitted on other runs only.

Features of a window (all from the loss; none needs the planned length or the schedule):

* the shipped detector's two numbers, not its verdict: ``off_model_score`` (the recent 30%'s
  departure from a fit on the data before it, in standard errors) and ``off_model_excess`` (the
  same as a share of the decay that fit predicted);
* the recent third's concavity ``z`` (``off_model_loss_only.concavity_z``);
* the log of the noise ratio (second differences' robust scale, recent third over before);
* the pace: ``-d log(loss) / d log(step)`` over the recent third against the middle third (an
  LR decay speeds the fall up when ``a / sqrt(t + b) + c`` has it slow down);
* the fit's shape: ``log((t0 + b) / span)`` and ``c`` over the current level.

Protocol: the windows are ``off_model_loss_only``'s (anytime curves cut at 20/30/50/100%
of the run, diverged runs left out; decaying curves from 5% of the run to 50% of the decay, the
positives of training also at 30% and 40% of it). Two cross-validations, each scoring every
window with weights and a threshold that never saw its run:

* **by run** (the project's five folds, ``forecast_calibrate.fold_of``: a run's
  validation and training curves, a study's trials, an mpl model size stay together);
* **by source** (leave one corpus out: weights learned on the other sources' curves), the
  harder question of a user whose runs look like none of ours.

The threshold is the 95th percentile of the training folds' anytime scores, so the expected
false-alarm rate is 5% when the held-out curves look like the training ones.

Usage: ``python -m bench run off_model_learned [--no-write]``
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
from scipy.optimize import minimize

from bench._cli import parser, publish
from bench._report import markdown_table
from bench.forecast.forecast_backtest import decay_prefix, decay_window, diverged
from bench.forecast.forecast_calibrate import Curve, fold_of, load_corpus, prefix
from bench.forecast.off_model_loss_only import (
    ANYTIME_CUTS,
    concavity_z,
    decay_family,
    noise_ratio,
    run_of,
    series_kind,
)
from curvecast.service.forecast.solver import fit_curve

#: Fractions of the decay phase whose windows train the classifier (it is scored at 0.5 only).
TRAIN_DECAY_FRACTIONS = (0.3, 0.4, 0.5)
#: Feature names, in the order of :func:`features`.
FEATURES = ("off_model_score", "off_model_excess", "concavity", "log noise ratio",
            "pace recent / middle", "log((t0 + b) / span)", "c / level")
#: Ridge penalty of the logistic regression (standardised features).
L2 = 1.0


@dataclass(frozen=True)
class Window:
    """One scored window of one curve."""

    curve: str
    source: str
    fold: int
    kind: str  # "validation" or "training"
    group: str  # "anytime 20%", ..., or the decaying family
    decay_fraction: float | None  # where in the decay it ends (decaying windows)
    label: int  # 1: a decaying curve inside its decay phase
    x: np.ndarray
    shipped: bool


def pace(t: np.ndarray, y: np.ndarray, lo: float, hi: float) -> float | None:
    """``-d log(loss) / d log(step)`` over the fraction ``[lo, hi]`` of the step range (a line
    fitted to log loss against log step)."""
    span = t[-1] - t[0]
    m = (t >= t[0] + lo * span) & (t <= t[0] + hi * span) & (y > 0)
    if int(m.sum()) < 5:
        return None
    slope = np.polyfit(np.log(t[m]), np.log(y[m]), 1)[0]
    return float(-slope)


def features(t: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, bool] | None:
    """The window's feature vector (:data:`FEATURES`) and the shipped detector's verdict."""
    fit = fit_curve(t, y)
    if fit.a is None or fit.c is None:
        return None
    z = concavity_z(t, y)
    ratio = noise_ratio(t, y)
    recent, middle = pace(t, y, 2 / 3, 1.0), pace(t, y, 1 / 3, 2 / 3)
    span = float(t[-1] - t[0])
    b_rel = (float(t[0]) + fit.b) / span if fit.b is not None else 1e3
    level = fit.level if fit.level else float(np.median(y[-max(3, y.size // 10):]))

    def clip(v: float | None, lim: float) -> float:
        return 0.0 if v is None or not math.isfinite(v) else float(np.clip(v, -lim, lim))

    x = np.array([
        clip(fit.off_model_score, 30.0),
        clip(fit.off_model_excess, 3.0),
        clip(z, 30.0),
        clip(math.log(ratio) if ratio else None, 3.0),
        clip(recent / middle if recent is not None and middle and middle > 0 else None, 10.0),
        clip(math.log(max(b_rel, 1e-6)), 15.0),
        clip(fit.c / level if level else None, 2.0),
    ])
    return x, bool(fit.off_model)


def windows(curves: list[Curve]) -> list[Window]:
    """Every window of the protocol, with its features."""
    out: list[Window] = []
    for c in curves:
        kind = series_kind(c.name)
        window_of = partial(Window, curve=c.name, source=c.source, fold=fold_of(c.family),
                            kind=kind)
        if c.anytime:
            if diverged(c):
                continue
            for k in ANYTIME_CUTS:
                t, y = prefix(c, k)
                f = features(t, y) if t.size >= 20 else None
                if f is not None:
                    out.append(window_of(group=f"anytime {k:.0%}", decay_fraction=None,
                                      label=0, x=f[0], shipped=f[1]))
            continue
        window = decay_window(c)
        if window is None:
            continue
        for frac in TRAIN_DECAY_FRACTIONS:
            t, y = decay_prefix(c, window, frac)
            f = features(t, y) if t.size >= 20 else None
            if f is not None:
                out.append(window_of(group=decay_family(c), decay_fraction=frac, label=1,
                                  x=f[0], shipped=f[1]))
    return out


def fit_logistic(x: np.ndarray, y: np.ndarray, w: np.ndarray
                 ) -> tuple[Callable[[np.ndarray], np.ndarray], np.ndarray]:
    """A ridge logistic regression on standardised features: the scoring function (log-odds)
    and the weights (intercept first, then one per standardised feature).

    ``w`` weighs the samples (:func:`balanced`)."""
    mu, sd = x.mean(0), x.std(0) + 1e-9
    xs = np.column_stack([np.ones(len(x)), (x - mu) / sd])

    def loss(beta: np.ndarray) -> tuple[float, np.ndarray]:
        s = xs @ beta
        # log(1 + e^s) - y s, stable for large |s|
        nll = np.logaddexp(0.0, s) - y * s
        p = 1 / (1 + np.exp(-s))
        grad = xs.T @ (w * (p - y)) + L2 * np.r_[0.0, beta[1:]]
        return float(w @ nll) + 0.5 * L2 * float(beta[1:] @ beta[1:]), grad

    beta = minimize(loss, np.zeros(xs.shape[1]), jac=True, method="L-BFGS-B").x
    return lambda xn: np.column_stack([np.ones(len(xn)), (xn - mu) / sd]) @ beta, beta


def quadratic(x: np.ndarray) -> np.ndarray:
    """The features, their squares and their pairwise products (a curved boundary)."""
    i, j = np.triu_indices(x.shape[1])
    return np.column_stack([x, x[:, i] * x[:, j]])


#: The candidates: name -> the design matrix built from the windows' features.
CANDIDATES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "linear": lambda x: x,
    "linear, without the fit's shape": lambda x: x[:, :5],
    "quadratic": quadratic,
}


def balanced(y: np.ndarray) -> np.ndarray:
    """Sample weights (mean 1) under which the two classes count alike: the decaying windows
    (three cuts of each curve) outnumber the anytime ones about three to one."""
    w: np.ndarray = np.where(y == 1, 0.5 / y.sum(), 0.5 / (1 - y).sum()) * len(y)
    return w


def cross_validate(ws: list[Window], held_out: Callable[[Window], object],
                   design: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Each window's flag from weights and a threshold fitted without its group."""
    x = design(np.stack([w.x for w in ws]))
    y = np.array([w.label for w in ws], dtype=float)
    flags = np.zeros(len(ws), dtype=bool)
    keys = [held_out(w) for w in ws]
    for key in sorted(set(keys), key=str):
        test = np.array([k == key for k in keys])
        train = ~test
        if y[train].min() == y[train].max():
            raise SystemExit(f"holding out {key!r} leaves one class to learn from")
        score, _ = fit_logistic(x[train], y[train], balanced(y[train]))
        threshold = np.percentile(score(x[train][y[train] == 0]), 95)
        flags[test] = score(x[test]) > threshold
    return flags


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__).parse_args(argv)
    started = time.perf_counter()
    curves = [c for c in load_corpus() if not c.name.startswith("train_quality/")]
    ws = windows(curves)
    print(f"{len(ws)} windows from {len(curves)} curves in {time.perf_counter() - started:.0f} s")
    results = {(name, cv): cross_validate(ws, held_out, design)
               for name, design in CANDIDATES.items()
               for cv, held_out in (("run", lambda w: w.fold), ("source", lambda w: w.source))}
    # Scored: the anytime windows and the decaying ones at half of their decay.
    scored = [i for i, w in enumerate(ws) if w.label == 0 or w.decay_fraction == 0.5]
    rows_of: dict[str, list[int]] = defaultdict(list)
    for i in scored:
        w = ws[i]
        if w.label == 0:
            rows_of[w.group].append(i)
            rows_of[f"anytime, all cuts: {w.kind} curves"].append(i)
            rows_of[f"anytime, all cuts: {w.source}"].append(i)
        else:
            rows_of["all decaying"].append(i)
            rows_of[f"all decaying: {w.kind} curves"].append(i)
            rows_of[w.group].append(i)
    order = sorted(rows_of, key=lambda g: (not g.startswith("anytime"),
                                           not g.startswith("all decaying"), g))
    detectors: dict[str, np.ndarray] = {
        "shipped detector": np.array([w.shipped for w in ws]),
        **{f"{name}, CV by {cv}": flags for (name, cv), flags in results.items()}}

    def share(flags: np.ndarray, group: str) -> float:
        return float(np.mean(flags[rows_of[group]]))

    rows: list[list[object]] = [
        [g, len(rows_of[g]), *(f"{share(v, g):.0%}" for v in detectors.values())]
        for g in order]
    table = markdown_table(["windows", "n", *detectors], rows)
    # The verdict per detector: the two goals, read off the same windows, over every curve
    # and over runs (one curve each: the series the service forecasts by default, the
    # validation curve of a run that has one; a run whose validation curve is too short for
    # a window is not scored, rather than scored on the training curve it is not forecast on).
    with_validation = {run_of(c.name) for c in curves if series_kind(c.name) == "validation"}
    by_default = {i for i in scored if ws[i].kind == "validation"
                  or run_of(ws[i].curve) not in with_validation}
    # Per unit, the windows each number reads: the anytime ones by cut, all of them, and the
    # decaying ones (the same for every detector).
    units = []
    for keep in (scored, [i for i in scored if i in by_default]):
        anytime = [i for i in keep if ws[i].label == 0]
        by_cut: dict[str, list[int]] = defaultdict(list)
        for i in anytime:
            by_cut[ws[i].group].append(i)
        units.append((list(by_cut.values()), anytime, [i for i in keep if ws[i].label == 1]))
    verdicts: list[list[object]] = []
    for name, v in detectors.items():
        cells: list[object] = [name]
        met = True
        for cuts, anytime, decaying in units:
            worst = max(float(np.mean(v[cut])) for cut in cuts)
            caught = float(np.mean(v[decaying]))
            cells += [f"{worst:.0%}", f"{np.mean(v[anytime]):.0%}", f"{caught:.0%}"]
            met = met and worst <= 0.05 and caught >= 0.9
        verdicts.append([*cells, "yes" if met else "**no**"])
    verdict_table = markdown_table(
        ["detector", "curves: worst anytime cut", "curves: all anytime windows",
         "curves: decaying", "runs: worst anytime cut", "runs: all anytime windows",
         "runs: decaying", "both goals"], verdicts)
    # The weights fitted on every window, for the reader (standardised features).
    x = np.stack([w.x for w in ws])
    y = np.array([w.label for w in ws], dtype=float)
    _, beta = fit_logistic(x, y, balanced(y))
    weights: list[list[object]] = [[name, f"{b:+.2f}"]
                                   for name, b in zip(FEATURES, beta[1:], strict=True)]
    print("The weights fitted on every window (log-odds per standard deviation):\n"
          + markdown_table(["feature", "weight (per standard deviation)"], weights))
    body = f"""A logistic regression over the statistics of one window (the shipped detector's
score and excess, the recent third's concavity, the noise ratio, the pace of the fall, the fit's
shape: all from the loss), its weights and threshold (the training folds' anytime 95th
percentile) fitted on other runs only: cross-validated **by run** (the project's five folds)
and **by source** (leave one corpus out). Windows as in `off_model_loss_only`; the goals:
anytime false alarms ≤ 5% at each cut, decaying curves flagged at half their decay ≥ 90%, over
every curve and over runs (one curve each: the series the service forecasts by default):

{verdict_table}"""
    details = ("Share of windows flagged (anytime rows: false alarms; decaying rows at half the "
               f"decay):\n\n{table}")
    met = [row[0] for row in verdicts if row[-1] == "yes"]
    result = ("no detector meets both goals (≤ 5% false alarms, ≥ 90% of decays at half the "
              "decay)" if not met else f"both goals met by: {', '.join(map(str, met))}")
    return publish(args, "off_model_learned", "off_model from the loss alone, learned", body,
                   result, details=details)
