"""``off_model`` from the loss alone: the shipped detector beside candidates, on the public curves.

The goal: ``off_model`` on at least 90% of decaying runs by half of their decay, and on at most
5% of anytime curves, from the loss. The shipped detector (``fit_curve``'s: the recent 30% of
the fitted range against a fit on the data before it) flags about 40% of the cosine/WSD curves by
then. This bench scores, in one run and on the same windows, that detector and a candidate that
needs no fit at all:

* **concavity of the recent third**: ``a / sqrt(t + b) + c`` with ``a > 0`` is convex for every
  ``b``, so a loss curve whose recent third bends down (a quadratic's curvature significantly
  below 0, ``z`` = curvature over its standard error, the error widened for autocorrelated
  residuals by the lag-1 correlation) has left the model, whatever the fit says. An LR decay
  speeds the loss's fall up; the question is whether it does so early enough.
* **either**: the shipped detector or concavity below -3 (does the candidate add what the
  shipped one misses?).
* **shrinking noise**: the iterates' noise scales with the learning rate, so a decay should
  quieten the loss: the robust scale (MAD) of the loss's second differences in the recent third
  over that of the part before, flagged below the 5th percentile of the anytime windows' ratios
  (a threshold chosen on the very windows it is scored on: an upper bound on the candidate).
* **an annealing term, given the planned length**: the product often knows the run's planned
  ``total_steps`` (here: the curve's last step), and an LR decay lowers the loss in proportion
  to how far the rate has fallen (the annealing term of Tissue et al., 2024, "Scaling law with
  learning rate annealing"). Fit ``a / sqrt(t + b) + c + d * (1 - eta(t))`` with ``d >= 0``
  (the loss below the model by the schedule's shape) for the hypotheses "cosine from the first
  point to ``total_steps``" and "linear decay to ``total_steps`` from 0/10/.../90% of the way
  there", and score the best drop of the sum of squares over the noise variance (robust scale
  of the second differences, times the number of points). Flagged above the 95th percentile of
  the anytime windows' scores (chosen on the scored windows: an upper bound).

Windows: anytime curves (constant LR, schedule-free; diverged runs left out) fitted on
``[5%, k]`` of the run for k = 20/30/50/100%; decaying curves on ``[5% of the run, 50% of the
decay phase]`` (``forecast_backtest.decay_window``), and for the shipped detector also to
60/75/90/100% of it: whether waiting longer would reach the goal's 90%. The rows "validation
curves" and "training curves" split the same windows by series: most decaying curves are
schaipp's runs, each as a validation curve and as a training curve of single-minibatch losses,
far noisier; a run that evaluates is forecast on its validation loss by default.

Usage: ``python -m bench run off_model_loss_only [--no-write]``
"""

from __future__ import annotations

import math
import re
from collections import defaultdict

import numpy as np

from bench._cli import parser, publish
from bench._report import markdown_table
from bench.forecast.forecast_backtest import decay_prefix, decay_window, diverged
from bench.forecast.forecast_calibrate import Curve, load_corpus, prefix
from curvecast.service.forecast.solver import fit_curve

#: Anytime cuts (fractions of the run) at which false alarms are counted.
ANYTIME_CUTS = (0.2, 0.3, 0.5, 1.0)
#: Where in the decay phase the decaying curves are cut: the detection goal is at 50%; the
#: later cuts show how late the shipped detector gets there.
DECAY_FRACTIONS = (0.5, 0.6, 0.75, 0.9, 1.0)
#: Concavity thresholds tried (z below it flags).
THRESHOLDS = (-2.0, -3.0)
#: A sticky ``off_model`` (a decay, once begun, does not end, so a run flagged once would stay
#: flagged): the refits where it is asked, in fractions of the decay phase (decaying curves)
#: and of the run (anytime curves: each refit of the run is one more chance of a false alarm
#: that would then stick).
STICKY_DECAY_FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5)
STICKY_ANYTIME_CUTS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def series_kind(name: str) -> str:
    """``"validation"`` for a curve of held-out loss (``...:val``, ``...:validation/loss``),
    ``"training"`` otherwise: schaipp's training curves are single-minibatch losses, far noisier
    than the validation curves of the same runs, which is what a decay has to show through."""
    return "validation" if re.search(r":(val|validation)(/|$)", name) else "training"


def run_of(name: str) -> str:
    """The run a curve belongs to: its name without the ``:train`` / ``:val`` suffix."""
    return re.sub(r":(train|val|validation)(/.*)?$", "", name)


def decay_family(c: Curve) -> str:
    """The row of a decaying curve: its source and schedule (``"schaipp cosine"``, ``"mpl
    wsdcon"``; finer than ``bench.forecast_backtest``'s, which joins mpl's WSD variants)."""
    return f"{c.source} {c.schedule.split('(')[0].replace('decay:', '')}"


def concavity_z(t: np.ndarray, y: np.ndarray, frac: float = 1 / 3) -> float | None:
    """Curvature of a quadratic fitted to the recent ``frac`` of the step range, in standard
    errors (negative: the curve bends down, which ``a / sqrt(t + b) + c`` never does)."""
    recent = t >= t[-1] - frac * (t[-1] - t[0])
    if int(recent.sum()) < 8:
        return None
    s = (t[recent] - t[recent][0]) / (t[recent][-1] - t[recent][0])
    v = y[recent]
    x = np.vstack([np.ones_like(s), s, s * s]).T
    coef, *_ = np.linalg.lstsq(x, v, rcond=None)
    resid = v - x @ coef
    r1 = float(np.corrcoef(resid[:-1], resid[1:])[0, 1]) if resid.size > 3 else 0.0
    r1 = max(0.0, r1) if math.isfinite(r1) else 0.0
    n = resid.size
    n_eff = max(3.0, n * (1 - r1) / (1 + r1))
    sigma2 = float(resid @ resid) / (n - 3)
    var = float(np.linalg.inv(x.T @ x)[2, 2]) * sigma2 * n / n_eff
    return float(coef[2]) / math.sqrt(var) if var > 0 else None


def mad(v: np.ndarray) -> float:
    """Median absolute deviation (unscaled)."""
    return float(np.median(np.abs(v - np.median(v))))


def noise_ratio(t: np.ndarray, y: np.ndarray) -> float | None:
    """Robust scale of the second differences in the recent third over the part before (a
    decaying learning rate should make it fall below 1)."""
    d = y[2:] - 2 * y[1:-1] + y[:-2]
    if d.size < 30:
        return None
    tt = t[1:-1]
    recent = tt >= tt[0] + 2 / 3 * (tt[-1] - tt[0])
    before, after = d[~recent], d[recent]
    if before.size < 10 or after.size < 10:
        return None
    return mad(after) / mad(before) if mad(before) > 0 else None


#: Starts of the linear-decay hypotheses, as fractions of the way from the window's first step to
#: the planned length.
LINEAR_STARTS = tuple(i / 10 for i in range(10))
#: ``b`` of ``a / sqrt(t + b) + c`` in the hypothesis fits: ``t + b`` starts at these fractions
#: of the window's step range.
B_GRID = np.geomspace(1e-3, 1e2, 32)


def annealing_gain(t: np.ndarray, y: np.ndarray, planned: float) -> float | None:
    """How much better ``a / sqrt(t + b) + c + d (1 - eta(t))``, ``d >= 0``, fits than the
    model alone, for the best of the LR-decay hypotheses ``eta`` ending at ``planned``: the drop
    of the sum of squares over the noise variance times the number of points (about a
    chi-square with one degree of freedom per hypothesis for white noise)."""
    if t.size > 200:  # bin medians: bounded cost, and noise that is closer to white
        parts = np.array_split(np.arange(t.size), 200)
        t = np.array([np.median(t[i]) for i in parts])
        y = np.array([np.median(y[i]) for i in parts])
    noise2 = (1.4826 * mad(np.diff(y, 2))) ** 2 / 6
    if t.size < 20 or noise2 <= 0 or planned < t[-1] or planned <= t[0]:
        return None
    span = planned - t[0]
    hypotheses = [0.5 * (1 - np.cos(np.pi * (t - t[0]) / span))]  # cosine: 1 - eta
    for frac in LINEAR_STARTS:
        start = t[0] + frac * span
        if start < t[-1] - 0.02 * span:
            hypotheses.append(np.clip((t - start) / (planned - start), 0.0, 1.0))
    decay = np.stack(hypotheses)  # (hypotheses, points)
    best0 = np.inf
    best1 = np.full(len(hypotheses), np.inf)
    for r in B_GRID:
        x = 1 / np.sqrt(t - t[0] + r * (t[-1] - t[0]))
        base = np.stack([np.ones_like(x), x], 1)
        coef, *_ = np.linalg.lstsq(base, y, rcond=None)
        if coef[1] <= 0:
            continue
        sse0 = float(np.sum((base @ coef - y) ** 2))
        best0 = min(best0, sse0)
        for h, extra in enumerate(decay):
            m = np.column_stack([base, extra])
            c3, *_ = np.linalg.lstsq(m, y, rcond=None)
            # d < 0 (the loss above the model's shape) or a <= 0: the model alone at this b
            sse1 = float(np.sum((m @ c3 - y) ** 2)) if c3[1] > 0 and c3[2] >= 0 else sse0
            best1[h] = min(best1[h], sse1)
    if not np.isfinite(best0):
        return None
    return float(np.max(best0 - best1)) / (noise2 * t.size)


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__).parse_args(argv)
    curves = [c for c in load_corpus() if not c.name.startswith("train_quality/")]
    # (group, detector) -> flags; group "anytime k" or the decaying family at 50% of its decay
    flags: dict[tuple[str, str], list[bool]] = defaultdict(list)
    ratios: dict[str, list[float | None]] = defaultdict(list)  # group -> noise ratio per window
    gains: dict[str, list[float | None]] = defaultdict(list)  # group -> annealing_gain per window
    later: dict[tuple[str, float], list[bool]] = defaultdict(list)  # the shipped one, later cuts

    # (anytime or decaying, run, cut) -> series kind -> the shipped detector's flag: a run with
    # both a validation and a training curve, flagged when either is (the union candidate)
    by_run: dict[tuple[str, str, float], dict[str, bool]] = defaultdict(dict)

    # The shipped detector's flag for each window of the current curve: the tables ask for
    # several windows more than once (a cut in two tables), and each is fitted once.
    fitted: dict[tuple[int, float, float], bool] = {}

    def shipped(t: np.ndarray, y: np.ndarray) -> bool:
        key = (t.size, float(t[0]), float(t[-1]))
        if key not in fitted:
            fitted[key] = bool(fit_curve(t, y).off_model)
        return fitted[key]

    def score(groups: tuple[str, ...], t: np.ndarray, y: np.ndarray, planned: float) -> bool:
        """Every detector on one window, counted in each of ``groups``."""
        z = concavity_z(t, y)
        off = shipped(t, y)
        ratio = noise_ratio(t, y)
        gain = annealing_gain(t, y, planned)
        for group in groups:
            flags[group, "shipped"].append(off)
            for thr in THRESHOLDS:
                flags[group, f"concave {thr:g}"].append(z is not None and z < thr)
            flags[group, "either"].append(off or (z is not None and z < -3.0))
            ratios[group].append(ratio)
            gains[group].append(gain)
        return off

    # group -> (flagged at the last refit, flagged at any refit) per curve: the sticky candidate
    sticky: dict[str, list[tuple[bool, bool]]] = defaultdict(list)

    def ever(groups: tuple[str, ...], windows: list[tuple[np.ndarray, np.ndarray]]) -> None:
        offs = [shipped(t, y) for t, y in windows if t.size >= 20]
        if offs:
            for group in groups:
                sticky[group].append((offs[-1], any(offs)))

    for c in curves:
        fitted.clear()
        kind = series_kind(c.name)
        if c.anytime:
            if diverged(c):
                continue
            ever(("anytime", f"anytime: {kind} curves"),
                 [prefix(c, k) for k in STICKY_ANYTIME_CUTS])
            for k in ANYTIME_CUTS:
                t, y = prefix(c, k)
                if t.size >= 20:
                    by_run["anytime", run_of(c.name), k][kind] = score(
                        (f"anytime {k:.0%}", f"anytime, all cuts: {kind} curves"), t, y,
                        float(c.steps[-1]))
            continue
        window = decay_window(c)
        if window is None:
            continue
        family = decay_family(c)
        ever(("all decaying", f"all decaying: {kind} curves"),
             [decay_prefix(c, window, frac) for frac in STICKY_DECAY_FRACTIONS])
        for frac in DECAY_FRACTIONS:
            t, y = decay_prefix(c, window, frac)
            if t.size < 20:
                continue
            decaying = (family, "all decaying", f"all decaying: {kind} curves")
            if frac == 0.5:
                by_run["decaying", run_of(c.name), frac][kind] = score(
                    decaying, t, y, float(c.steps[-1]))
            else:  # how late the shipped detector gets there: itself only
                off = shipped(t, y)
                for group in decaying:
                    later[group, frac].append(off)
    anytime_ratios = [r for g, rs in ratios.items() if g.startswith("anytime ") for r in rs
                      if r is not None]
    quiet = float(np.percentile(anytime_ratios, 5))
    for group, rs in ratios.items():
        flags[group, "noise"] = [r is not None and r < quiet for r in rs]
    anytime_gains = [g for k, gs in gains.items() if k.startswith("anytime ") for g in gs
                     if g is not None]
    loud = float(np.percentile(anytime_gains, 95))
    for group, gs in gains.items():
        flags[group, "annealing"] = [g is not None and g > loud for g in gs]
    decaying_gains = [g for g in gains["all decaying"] if g is not None]
    detectors = ["shipped", *(f"concave {thr:g}" for thr in THRESHOLDS), "either", "noise",
                 "annealing"]
    groups = sorted({g for g, _ in flags}, key=lambda g: (not g.startswith("anytime"),
                                                          not g.startswith("all decaying"), g))
    rows = [[g, len(flags[g, "shipped"]),
             *(f"{np.mean(flags[g, d]):.0%}" for d in detectors)] for g in groups]
    table = markdown_table(["windows (n)", "n", "shipped detector",
                            *(f"concavity z < {thr:g}" for thr in THRESHOLDS),
                            "shipped or concavity z < -3",
                            f"noise ratio < {quiet:.2f}",
                            f"annealing term > {loud:.3g}"], rows)
    families = sorted({f for f, _ in later}, key=lambda f: (not f.startswith("all decaying"), f))
    late_rows = [
        [f, *(f"{np.mean(flags[f, 'shipped']):.0%}" if frac == 0.5 else
              (f"{np.mean(later[f, frac]):.0%}" if later[f, frac] else "–")
              for frac in DECAY_FRACTIONS)]
        for f in families
    ]
    late_table = markdown_table(["decaying curves", *(f"{frac:.0%} of the decay"
                                                      for frac in DECAY_FRACTIONS)], late_rows)
    def percents(fractions: tuple[float, ...]) -> str:
        return "/".join(f"{f * 100:.0f}" for f in fractions) + "%"

    sticky_rows = [[g, len(v), f"{np.mean([last for last, _ in v]):.0%}",
                    f"{np.mean([any_ for _, any_ in v]):.0%}"]
                   for g, v in sorted(sticky.items(), key=lambda kv: (kv[0] != "anytime",
                                                                      kv[0].startswith("all"),
                                                                      kv[0]))]
    sticky_table = markdown_table(["curves", "n", "flagged at the last refit",
                                   "flagged at any refit (sticky)"], sticky_rows)
    union_rows = []
    for what in ("anytime", "decaying"):
        both = [f for (w, _, _), f in by_run.items() if w == what and len(f) == 2]
        union_rows.append([
            f"{what} ({'20/30/50/100% of the run' if what == 'anytime' else 'half the decay'})",
            len(both), *(f"{np.mean([f[kind] for f in both]):.0%}"
                         for kind in ("validation", "training")),
            f"{np.mean([f['validation'] or f['training'] for f in both]):.0%}"])
    union_table = markdown_table(["runs with both curves, cut at", "n", "validation curve",
                                  "training curve", "either (union)"], union_rows)
    quiet_gain = float(np.percentile(decaying_gains, 90))
    body = f"""The shipped detector (`fit_curve`'s: the recent 30% of the fitted range against a
fit on the data before it) beside candidates that need no fit, on the same windows: the recent
third's **concavity** (`z`, a quadratic's curvature over its standard error: the model is convex,
a decay bends the loss down); **either** (shipped, or concavity below -3); **shrinking noise**
(the robust scale of second differences, recent third over before: a decay quietens the loss);
an **annealing term** given the planned length (`a / sqrt(t + b) + c + d (1 - eta(t))`, cosine
or linear decays, the best drop of the sum of squares over the noise). The last two are
thresholded at the anytime windows' 5th / 95th percentile, chosen on the scored windows (an upper
bound). Windows: anytime curves (diverged runs left out) fitted on [5%, k] of the run; decaying
curves on [5% of the run, 50% of the decay] (the module docstring has the details). Share of
windows flagged (anytime rows: false alarms, goal ≤ 5%; decaying rows: goal ≥ 90%):

{table}

The annealing term's score is {np.median(decaying_gains):.2g} at the median decaying window
(above {quiet_gain:.2g} in a tenth): by half of its decay a curve does not sit below the model by
its schedule's shape."""
    details = f"""The shipped detector cut later in the decay (from 5% of the run; 100%: the whole
run):

{late_table}

Flagging a curve for good once flagged (sticky: asked at {percents(STICKY_DECAY_FRACTIONS)} of the
decay, {percents(STICKY_ANYTIME_CUTS)} of the run), and a run when either of its series is:

{sticky_table}

{union_table}"""
    half = {g: float(np.mean(flags[g, "shipped"])) for g in ("all decaying", "anytime 100%")}
    best = max(float(np.mean(flags["all decaying", d])) for d in detectors)
    result = (f"the shipped detector flags {half['all decaying']:.0%} of the decaying curves at "
              f"half their decay (goal ≥ 90%) with {half['anytime 100%']:.0%} false alarms; no "
              f"candidate does better (best {best:.0%})")
    return publish(args, "off_model_loss_only", "off_model from the loss alone: candidates",
                   body, result, details=details)
