"""Fit the forecast's interval calibration on the curve corpus and write it into the package.

For every anytime curve (schedule ``constant`` or ``schedule-free``, plus the sfplus
training-quality curves in ``bench/data/train_quality`` when they exist) and every cut
``k`` in ``CAL_CUTS``, the curve is fitted on ``[5% T, k T]`` exactly as the backtest does, then
compared with the observed loss at later steps (extrapolation ratios 1.25 ... 20 and the last
step). Each comparison of the *last* loss of the run with its forecast gives the standardised
error ``z = (y - y_hat) / S`` for candidate factors ``(SE_FACTOR, DECAY_FACTOR)`` of the scale
``S``; the table of empirical quantiles of ``z`` per extrapolation-ratio bin is what
``service/forecast/calibration.py`` holds. Every candidate is calibrated in-sample by construction,
so the factors are chosen by the quality of the intervals: the lowest mean log interval score
(Gneiting & Raftery's proper score for central intervals: width plus ``2 / alpha`` times the miss
distance, relative to the loss). The table is fitted on the last-loss comparisons only -- the
question the product answers most ("where will this run end?"); coverage at intermediate horizons
is reported by the backtest, not tuned.

Fits whose status says the model cannot yet place the asymptote (``too_early``,
``no_asymptote``) answer differently: they extend the current loss, ``level * (t / t_last) **
-g`` (``calibration.transient_band``). Their comparisons are kept out of the table above and give
the *transient table* instead: quantiles of the exponent ``g`` the run then showed (for
``no_asymptote`` as a multiple of the decay rate the data showed at the cut). Those come from the
public curves and from our own runs (``bench._corpus.load_runs``: the ScheduleFree+ corpus, with
each run's config, as the service fits it) -- the only source of ``too_early`` fits, which need a
config that says when averaging starts.

Honest coverage needs held-out curves: :func:`cross_validated_coverage` refits both tables
without a fold of curve *families* (all studies, train/val twins and horizons of one workload or
model stay together; one of our runs is one family) and scores that fold;
the ``forecast_backtest`` and ``forecast_sfplus`` benches report it.

Usage: ``python -m bench run forecast_calibrate [--curves DIR] [--quick] [--no-write]``
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import sys
import textwrap
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from bench._cli import parser, writes
from bench._corpus import BenchRun, load_runs
from bench._paths import DATA, REPO
from curvecast.contract import ForecastStatus
from curvecast.service.forecast import calibration as cal
from curvecast.service.forecast.fit import Fit
from curvecast.service.forecast.solver import fit_curve

DEFAULT_CURVES = Path(os.environ.get("CURVECAST_CURVES_DIR", REPO.parent / "shared" / "curves"))
TRAIN_QUALITY_DIR = DATA / "train_quality"
CAL_MODULE = REPO / "service" / "forecast" / "calibration.py"

BURN_IN_FRACTION = 0.05  # protocol: drop the first 5% of the run's steps
CAL_CUTS = (0.08, 0.1, 0.125, 0.15, 0.175, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 0.7, 0.8)
HORIZON_RATIOS = (1.25, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0)
RATIO_EDGES = (1.0, 1.6, 2.5, 4.0, 7.0, 14.0, math.inf)
PROBS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 0.75, 0.85, 0.9, 0.95, 0.975, 0.99,
         0.995)
SE_FACTORS = (1.0, 2.0, 4.0, 8.0, 16.0)
GAMMAS = (0.0, 0.02, 0.05, 0.1, 0.15, 0.2)
N_FOLDS = 5


# --- corpus --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Curve:
    """One loss curve of the corpus."""

    name: str
    schedule: str
    steps: np.ndarray
    losses: np.ndarray

    @property
    def source(self) -> str:
        return self.name.split("/", 1)[0]

    @property
    def anytime(self) -> bool:
        """Curves the model is meant for (no LR decay)."""
        return self.schedule in ("constant", "schedule-free")

    @property
    def family(self) -> str:
        """Cross-validation group: curves that share a run or a workload stay together."""
        n = self.name
        if self.source == "train_quality":
            return re.sub(r"_(train|val)$", "", n)
        if self.source == "mpl":
            return "mpl/" + n.split("/", 1)[1].split("_", 1)[0]  # model size
        n = re.sub(r"_study_\d+_trial_\d+", "", n)
        n = re.sub(r":(train|val|validation)(/.*)?$", "", n)
        return n


def load_corpus(curves_dir: Path = DEFAULT_CURVES, train_quality: Path = TRAIN_QUALITY_DIR
                ) -> list[Curve]:
    """All corpus curves (sorted by step), plus the training-quality curves if present."""
    df = pd.read_csv(curves_dir / "all_curves_long.csv.gz")
    out = []
    for (name, schedule), g in df.groupby(["curve", "schedule"], sort=True):
        g = g.sort_values("step", kind="stable")
        out.append(Curve(str(name), str(schedule), g["step"].to_numpy(float),
                         g["loss"].to_numpy(float)))
    if train_quality.is_dir():
        for path in sorted(train_quality.glob("*.csv")):
            try:
                tq = pd.read_csv(path)
                tq = tq[["step", "loss"]].dropna().sort_values("step", kind="stable")
            except (KeyError, ValueError, OSError) as exc:
                print(f"skipping {path}: {exc}", file=sys.stderr)
                continue
            if len(tq) >= 8:
                # bench/train_quality.py: ScheduleFreePlus runs are anytime; its AdamW baselines
                # use warmup (10% of the steps) then linear decay: counter-examples.
                schedule = ("decay:linear(warmup 10%)" if path.stem.startswith("adamw")
                            else "schedule-free")
                out.append(Curve(f"train_quality/{path.stem}", schedule,
                                 tq["step"].to_numpy(float), tq["loss"].to_numpy(float)))
    return out


def fold_of(family: str) -> int:
    """Deterministic fold of a curve family."""
    return int(hashlib.sha256(family.encode()).hexdigest(), 16) % N_FOLDS


def prefix(curve: Curve, k: float) -> tuple[np.ndarray, np.ndarray]:
    """The backtest protocol's training data: steps in ``[5% T, k T]``."""
    return upto_step(curve, k * float(curve.steps[-1]))


def upto_step(curve: Curve, end: float) -> tuple[np.ndarray, np.ndarray]:
    """The protocol's data up to step ``end``: steps in ``[5% T, end]``."""
    t, y = curve.steps, curve.losses
    m = (t >= BURN_IN_FRACTION * float(t[-1])) & (t <= end)
    return t[m], y[m]


def fit_prefix(curve: Curve, k: float, **kwargs: object) -> Fit:
    """Fit a curve's ``k`` prefix under the protocol (burn-in beyond 5% chosen from the data)."""
    t, y = prefix(curve, k)
    return fit_curve(t, y, **kwargs)  # type: ignore[arg-type]


# --- samples ----------------------------------------------------------------------------------
SAMPLE_COLUMNS = ("curve", "family", "group", "k", "final", "ratio", "y", "y_hat", "se2",
                  "sigma2", "drop", "status", "n_points", "n_eff", "level", "h", "t_last",
                  "cur_level", "decay_rate", "level_step")
#: The statuses whose answers extend the current loss (the transient table calibrates them).
TRANSIENT = (ForecastStatus.TOO_EARLY, ForecastStatus.NO_ASYMPTOTE)
#: A transient comparison counts only this far beyond the cut (closer, the exponent is noise).
TRANSIENT_MIN_HORIZON = 1.25


def horizon_indices(steps: np.ndarray, t0: float, tk: float) -> list[tuple[int, bool]]:
    """Indices of the observed points used as horizons (ratio targets and the last point)."""
    out: dict[int, bool] = {}
    span = tk - t0
    if span <= 0:
        return []
    for r in HORIZON_RATIOS:
        target = t0 + r * span
        if target > steps[-1]:
            break
        j = int(np.searchsorted(steps, target))
        j = min(j, steps.size - 1)
        if steps[j] > tk:
            out.setdefault(j, False)
    out[steps.size - 1] = True
    return sorted(out.items())


def _fit_samples(rows: list[tuple[object, ...]], name: str, family: str, group: str, k: float,
                 fit: Fit, steps: np.ndarray, losses: np.ndarray) -> None:
    """Append the comparisons of one fit with the observed losses after its last step."""
    if not fit.has_forecast or fit.fitted_upto_step is None:
        return
    t0 = fit.fitted_from_step or 0.0
    tk = fit.fitted_upto_step
    for j, final in horizon_indices(steps, t0, tk):
        h = float(steps[j])
        if h <= tk:
            continue
        se2, s2, drop = fit.scale_components(h)
        rows.append((name, family, group, k, final, fit.ratio(h), float(losses[j]),
                     fit.predict(h).value, se2, s2, drop, fit.status, fit.n_points, fit.n_eff,
                     fit._value(tk), h, tk, fit.level, fit.decay_rate, fit.level_anchor))


def collect_samples(curves: Iterable[Curve], cuts: Sequence[float] = CAL_CUTS,
                    group_of: Callable[[Curve], str] | None = None) -> pd.DataFrame:
    """Standardisation inputs for every (anytime curve, cut, horizon)."""
    rows: list[tuple[object, ...]] = []
    for cv in curves:
        if not cv.anytime:
            continue
        for k in cuts:
            _fit_samples(rows, cv.name, cv.family, group_of(cv) if group_of else cv.source, k,
                         fit_prefix(cv, k), cv.steps, cv.losses)
    return pd.DataFrame(rows, columns=list(SAMPLE_COLUMNS))


OURS = "ours"


def collect_run_samples(runs: Iterable[BenchRun], cuts: Sequence[float] = CAL_CUTS
                        ) -> pd.DataFrame:
    """The same comparisons for our own anytime runs (``group`` "ours", one family per run):
    the eval loss up to each cut, fitted with the run's config as the service fits it."""
    rows: list[tuple[object, ...]] = []
    for run in runs:
        if not run.anytime:
            continue
        name = f"{OURS}/{run.name}"
        for k in cuts:
            et, ev, _, _ = run.upto(k)
            _fit_samples(rows, name, name, OURS, k, fit_curve(et, ev, config=run.config),
                         run.eval_steps.astype(float), run.eval_values)
    return pd.DataFrame(rows, columns=list(SAMPLE_COLUMNS))


# --- the transient table ------------------------------------------------------------------------
def transient_exponents(samples: pd.DataFrame) -> pd.DataFrame:
    """``status``, ``g`` (the exponent the loss showed from the cut's level, at the step it
    stands for, to the horizon) and
    ``decay_rate`` of every transient comparison at least ``TRANSIENT_MIN_HORIZON`` past its
    cut."""
    s = samples[samples["status"].isin(TRANSIENT)]
    x = np.log(s["h"].to_numpy(float) / s["level_step"].to_numpy(float))
    with np.errstate(divide="ignore", invalid="ignore"):
        g = -np.log(s["y"].to_numpy(float) / s["cur_level"].to_numpy(float)) / x
    keep = (x >= math.log(TRANSIENT_MIN_HORIZON)) & np.isfinite(g)
    return pd.DataFrame({"status": s["status"].to_numpy()[keep], "g": g[keep],
                         "decay_rate": s["decay_rate"].to_numpy(float)[keep],
                         "family": s["family"].to_numpy()[keep]})


def _weighted_quantiles(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Quantiles at ``PROBS`` of a weighted sample (midpoint rule on the sorted values)."""
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    cum = (np.cumsum(w) - 0.5 * w) / w.sum()
    return np.interp(PROBS, cum, v)


def _quantile_row(values: np.ndarray, families: np.ndarray) -> tuple[float, ...] | None:
    """Quantiles at ``PROBS``, every curve family weighing the same (a long curve with many
    cuts and horizons counts as one run, like a short one); ``None`` with fewer than 20
    comparisons."""
    ok = np.isfinite(values)
    v, fam = values[ok], families[ok]
    if v.size < 20:
        return None
    _, inverse, counts = np.unique(fam, return_inverse=True, return_counts=True)
    q = np.maximum.accumulate(_weighted_quantiles(v, 1.0 / counts[inverse]))
    return tuple(float(x) for x in q)


def fit_transient_table(samples: pd.DataFrame, table_id: str = "") -> cal.TransientTable:
    """Quantiles of the transient exponents (see the module docstring). A row with too few
    comparisons falls back to the quantiles of every transient exponent."""
    e = transient_exponents(samples)
    fam = e["family"].to_numpy()
    pooled = _quantile_row(e["g"].to_numpy(float), fam) or (0.0,) * len(PROBS)
    early = (e["status"] == ForecastStatus.TOO_EARLY).to_numpy()
    flat = (e["status"] == ForecastStatus.NO_ASYMPTOTE).to_numpy()
    rate = e["decay_rate"].to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(flat & (rate > 0), e["g"].to_numpy(float) / rate, np.nan)
    return cal.TransientTable(
        probs=PROBS,
        too_early=_quantile_row(np.where(early, e["g"], np.nan), fam) or pooled,
        no_asymptote=_quantile_row(ratio, fam) or (1.0,) * len(PROBS),
        no_asymptote_plain=_quantile_row(np.where(flat, e["g"], np.nan), fam) or pooled,
        id=table_id,
    )


# --- the table ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Table:
    """A calibration table (what calibration.py holds)."""

    gamma: float
    kappa: float
    ratios: tuple[float, ...]
    probs: tuple[float, ...]
    quantiles: tuple[tuple[float, ...], ...]

    def multipliers(self, ratio: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised twin of ``calibration.multipliers`` for this table."""
        tail = 0.5 * (1.0 - confidence)
        lr = np.log(np.clip(ratio, 1.0, None))
        lrs = np.log(np.asarray(self.ratios))
        q = np.asarray(self.quantiles)
        lo_col = np.array([np.interp(tail, self.probs, row) for row in q])
        hi_col = np.array([np.interp(1.0 - tail, self.probs, row) for row in q])
        return np.interp(lr, lrs, lo_col), np.interp(lr, lrs, hi_col)


def scale(samples: pd.DataFrame, gamma: float, kappa: float) -> np.ndarray:
    """The interval scale S of every sample (mirrors ``Fit._scale``)."""
    s = np.sqrt(kappa * samples["se2"].to_numpy(float) + samples["sigma2"].to_numpy(float)
                + (gamma * samples["drop"].to_numpy(float)) ** 2)
    return np.asarray(np.maximum(s, 1e-300), dtype=float)


def fit_table_for(samples: pd.DataFrame, gamma: float, kappa: float) -> Table:
    """Quantiles of z per ratio bin (bins with fewer than 40 samples are skipped); the
    transient statuses' comparisons are left out (their answers use the transient table)."""
    samples = samples[samples["final"] & ~samples["status"].isin(TRANSIENT)]
    z = ((samples["y"].to_numpy(float) - samples["y_hat"].to_numpy(float))
         / scale(samples, gamma, kappa))
    r = samples["ratio"].to_numpy(float)
    ratios, rows = [], []
    for lo, hi in zip(RATIO_EDGES[:-1], RATIO_EDGES[1:], strict=True):
        m = (r >= lo) & (r < hi) & np.isfinite(z)
        if m.sum() < 40:
            continue
        ratios.append(float(np.median(r[m])))
        rows.append(tuple(float(x) for x in np.quantile(z[m], PROBS)))
    if not rows:
        m = np.isfinite(z)
        ratios, rows = [1.0], [tuple(float(x) for x in np.quantile(z[m], PROBS))]
    # No monotonicity across ratios is imposed: S already grows with the extrapolation (the
    # drop term), and on the corpus the standardised errors *narrow* at large ratios.
    q = np.maximum.accumulate(np.asarray(rows), axis=1)  # non-decreasing in probability
    return Table(gamma, kappa, tuple(ratios), PROBS,
                 tuple(tuple(float(x) for x in row) for row in q))


def bounds(samples: pd.DataFrame, table: Table, confidence: float = 0.9,
           transient: cal.TransientTable | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Interval ends of every sample under ``table`` (and, for the transient statuses, under
    ``transient``; without it those samples get the main table's ends)."""
    lo, hi = table.multipliers(samples["ratio"].to_numpy(float), confidence)
    s = scale(samples, table.gamma, table.kappa)
    yh = samples["y_hat"].to_numpy(float)
    lo, hi = yh + lo * s, yh + hi * s
    if transient is not None:
        for i in np.flatnonzero(samples["status"].isin(TRANSIENT).to_numpy()):
            row = samples.iloc[i]
            _, lo[i], hi[i] = cal.transient_band(
                float(row["cur_level"]), float(row["level_step"]), float(row["h"]),
                str(row["status"]), _opt(row["decay_rate"]), confidence, transient,
                sigma=math.sqrt(max(float(row["sigma2"]), 0.0)))
    return lo, hi


def _opt(x: object) -> float | None:
    v = float(x) if x is not None else math.nan  # type: ignore[arg-type]
    return v if math.isfinite(v) else None


def interval_score(samples: pd.DataFrame, table: Table, confidence: float = 0.9) -> np.ndarray:
    """Relative interval score: (width + 2/alpha * miss distance) / |y| per sample."""
    lo, hi = bounds(samples, table, confidence)
    y = samples["y"].to_numpy(float)
    alpha = 1.0 - confidence
    score = (hi - lo) + 2.0 / alpha * (np.maximum(lo - y, 0.0) + np.maximum(y - hi, 0.0))
    return np.asarray(score / np.maximum(np.abs(y), 1e-12), dtype=float)


def fit_table(samples: pd.DataFrame) -> Table:
    """The calibrated table with the best mean log interval score over the candidate factors."""
    final = samples[samples["final"]]
    best: tuple[float, Table] | None = None
    for kappa in SE_FACTORS:
        for g in GAMMAS:
            table = fit_table_for(final, g, kappa)
            score = float(np.mean(np.log(np.maximum(interval_score(final, table), 1e-12))))
            if best is None or score < best[0]:
                best = (score, table)
    assert best is not None
    return best[1]


def covered(samples: pd.DataFrame, table: Table, confidence: float = 0.9,
            transient: cal.TransientTable | None = None) -> np.ndarray:
    """Whether each sample's interval under ``table`` contains the observed loss."""
    lo, hi = bounds(samples, table, confidence, transient)
    y = samples["y"].to_numpy(float)
    return (y >= lo) & (y <= hi)


def cross_validated_coverage(samples: pd.DataFrame, confidence: float = 0.9,
                             by: str = "fold", ours: pd.DataFrame | None = None) -> pd.Series:
    """Per-sample coverage with each fold's tables fitted on the other folds only.

    ``by="fold"``: grouped k-fold by curve family. ``by="source"``: leave one source out.
    The main table is fitted on the public curves of the other folds; the transient table on
    those and on ``ours`` (our runs' comparisons, never in a public fold).
    """
    key = (samples["family"].map(fold_of) if by == "fold" else samples["curve"].str.split(
        "/").str[0])
    extra = ours if ours is not None else samples.iloc[0:0]
    out = pd.Series(np.nan, index=samples.index)
    for g in key.unique():
        test = key == g
        table = fit_table(samples[~test])
        transient = fit_transient_table(pd.concat([samples[~test], extra]))
        out[test] = covered(samples[test], table, confidence, transient).astype(float)
    return out


# --- the generated module ---------------------------------------------------------------------
def render_module(table: Table, calibration_id: str) -> str:
    """The GENERATED block of calibration.py."""
    def wrap(items: list[str], indent: str) -> str:
        return textwrap.fill(", ".join(items) + ",", width=99, initial_indent=indent,
                             subsequent_indent=indent)

    rows = "\n".join("    (\n" + wrap([f"{x:.4f}" for x in row], " " * 8) + "\n    ),"
                     for row in table.quantiles)
    return (
        "# BEGIN GENERATED\n"
        f'CALIBRATION_ID: Final = "{calibration_id}"\n'
        f"SE_FACTOR: Final = {table.kappa}\n"
        f"DECAY_FACTOR: Final = {table.gamma}\n"
        "RATIOS: Final[tuple[float, ...]] = (\n"
        + wrap([f"{r:.3f}" for r in table.ratios], " " * 4) + "\n)\n"
        "PROBS: Final[tuple[float, ...]] = (\n"
        + wrap([f"{p}" for p in table.probs], " " * 4) + "\n)\n"
        "QUANTILES: Final[tuple[tuple[float, ...], ...]] = (\n" + rows + "\n)\n"
        "# END GENERATED"
    )


def render_transient(table: cal.TransientTable) -> str:
    """The GENERATED TRANSIENT block of calibration.py."""
    def row(name: str, values: tuple[float, ...]) -> str:
        body = textwrap.fill(", ".join(f"{x:.4f}" for x in values) + ",", width=99,
                             initial_indent=" " * 8, subsequent_indent=" " * 8)
        return f"    {name}=(\n{body}\n    ),\n"

    return (
        "# BEGIN GENERATED TRANSIENT\n"
        "TRANSIENT: Final = TransientTable(\n"
        "    probs=PROBS,\n"
        + row("too_early", table.too_early) + row("no_asymptote", table.no_asymptote)
        + row("no_asymptote_plain", table.no_asymptote_plain)
        + f'    id="{table.id}",\n)\n'
        "# END GENERATED TRANSIENT"
    )


def write_module(table: Table, calibration_id: str, transient: cal.TransientTable,
                 path: Path = CAL_MODULE) -> None:
    """Replace both generated blocks of calibration.py."""
    text = path.read_text()
    for begin, end, block in (
        ("# BEGIN GENERATED", "# END GENERATED", render_module(table, calibration_id)),
        ("# BEGIN GENERATED TRANSIENT", "# END GENERATED TRANSIENT", render_transient(transient)),
    ):
        pattern = rf"^{re.escape(begin)}$.*?^{re.escape(end)}$"
        text, n = re.subn(pattern, lambda _m, b=block: b, text, flags=re.S | re.M)
        if n != 1:
            raise RuntimeError(f"{path}: expected one {begin!r} block, found {n}")
    path.write_text(text)


def main(argv: Sequence[str] | None = None) -> int:
    cli = parser(__doc__, quick="every 4th curve", writes_to="the calibration module")
    cli.add_argument("--curves", type=Path, default=DEFAULT_CURVES)
    cli.add_argument("--dry-run", dest="no_write", action="store_true",
                     help="the same as --no-write: print, do not write the module")
    args = cli.parse_args(argv)
    t_start = time.perf_counter()
    curves = [c for c in load_corpus(args.curves) if c.anytime]
    runs = load_runs()
    if args.quick:
        curves, runs = curves[::4], runs[::4]
    samples = collect_samples(curves)
    ours = collect_run_samples(runs)
    table = fit_table(samples)
    n_curves = samples["curve"].nunique()
    n_final = int(samples["final"].sum())
    cal_id = f"corpus-{n_curves}curves-{n_final}fits"
    both = pd.concat([samples, ours], ignore_index=True)
    e = transient_exponents(both)
    transient = fit_transient_table(
        both, f"transient-{ours['curve'].nunique()}runs-{n_curves}curves-{len(e)}comparisons")
    print(f"{len(samples)} samples ({n_final} last-loss) from {n_curves} curves and "
          f"{len(ours)} from {ours['curve'].nunique()} of our runs in "
          f"{time.perf_counter() - t_start:.0f}s; SE_FACTOR={table.kappa} "
          f"DECAY_FACTOR={table.gamma}; transient comparisons: "
          f"{e['status'].value_counts().to_dict()}")
    print(render_module(table, cal_id))
    print(render_transient(transient))
    fin = samples[samples["final"] & samples["k"].isin([0.1, 0.2, 0.3, 0.5])]
    cv = cross_validated_coverage(samples, ours=ours)
    print("cross-validated 90% coverage of the final loss by cut:",
          {k: round(float(cv[fin.index][fin["k"] == k].mean()), 3) for k in (0.1, 0.2, 0.3, 0.5)})
    if writes(args):
        write_module(table, cal_id, transient)
        print(f"wrote {CAL_MODULE.relative_to(REPO)}")
    return 0
