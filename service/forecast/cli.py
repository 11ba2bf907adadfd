"""``curvecast forecast``: fit a loss curve from a file and print the forecast.

Usage::

    curvecast forecast FILE [--upto FRACTION | --upto-step N] [--key KEY] [--horizon N]
                            [--target LOSS] [--confidence 0.9] [--burn-in N] [--config JSON]
                            [--json]

``FILE`` is a CSV whose header names a ``step`` and a ``loss`` column (other columns are ignored),
JSON ``{"step": [...], "loss": [...]}``, or the service's own export ``metrics.csv``
(``key,step,value,wall_time``; see :mod:`curvecast.service.forecast.files`), any of them
gzip-compressed. A step given twice keeps its first row, as the service keeps the first
value of a (key, step) (a note on stderr says how many rows were left out). From an export the
series is ``--key``, else the one the server would fit (:func:`curvecast.contract.fit_key`: an
evaluation loss with enough points, else ``loss``). Only points with ``step <= cut`` are fitted,
where the cut is ``--upto-step N`` or ``--upto FRACTION`` times the last step in the file
(default: every point).

``--config`` takes the run's config (a JSON object, or the path of a file holding one; a run as
``GET /api/v1/runs/{id}`` answers it gives its ``"config"``), read
through :class:`curvecast.contract.RunConfig` exactly as the server reads a stored run's: its
averaging start is the fit's burn-in (unless ``--burn-in`` says otherwise) and ``--horizon``
defaults to its ``total_steps``, else the last step in the file. Without a config's averaging
start, a ScheduleFree+ run's export gives its own (:func:`~.files.averaging_start`, from the
averaging weight the hook logs). So the command and ``GET .../forecast`` give the same status
and numbers for the same data; the answer itself is built by
:mod:`curvecast.service.forecast.answer`, the builder the server uses.

With ``--json`` one object is printed; its keys are a public contract (the keys of the REST
forecast that an offline fit has)::

    {"status", "n_points", "fitted_upto_step", "a", "b", "c",
     "f_star": {"value", "lo", "hi"},
     "prediction": {"step", "value", "lo", "hi", "reached"},
     "target": {"loss", "step", "lo", "hi", "reachable", "reached", "reason",
                "past_planned_end"} | null}

Numbers that do not exist (no forecast, an unreachable target) are ``null``. Exit status: 0 when
a result was printed (whatever the fit's status), 2 for a bad file or bad arguments (the message on
stderr names the problem).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from curvecast.contract import LEVEL_EXTENDING_STATUSES, MAX_STEP, ForecastStatus, RunConfig, lr_key
from curvecast.service.forecast.answer import forecast_answer, offline_json
from curvecast.service.forecast.files import (
    Curve,
    ForecastInputError,
    averaging_start,
    first_value_per_step,
    json_object_arg,
    load_curves,
    load_series,
    pick_curve,
)
from curvecast.service.forecast.fit import Fit
from curvecast.service.forecast.reached import loss_reached
from curvecast.service.forecast.solver import fit_curve

__all__ = ["ForecastInputError", "add_forecast_parser", "forecast_result", "load_series", "main",
           "run_forecast"]


# --- the command ---------------------------------------------------------------------------------
def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE",
                        help='CSV with "step" and "loss" columns, JSON {"step": [], "loss": []}, '
                        "or the service's metrics.csv export (key,step,value,wall_time); "
                        "any of them gzip-compressed. Or a TensorBoard run directory (or event "
                        "file), a W&B history (.jsonl, or CSV with _step), or with --mlflow-run "
                        "an MLflow store (mlruns directory or tracking URI)")
    parser.add_argument("--mlflow-run", metavar="RUN_ID",
                        help="forecast this run of the MLflow store FILE")
    parser.add_argument("--key", metavar="KEY",
                        help="the series to fit from a metrics.csv export (default: the one the "
                        "server fits: an evaluation loss, else loss)")
    cut = parser.add_mutually_exclusive_group()
    cut.add_argument("--upto", type=float, metavar="FRACTION",
                     help="fit the points up to this fraction (0-1] of the last step in FILE "
                     "(default: all of them)")
    cut.add_argument("--upto-step", type=float, metavar="N", help="fit the points with step <= N")
    parser.add_argument("--horizon", type=float, metavar="N",
                        help="step to forecast, 0 or more (default: the config's total_steps, "
                        "else the last step in FILE)")
    parser.add_argument("--target", type=float, metavar="LOSS",
                        help="also say when the loss reaches LOSS")
    parser.add_argument("--confidence", type=float, default=0.9,
                        help="interval coverage in (0.5, 1), as the REST API takes it "
                        "(default 0.9)")
    parser.add_argument("--burn-in", type=float, metavar="STEP",
                        help="first step to fit (default: the config's averaging start, else "
                        "the one a ScheduleFree+ export's averaging weight opt/c shows, else "
                        "chosen from the data)")
    parser.add_argument("--config", metavar="JSON",
                        help="the run's config: a JSON object or a file holding one "
                        '(e.g. \'{"total_steps": 20000, "c_warmup": 500}\'), or a run as GET '
                        "/api/v1/runs/{id} answers (its \"config\" is read)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def add_forecast_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``forecast`` on the ``curvecast`` command's subparsers."""
    parser = subparsers.add_parser(
        "forecast", help="forecast a loss curve from a CSV/JSON file",
        description="Fit f(t) = a/sqrt(t+b) + c to the points up to a cut and forecast the loss "
        "at a horizon, the asymptote f* ~ c, and when a target loss is reached.")
    _add_arguments(parser)
    parser.set_defaults(func=run_forecast)


def _check_args(args: argparse.Namespace) -> None:
    if args.upto is not None and not (0.0 < args.upto <= 1.0):
        raise ForecastInputError(f"--upto must be a fraction in (0, 1], got {args.upto}")
    conf = args.confidence
    if not (math.isfinite(conf) and 0.5 < conf < 1.0):  # as the REST API's confidence
        raise ForecastInputError(f"--confidence must be in (0.5, 1), got {conf}")
    for name in ("upto_step", "horizon", "target", "burn_in"):
        v = getattr(args, name, None)
        if v is not None and not math.isfinite(v):
            raise ForecastInputError(f"--{name.replace('_', '-')} must be a finite number")
    # The same bounds as the REST API's ?horizon= (0 <= horizon <= MAX_STEP).
    if args.horizon is not None and not 0 <= args.horizon <= MAX_STEP:
        raise ForecastInputError(f"--horizon must be a step in [0, {MAX_STEP}], got "
                                 f"{args.horizon:g}")
    if args.upto_step is not None and args.upto_step < 0:
        raise ForecastInputError(f"--upto-step must be 0 or more, got {args.upto_step:g}")


#: The keys a run config is read by (a JSON object with none of them at its top level and a
#: "config" object inside is a run, not a config).
_CONFIG_KEYS = RunConfig.keys_read()


def _read_config(text: str | None) -> RunConfig:
    """The ``--config`` value (a JSON object, or the path of a file holding one), typed.

    Raises:
        ForecastInputError: the file cannot be read, or it is not a JSON object.
    """
    if text is None:
        return RunConfig()
    raw = json_object_arg(text, "--config")
    inner = raw.get("config")
    if isinstance(inner, dict) and not _CONFIG_KEYS & raw.keys():
        # A run as the REST API returns it (GET /api/v1/runs/{id}, saved to a file), or our
        # corpus's run files: the config is its "config". Read as a config itself, it would
        # give no c_warmup, silently.
        raw = inner
    return RunConfig.read(raw)


def forecast_result(steps: Sequence[float], losses: Sequence[float], *, cut: float,
                    horizon: int | None, target: float | None, confidence: float,
                    burn_in: float | None = None, config: RunConfig | None = None,
                    key: str | None = None, lr: Curve | None = None
                    ) -> tuple[dict[str, Any], Fit]:
    """The JSON object of the command (and the fit), for points with ``step <= cut``.

    ``horizon`` None: the config's horizon (``total_steps``, else the last step given).
    ``lr``: the learning rate the run logged (``opt/lr`` in the service's export), if any.
    """
    config = config or RunConfig()
    pts = [(s, v) for s, v in zip(steps, losses, strict=True) if s <= cut]
    cut_steps, cut_values = [s for s, _ in pts], [v for _, v in pts]
    fit = fit_curve(cut_steps, cut_values, burn_in=burn_in, config=config,
                    confidence=confidence, lr=lr)
    last_step = max((s for s in steps if math.isfinite(s)), default=None)
    answer = forecast_answer(
        fit,
        config=config,
        last_step=None if last_step is None else round(last_step),
        horizon=horizon,
        confidence=confidence,
        target_loss=target,
        key=key,
        # The loss at the horizon once the points given (up to the cut) got there, as the API
        # answers it from the stored points.
        reached=lambda _key, step: loss_reached(cut_steps, cut_values, step),
    )
    return offline_json(answer), fit


def _fmt(x: float | None, digits: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{digits}g}"


def _fmt_step(x: float | None) -> str:
    return "never" if x is None else f"{x:,.0f}"


def _formula(a: float, b: float | None, c: float) -> str:
    """``f(t) = a / sqrt(t + b) + c`` with real signs (a flat fit is ``f(t) = c``)."""
    if b is None or a == 0:
        return f"f(t) = {c:.4g}"
    inner = f"t + {b:.4g}" if b >= 0 else f"t - {-b:.4g}"
    tail = f"+ {c:.4g}" if c >= 0 else f"- {-c:.4g}"
    return f"f(t) = {a:.4g} / sqrt({inner}) {tail}"


def _summary(out: dict[str, Any], fit: Fit, confidence: float, key: str, *,
             configured: bool = True, c_warmup_from: tuple[str, int] | None = None) -> str:
    """The text answer. ``c_warmup_from``: the series the config's ``c_warmup`` was read from
    (the export's averaging weight) and its value, when no config gave it."""
    pct = f"{confidence:.0%}"
    lines = [f"status: {out['status']}" + (f" ({fit.message})" if fit.message else ""),
             f"series: {key}"]
    if c_warmup_from is not None:
        series, c_warmup = c_warmup_from
        lines.append(f"averaging start (c_warmup): step {c_warmup:,}, read from {series} (the "
                     "averaging weight is 1 until then)")
    if fit.burn_in is not None:
        lines.append(f"burn-in: step {_fmt_step(fit.burn_in)} ({fit.burn_in_source or 'given'})")
    if out["c"] is None:
        if fit.status != ForecastStatus.DIVERGED:  # its message says why there is none
            lines.append(f"{out['n_points']} usable points: no forecast")
        return "\n".join(lines)
    lines.append(f"fit: {_formula(out['a'], out['b'], out['c'])}   "
                 f"({out['n_points']} points up to step {_fmt_step(out['fitted_upto_step'])}, "
                 f"from step {_fmt_step(fit.fitted_from_step)})")
    if fit.useful_from_step is not None:
        lines.append(f"next useful forecast: from step {_fmt_step(fit.useful_from_step)}")
    if fit.status in LEVEL_EXTENDING_STATUSES and fit.level is not None:
        lines.append(f"forecast: the current loss {_fmt(fit.level)} extended at the pace runs "
                     "like this one kept, not the curve above")
    p = out["prediction"]
    # The loss the points had there (smoothed: reached.smoothed_reached).
    logged = "" if p is None or p["reached"] is None else f"{_fmt(p['reached'])} (data)"
    if p is not None and p["value"] is None and fit.before_fitted_range(p["step"]):
        lines.append(f"loss at step {_fmt_step(p['step'])}: no forecast: it is before the fitted "
                     f"range (from step {_fmt_step(fit.fitted_from_step)}), which the model "
                     "describes; the loss there is " + (logged or "in the file"))
    elif p is not None:  # None only without a horizon (every step in the file is 0)
        lines.append(f"loss at step {_fmt_step(p['step'])}: {_fmt(p['value'])}  "
                     f"[{pct}: {_fmt(p['lo'])} – {_fmt(p['hi'])}]"
                     + (f"; reached there: {logged}" if logged else ""))
    s = out["f_star"]
    if s["value"] is None:
        lines.append(f"asymptote f*: not identifiable yet, at most {_fmt(s['hi'])}")
    else:
        lines.append(f"asymptote f* ~ c: {_fmt(s['value'])}  [{pct}: {_fmt(s['lo'])} – "
                     f"{_fmt(s['hi'])}]")
    tg = out["target"]
    if tg is not None:
        if tg["reached"]:
            lines.append(f"loss {_fmt(tg['loss'])} already reached at step "
                         f"{_fmt_step(tg['step'])} (data)")
        elif tg["reachable"]:
            # A reason here: past the config's total_steps, not in this run.
            after = f" ({tg['reason']})" if tg["reason"] else ""
            lines.append(f"loss {_fmt(tg['loss'])} reached at step ~{_fmt_step(tg['step'])}  "
                         f"[{pct}: {_fmt_step(tg['lo'])} – {_fmt_step(tg['hi'])}]{after}")
        else:
            extra = (f" (possible by step {_fmt_step(tg['lo'])} at the optimistic end)"
                     if tg["lo"] is not None else "")
            lines.append(f"loss {_fmt(tg['loss'])}: not reachable, {tg['reason']}" + extra)
    if fit.off_model:
        lines.append("warning: the run is off the a/sqrt(t+b)+c model (see the status): treat "
                     "the forecast with care")
        if not configured:
            # Without its c_warmup, a ScheduleFree+ run's fall once averaging starts looks like
            # a decay leaving the model (off_model without the config, too_early with it).
            lines.append("hint: no --config or --burn-in given; for a ScheduleFree+ run pass "
                         "--config with the run's config (c_warmup, warmup_steps), e.g. the "
                         "file GET /api/v1/runs/{id} answers, so the fit starts after its "
                         "burn-in")
    return "\n".join(lines)


def run_forecast(args: argparse.Namespace) -> int:
    """Execute the command; prints to stdout, errors to stderr. Returns the exit status."""
    try:
        _check_args(args)
        config = _read_config(args.config)
        # The first value of each step, as the service keeps them.
        loaded = load_curves(args.file, args.mlflow_run)
        firsts = {k: first_value_per_step(c) for k, c in loaded.items()}
        curves = {k: curve for k, (curve, _) in firsts.items()}
        inferred = None
        if args.burn_in is None and config.averaging_start is None:
            # An export of a watched ScheduleFree+ run logs its averaging weight: the fit then
            # starts where the service's does, with no --config needed.
            inferred = averaging_start(curves)
            if inferred is not None:
                config = dataclasses.replace(config, c_warmup=inferred[1])
        key, (steps, losses) = pick_curve(curves, args.key, config, args.file)
        repeated = firsts[key][1]
        lr_series = lr_key(curves)  # the service's export holds opt/lr when the hook logged it
        finite_steps = [s for s in steps if math.isfinite(s)]
        if not finite_steps:
            raise ForecastInputError(f"{args.file}: no finite step values")
        if args.upto is not None:
            cut = args.upto * max(finite_steps)
        else:
            cut = args.upto_step if args.upto_step is not None else max(finite_steps)
        horizon = None if args.horizon is None else round(args.horizon)
        out, fit = forecast_result(steps, losses, cut=cut, horizon=horizon, target=args.target,
                                   confidence=args.confidence, burn_in=args.burn_in,
                                   config=config, key=key,
                                   lr=None if lr_series is None else curves[lr_series])
    except ForecastInputError as exc:
        print(f"curvecast forecast: error: {exc}", file=sys.stderr)
        return 2
    if repeated:
        # On stderr: with --json, stdout holds the one object of the contract.
        print(f"curvecast forecast: note: {repeated:,} row(s) of {key} repeat an earlier step "
              "(a resumed run's log?); the first value of each step is fitted, as the service "
              "stores them", file=sys.stderr)
    if args.json:
        print(json.dumps(out, allow_nan=False))
    else:
        # A logged learning rate means another optimizer (watch() logs it for those only).
        configured = (args.config is not None or args.burn_in is not None
                      or lr_series is not None or inferred is not None)
        print(_summary(out, fit, args.confidence, key, configured=configured,
                       c_warmup_from=inferred))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m service.forecast.cli FILE ...`` (the same options as ``curvecast forecast``)."""
    parser = argparse.ArgumentParser(prog="curvecast forecast",
                                     description=__doc__.split("\n\n")[0])
    _add_arguments(parser)
    return run_forecast(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
