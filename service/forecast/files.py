"""Reading the loss curves ``curvecast forecast`` fits from files.

Three layouts are read:

* a CSV whose header names a ``step`` and a ``loss`` column (other columns are ignored);
* JSON ``{"step": [...], "loss": [...]}``;
* the service's own export, ``GET /api/v1/runs/{id}/metrics.csv``: long format, one point per row,
  ``key,step,value[,wall_time]``, any number of series.

Any of them may be gzip-compressed (read by content, whatever the file's name). And the sources
``curvecast import`` reads (:mod:`curvecast.service.importers`), by the same readers and the
same name-to-key rule: a TensorBoard run (its directory, or one event file), a W&B history
(JSON lines, or a CSV with W&B's ``_step`` column) and, with ``mlflow_run``, an MLflow run of a
tracking store (a local ``mlruns`` directory or a tracking URI).

:func:`load_curves` returns every series a file holds by name (``loss`` for the first two);
:func:`pick_curve` chooses the one to fit exactly as the server does
(:func:`curvecast.contract.fit_key`), unless the caller names one.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path

from curvecast.contract import TELEMETRY_PREFIXES, RunConfig, fit_key

__all__ = ["Curve", "ForecastInputError", "averaging_start", "first_value_per_step",
           "json_object_arg", "load_curves", "load_series", "pick_curve"]

#: The prefixes of ScheduleFree+'s statistics in an export (the contract's, current first; not
#: the bare legacy one: a bare ``c`` or ``warmup`` could be any metric of the script's own).
_SFPLUS_PREFIXES = tuple(prefix for prefix in TELEMETRY_PREFIXES if prefix)

#: A series as read: steps and values, NaN where a cell was empty or ``nan``.
Curve = tuple[list[float], list[float]]
#: The first bytes of a gzip file: any of the layouts may come compressed.
_GZIP_MAGIC = b"\x1f\x8b"

class ForecastInputError(ValueError):
    """A file or argument the forecast command cannot use; the message says why."""


def json_object_arg(text: str, flag: str,
                    error: type[ValueError] = ForecastInputError) -> dict[str, object]:
    """A command-line argument holding a JSON object inline (it starts with ``{``) or naming
    a file that holds one (``curvecast forecast --config``, ``curvecast import --config``).

    Raises:
        error: the file cannot be read, the text is not JSON, or not an object; the message
            starts with ``flag``.
    """
    if not text.lstrip().startswith("{"):
        try:
            text = Path(text).read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError):
            raise error(f"{flag}: cannot read {text!r} (a JSON object or a file holding "
                        "one)") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{flag}: invalid JSON ({exc.msg})") from None
    if not isinstance(raw, dict):
        raise error(f"{flag}: must be a JSON object")
    return raw


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


def _from_source(path: Path, mlflow_run: str | None) -> dict[str, Curve] | None:
    """The curves of a tracker's run (TensorBoard, W&B history, MLflow), or None when ``path``
    is none of those."""
    from curvecast.service.importers import ImportInputError

    try:
        if mlflow_run is not None:
            from curvecast.service.importers import mlflow_runs

            return mlflow_runs.read_curves(str(path), mlflow_run)
        if path.is_dir() or (path.is_file() and "tfevents" in path.name):
            from curvecast.service.importers import events

            try:
                return events.read_curves(path)
            except ImportInputError as exc:
                if path.is_dir() and "no TensorBoard event files" in str(exc):
                    raise ForecastInputError(
                        f"{path}: is a directory, not a file, and no TensorBoard run (no files "
                        "named '*tfevents*' in it or below it)") from None
                raise
        if path.suffix.lower() in (".jsonl", ".ndjson") or _wandb_csv(path):
            from curvecast.service.importers import wandb_history

            return wandb_history.read_curves(path)
    except ImportInputError as exc:
        raise ForecastInputError(str(exc)) from None
    except ImportError as exc:
        raise ForecastInputError(f"{path}: reading it needs the [import] extra ({exc.name} is "
                                 "not installed): pip install 'curvecast[import]'") from None
    return None


def _wandb_csv(path: Path) -> bool:
    """Whether a file is a CSV whose header has W&B's ``_step`` column."""
    if path.suffix.lower() != ".csv" or not path.is_file():
        return False
    with path.open("rb") as f:
        head = f.readline(65536)
    return b"_step" in [cell.strip(b' "') for cell in head.split(b",")]


def load_curves(path: str | Path, mlflow_run: str | None = None) -> dict[str, Curve]:
    """Read every series of a CSV or JSON file, by name (``loss`` for step/loss files), or of
    a tracker's run (a TensorBoard directory or event file, a W&B history, ``mlflow_run`` of
    an MLflow store), by key.

    Blank or ``nan`` cells are kept as NaN (the fit drops them); anything else that is not a
    number is an error naming the line.

    Raises:
        ForecastInputError: the file is missing, unreadable, empty, or not in either format.
    """
    p = Path(path)
    curves = _from_source(p, mlflow_run)
    if curves is not None:
        if not any(steps for steps, _ in curves.values()):
            raise ForecastInputError(f"{p}: no scalar points")
        return curves
    try:
        raw = p.read_bytes()
        if raw[:2] == _GZIP_MAGIC:  # e.g. bench/data/sfplus_corpus/*.csv.gz
            raw = gzip.decompress(raw)
        text = raw.decode("utf-8-sig")
    except (gzip.BadGzipFile, EOFError):
        raise ForecastInputError(f"{p}: a damaged gzip file") from None
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
        curves = {"loss": _from_json(stripped, p)}
    else:
        curves = _from_csv(text, p)
    if not any(steps for steps, _ in curves.values()):
        raise ForecastInputError(f"{p}: no data rows")
    return curves


def load_series(path: str | Path) -> Curve:
    """Read ``(steps, losses)`` from a step/loss CSV or JSON file (the ``loss`` series, or the
    only series of a long-format export).

    The rows come as the file gives them, a step given twice included; the service keeps the
    first value of a step, and :func:`first_value_per_step` gives that view (what
    ``curvecast forecast`` fits)."""
    curves = load_curves(path)
    if "loss" in curves or len(curves) == 1:
        return curves.get("loss") or next(iter(curves.values()))
    raise ForecastInputError(f"{path}: holds several series ({', '.join(sorted(curves))}): "
                             "say which with --key")


def first_value_per_step(curve: Curve) -> tuple[Curve, int]:
    """``curve`` with only the first row of each step, and how many rows were left out.

    The service stores the first value of a (key, step) and ignores a later one (an idempotent
    retry, or a resumed run's log repeating the steps since its checkpoint), so a file fitted
    here gives the fit the service gives once the same rows are ingested in file order.
    """
    steps, values = curve
    seen: set[float] = set()
    kept_steps: list[float] = []
    kept_values: list[float] = []
    for step, value in zip(steps, values, strict=True):
        if step in seen:
            continue
        if step == step:  # NaN steps are not a step the fit can use; kept for it to drop
            seen.add(step)
        kept_steps.append(step)
        kept_values.append(value)
    return (kept_steps, kept_values), len(steps) - len(kept_steps)


def averaging_start(curves: Mapping[str, Curve]) -> tuple[str, int] | None:
    """ScheduleFree+'s ``c_warmup`` as the export's averaging weight shows it, and the key.

    ``c`` is 1 while ``t <= c_warmup``, 1 once more at the first averaging step (its weight over
    a sum of itself), and below 1 from the step after: logged at every step, ``c_warmup`` is the
    last step with ``c == 1``, minus one. Logged every few steps, it lies between that and the
    first step with ``c < 1`` minus two. There the optimizer's default, twice the warmup (read
    exactly from the logged warmup factor ``min(1, t / warmup_steps)``), is taken when it falls
    in that range; else ``t - 1 / c``: exact while the weights are equal (``c_t = 1 / (t -
    c_warmup)``), an upper bound as they grow (they never shrink: ``t^r gamma_max^p`` with
    ``gamma_max`` a running maximum).

    Returns:
        (the key read, ``c_warmup``); None without that series, while ``c`` is still 1
        (averaging has not started: ``c_warmup`` is unknown), or when ``c`` is below 1 from its
        first point.
    """
    for prefix in _SFPLUS_PREFIXES:
        key = prefix + "c"  # the averaging weight
        if key not in curves:
            continue
        points = _finite_points(curves[key])
        below = next((i for i, (_, v) in enumerate(points) if v < 1.0), None)
        if below is None or below == 0:
            return None
        (last_one, _), (step, c) = points[below - 1], points[below]
        low, high = int(last_one) - 1, int(step) - 2
        if low >= high:  # logged at every step around the start: known exactly
            return key, max(0, low)
        warmup = _warmup_steps(curves.get(prefix + "warmup"))
        if warmup is not None and low <= 2 * warmup <= high:
            return key, 2 * warmup
        guess = math.floor(step - 1.0 / c) if c > 0 else low
        return key, max(0, min(max(guess, low), high))
    return None


def _finite_points(curve: Curve) -> list[tuple[float, float]]:
    return sorted((s, v) for s, v in zip(*curve, strict=True)
                  if math.isfinite(s) and math.isfinite(v))


def _warmup_steps(curve: Curve | None) -> int | None:
    """``warmup_steps`` from the logged warmup factor ``min(1, t / warmup_steps)``."""
    for step, factor in _finite_points(curve) if curve is not None else ():
        if 0.0 < factor < 1.0 and step > 0:
            return round(step / factor)
    return None


def pick_curve(curves: Mapping[str, Curve], key: str | None, config: RunConfig,
               where: str) -> tuple[str, Curve]:
    """The series to fit: ``key`` when given, else the server's choice for this config.

    Raises:
        ForecastInputError: ``key`` is not in the file, or no series is loss-like.
    """
    if key is not None:
        if key not in curves:
            raise ForecastInputError(f"{where}: no series {key!r} (found: "
                                     f"{', '.join(sorted(curves))})")
        return key, curves[key]
    counts = {k: sum(1 for v in values if math.isfinite(v)) for k, (_, values) in curves.items()}
    chosen = fit_key(counts, config)
    if chosen is None or chosen not in curves:
        raise ForecastInputError(f"{where}: no loss series among {', '.join(sorted(curves))}: "
                                 "name one with --key")
    return chosen, curves[chosen]


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


def _from_csv(text: str, p: Path) -> dict[str, Curve]:
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
    if {"key", "step", "value"} <= set(names):
        return _from_long_csv(reader, names, p)
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
    return {"loss": (steps, losses)}


def _from_long_csv(reader: Iterator[list[str]], names: list[str], p: Path) -> dict[str, Curve]:
    """The service's export: ``key,step,value[,wall_time]`` rows, grouped by key."""
    i_k, i_s, i_v = names.index("key"), names.index("step"), names.index("value")
    curves: dict[str, Curve] = {}
    try:
        for line_no, row in enumerate(reader, start=2):
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) <= max(i_k, i_s, i_v):
                raise ForecastInputError(f"{p}: line {line_no} has {len(row)} fields, "
                                         f"expected at least {max(i_k, i_s, i_v) + 1}")
            steps, values = curves.setdefault(row[i_k].strip(), ([], []))
            steps.append(_number(row[i_s], f"{p}: line {line_no}, step"))
            values.append(_number(row[i_v], f"{p}: line {line_no}, value"))
    except csv.Error as exc:
        raise ForecastInputError(f"{p}: malformed CSV ({exc})") from None
    return curves
