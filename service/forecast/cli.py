"""``curvecast forecast``: fit a loss curve from a file and print the forecast.

Usage::

    curvecast forecast FILE (--upto FRACTION | --upto-step N) [--horizon N] [--target LOSS]
                            [--confidence 0.9] [--burn-in N] [--config JSON] [--json]

``FILE`` is a CSV whose header names a ``step`` and a ``loss`` column (other columns are ignored),
or JSON ``{"step": [...], "loss": [...]}``. Only points with ``step <= cut`` are fitted, where the
cut is ``--upto-step N`` or ``--upto FRACTION`` times the last step in the file.

``--config`` takes the run's config (a JSON object, or the path of a file holding one), read
through :class:`curvecast.contract.RunConfig` exactly as the server reads a stored run's: its
averaging start is the fit's burn-in (unless ``--burn-in`` says otherwise) and ``--horizon``
defaults to its ``total_steps``, else the last step in the file. So the command and
``GET .../forecast`` give the same status and numbers for the same data; the answer itself is
built by :mod:`curvecast.service.forecast.answer`, the builder the server uses.

With ``--json`` one object is printed; its keys are a public contract (the keys of the REST
forecast that an offline fit has)::

    {"status", "n_points", "fitted_upto_step", "a", "b", "c",
     "f_star": {"value", "lo", "hi"},
     "prediction": {"step", "value", "lo", "hi"},
     "target": {"loss", "step", "lo", "hi", "reachable"} | null}

Numbers that do not exist (no forecast, an unreachable target) are ``null``. Exit status: 0 when
a result was printed (whatever the fit's status), 2 for a bad file or bad arguments (the message on
stderr names the problem).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from curvecast.contract import RunConfig
from curvecast.service.forecast.answer import forecast_answer, offline_json
from curvecast.service.forecast.fit import Fit
from curvecast.service.forecast.solver import fit_curve

__all__ = ["ForecastInputError", "add_forecast_parser", "forecast_result", "load_series", "main",
           "run_forecast"]


class ForecastInputError(ValueError):
    """A file or argument the forecast command cannot use; the message says why."""


# --- input ---------------------------------------------------------------------------------------
def _number(text: object, where: str) -> float:
    if isinstance(text, bool):
        raise ForecastInputError(f"{where}: {text!r} is not a number")
    if text is None:
        return math.nan
    if isinstance(text, int | float):
        return float(text)
    s = str(text).strip()
    if s == "" or s.lower() in ("nan", "null", "none", "na"):
        return math.nan
    try:
        return float(s)
    except ValueError:
        raise ForecastInputError(f"{where}: {s!r} is not a number") from None


def load_series(path: str | Path) -> tuple[list[float], list[float]]:
    """Read ``(steps, losses)`` from a CSV or JSON file.

    Blank or ``nan`` cells are kept as NaN (the fit drops them); anything else that is not a
    number is an error naming the line.

    Raises:
        ForecastInputError: the file is missing, unreadable, empty, or not in either format.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ForecastInputError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise ForecastInputError(f"{p}: is a directory, not a file") from None
    except UnicodeDecodeError:
        raise ForecastInputError(f"{p}: not a text file (CSV or JSON expected)") from None
    except OSError as exc:
        raise ForecastInputError(f"{p}: cannot read ({exc.strerror})") from None
    stripped = text.lstrip()
    if not stripped:
        raise ForecastInputError(f"{p}: the file is empty")
    if p.suffix.lower() == ".json" or stripped[0] in "{[":
        steps, losses = _from_json(stripped, p)
    else:
        steps, losses = _from_csv(text, p)
    if not steps:
        raise ForecastInputError(f"{p}: no data rows")
    return steps, losses


def _from_json(text: str, p: Path) -> tuple[list[float], list[float]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ForecastInputError(f"{p}: invalid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise ForecastInputError(f'{p}: JSON must be an object {{"step": [...], "loss": [...]}}')
    missing = [k for k in ("step", "loss") if k not in data]
    if missing:
        raise ForecastInputError(f"{p}: JSON has no {' or '.join(repr(m) for m in missing)} key")
    raw_s, raw_l = data["step"], data["loss"]
    if not isinstance(raw_s, list) or not isinstance(raw_l, list):
        raise ForecastInputError(f'{p}: "step" and "loss" must be arrays')
    if len(raw_s) != len(raw_l):
        raise ForecastInputError(
            f'{p}: "step" has {len(raw_s)} values but "loss" has {len(raw_l)}')
    steps = [_number(v, f"{p}: step[{i}]") for i, v in enumerate(raw_s)]
    losses = [_number(v, f"{p}: loss[{i}]") for i, v in enumerate(raw_l)]
    return steps, losses


def _from_csv(text: str, p: Path) -> tuple[list[float], list[float]]:
    try:
        dialect = csv.Sniffer().sniff(text[:4096], delimiters=",;\t")
    except csv.Error:
        dialect = csv.excel
    reader = csv.reader(text.splitlines(), dialect)
    try:
        header = next(reader)
    except (StopIteration, csv.Error):
        raise ForecastInputError(f"{p}: no CSV header") from None
    names = [h.strip().lower() for h in header]
    missing = [k for k in ("step", "loss") if k not in names]
    if missing:
        raise ForecastInputError(
            f"{p}: the CSV header has no {' or '.join(repr(m) for m in missing)} column "
            f"(found: {', '.join(h.strip() for h in header) or 'nothing'})")
    i_s, i_l = names.index("step"), names.index("loss")
    steps: list[float] = []
    losses: list[float] = []
    try:
        for line_no, row in enumerate(reader, start=2):
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) <= max(i_s, i_l):
                raise ForecastInputError(f"{p}: line {line_no} has {len(row)} fields, "
                                         f"expected at least {max(i_s, i_l) + 1}")
            steps.append(_number(row[i_s], f"{p}: line {line_no}, step"))
            losses.append(_number(row[i_l], f"{p}: line {line_no}, loss"))
    except csv.Error as exc:
        raise ForecastInputError(f"{p}: malformed CSV ({exc})") from None
    return steps, losses


# --- the command ---------------------------------------------------------------------------------
def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE",
                        help='CSV with "step" and "loss" columns, or JSON {"step": [], "loss": []}')
    cut = parser.add_mutually_exclusive_group(required=True)
    cut.add_argument("--upto", type=float, metavar="FRACTION",
                     help="fit the points up to this fraction (0-1] of the last step in FILE")
    cut.add_argument("--upto-step", type=float, metavar="N", help="fit the points with step <= N")
    parser.add_argument("--horizon", type=float, metavar="N",
                        help="step to forecast (default: the last step in FILE)")
    parser.add_argument("--target", type=float, metavar="LOSS",
                        help="also say when the loss reaches LOSS")
    parser.add_argument("--confidence", type=float, default=0.9,
                        help="interval coverage in (0, 1) (default 0.9)")
    parser.add_argument("--burn-in", type=float, metavar="STEP",
                        help="first step to fit (default: the config's averaging start, else "
                        "chosen from the data)")
    parser.add_argument("--config", metavar="JSON",
                        help="the run's config: a JSON object or a file holding one "
                        '(e.g. \'{"total_steps": 20000, "c_warmup": 500}\')')
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
    if not (math.isfinite(conf) and 0.0 < conf < 1.0):
        raise ForecastInputError(f"--confidence must be in (0, 1), got {conf}")
    for name in ("upto_step", "horizon", "target", "burn_in"):
        v = getattr(args, name, None)
        if v is not None and not math.isfinite(v):
            raise ForecastInputError(f"--{name.replace('_', '-')} must be a finite number")


def _read_config(text: str | None) -> RunConfig:
    """The ``--config`` value (a JSON object, or the path of a file holding one), typed.

    Raises:
        ForecastInputError: the file cannot be read, or it is not a JSON object.
    """
    if text is None:
        return RunConfig()
    if not text.lstrip().startswith("{"):
        try:
            text = Path(text).read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError):
            raise ForecastInputError(f"--config: cannot read {text!r} (a JSON object or a file "
                                     "holding one)") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ForecastInputError(f"--config: invalid JSON ({exc.msg})") from None
    if not isinstance(raw, dict):
        raise ForecastInputError("--config: must be a JSON object")
    return RunConfig.read(raw)


def forecast_result(steps: Sequence[float], losses: Sequence[float], *, cut: float,
                    horizon: int | None, target: float | None, confidence: float,
                    burn_in: float | None = None, config: RunConfig | None = None
                    ) -> tuple[dict[str, Any], Fit]:
    """The JSON object of the command (and the fit), for points with ``step <= cut``.

    ``horizon`` None: the config's horizon (``total_steps``, else the last step given).
    """
    config = config or RunConfig()
    pts = [(s, v) for s, v in zip(steps, losses, strict=True) if s <= cut]
    fit = fit_curve([s for s, _ in pts], [v for _, v in pts], burn_in=burn_in, config=config,
                    confidence=confidence)
    last_step = max((s for s in steps if math.isfinite(s)), default=None)
    answer = forecast_answer(
        fit,
        config=config,
        last_step=None if last_step is None else round(last_step),
        horizon=horizon,
        confidence=confidence,
        target_loss=target,
    )
    return offline_json(answer), fit


def _fmt(x: float | None, digits: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{digits}g}"


def _fmt_step(x: float | None) -> str:
    return "never" if x is None else f"{x:,.0f}"


def _summary(out: dict[str, Any], fit: Fit, confidence: float) -> str:
    pct = f"{confidence:.0%}"
    lines = [f"status: {out['status']}" + (f" ({fit.message})" if fit.message else "")]
    if out["c"] is None:
        lines.append(f"{out['n_points']} usable points: no forecast")
        return "\n".join(lines)
    b = "n/a" if out["b"] is None else f"{out['b']:.4g}"
    lines.append(f"fit: f(t) = {out['a']:.4g} / sqrt(t + {b}) + {out['c']:.4g}   "
                 f"({out['n_points']} points up to step {_fmt_step(out['fitted_upto_step'])}, "
                 f"from step {_fmt_step(fit.fitted_from_step)})")
    p = out["prediction"]
    if p is not None:  # None only without a horizon (every step in the file is 0)
        lines.append(f"loss at step {_fmt_step(p['step'])}: {_fmt(p['value'])}  "
                     f"[{pct}: {_fmt(p['lo'])} – {_fmt(p['hi'])}]")
    s = out["f_star"]
    lines.append(f"asymptote f* ~ c: {_fmt(s['value'])}  [{pct}: {_fmt(s['lo'])} – "
                 f"{_fmt(s['hi'])}]")
    tg = out["target"]
    if tg is not None:
        if tg["reachable"]:
            lines.append(f"loss {_fmt(tg['loss'])} reached at step ~{_fmt_step(tg['step'])}  "
                         f"[{pct}: {_fmt_step(tg['lo'])} – {_fmt_step(tg['hi'])}]")
        else:
            extra = (f" (possible by step {_fmt_step(tg['lo'])} at the optimistic end)"
                     if tg["lo"] is not None else "")
            lines.append(f"loss {_fmt(tg['loss'])}: not reachable, at or below the asymptote"
                         + extra)
    if fit.off_model:
        lines.append("warning: the recent data left the a/sqrt(t+b)+c model (an LR decay or a "
                     "divergence?): treat the forecast with care")
    return "\n".join(lines)


def run_forecast(args: argparse.Namespace) -> int:
    """Execute the command; prints to stdout, errors to stderr. Returns the exit status."""
    try:
        _check_args(args)
        steps, losses = load_series(args.file)
        config = _read_config(args.config)
        finite_steps = [s for s in steps if math.isfinite(s)]
        if not finite_steps:
            raise ForecastInputError(f"{args.file}: no finite step values")
        cut = args.upto_step if args.upto is None else args.upto * max(finite_steps)
        horizon = None if args.horizon is None else round(args.horizon)
        out, fit = forecast_result(steps, losses, cut=cut, horizon=horizon, target=args.target,
                                   confidence=args.confidence, burn_in=args.burn_in,
                                   config=config)
    except ForecastInputError as exc:
        print(f"curvecast forecast: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, allow_nan=False))
    else:
        print(_summary(out, fit, args.confidence))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m service.forecast.cli FILE ...`` (the same options as ``curvecast forecast``)."""
    parser = argparse.ArgumentParser(prog="curvecast forecast",
                                     description=__doc__.split("\n\n")[0])
    _add_arguments(parser)
    return run_forecast(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
