"""W&B runs, offline: a run's history exported to a file, read with pandas.

The file is a CSV (``run.history().to_csv(...)``) or JSON lines (``run.scan_history()``'s rows
dumped one object a line, or ``history().to_json(orient="records", lines=True)``), read
``rows`` rows at a time. A row is a step: ``_step`` (W&B's own step column; ``--step-column``
names another), ``_timestamp`` its wall time in seconds. Every other column is a metric, except
W&B's own (names starting with ``_``: ``_runtime``, ``_wandb``) and a CSV's unnamed index
column. A cell is a point when it holds a number; an empty cell, ``null`` or NaN is W&B's "not
logged at this step", and a cell holding anything else (a media file's description, text) is
not a point either. Booleans are not metrics.

The run's config is not in its history: ``--config`` takes W&B's ``config.json`` or
``run.config`` dumped as JSON (W&B's ``{"key": {"value": ...}}`` form is unwrapped).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from curvecast.service.importers.batches import (
    Checkpoint,
    Chunk,
    ImportInputError,
    KeyMap,
    SourceRun,
)

__all__ = ["WandbHistory", "history_file", "read_curves", "unwrap_config"]

KIND = "wandb"
STEP_COLUMN = "_step"
TIME_COLUMN = "_timestamp"
_JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")


def _is_json_lines(path: Path) -> bool:
    if path.suffix.lower() in _JSON_SUFFIXES:
        return True
    with path.open("rb") as f:
        return f.read(64).lstrip()[:1] == b"{"


@dataclass
class WandbHistory:
    """A history file to import as one run."""

    run: SourceRun
    path: Path
    step_column: str = STEP_COLUMN

    def _frames(self, rows: int) -> Iterator[pd.DataFrame]:
        try:
            if _is_json_lines(self.path):
                # dtype=False: no column is turned into dates because of its name;
                # precise_float: every value read back exactly (the default parser is not).
                yield from pd.read_json(self.path, lines=True, chunksize=rows, dtype=False,
                                        precise_float=True)
            else:
                yield from pd.read_csv(self.path, chunksize=rows, low_memory=False)
        except (ValueError, pd.errors.ParserError, UnicodeDecodeError) as exc:
            raise ImportInputError(f"{self.path}: not a W&B history file (CSV or JSON "
                                   f"lines): {str(exc).splitlines()[0][:200]}") from None

    def bytes_to_read(self) -> int:
        """The file's size (progress is counted in the rows' share of it)."""
        return self.path.stat().st_size

    def checkpoints(self, keymap: KeyMap, batch_points: int) -> Iterator[Checkpoint]:
        """The history, a checkpoint for each block of rows (about ``batch_points`` points)."""
        size = self.bytes_to_read()
        rows = max(1, batch_points // 16)
        done_rows = 0
        reported = 0
        total_rows: int | None = None
        for frame in self._frames(rows):
            chunks, skipped = self._chunks(frame, keymap)
            done_rows += len(frame)
            if total_rows is None:
                total_rows = self._estimate_rows(size, frame)
            share = min(size, size * done_rows // max(total_rows, done_rows))
            yield Checkpoint(chunks, progress=share - reported, skipped=skipped)
            reported = share
        if reported < size:
            yield Checkpoint((), progress=size - reported)

    def _estimate_rows(self, size: int, frame: pd.DataFrame) -> int:
        # Progress only: the rows of the first block, scaled by the file's size.
        head = frame.head(200).to_csv(index=False).encode()
        return max(len(frame), round(size * min(len(frame), 200) / max(len(head), 1)))

    def _chunks(self, frame: pd.DataFrame, keymap: KeyMap
                ) -> tuple[tuple[Chunk, ...], dict[str, int]]:
        if self.step_column not in frame.columns:
            raise ImportInputError(
                f"{self.path}: no {self.step_column!r} column (found: "
                f"{', '.join(map(str, list(frame.columns)[:12]))}); name the step column with "
                "--step-column")
        step_col = pd.to_numeric(frame[self.step_column], errors="coerce").to_numpy(
            dtype=np.float64, na_value=np.nan)
        walls = (pd.to_numeric(frame[TIME_COLUMN], errors="coerce").to_numpy(
            dtype=np.float64, na_value=np.nan) if TIME_COLUMN in frame.columns else None)
        has_step = np.isfinite(step_col) & (step_col >= 0) & (step_col == np.floor(step_col))
        skipped: dict[str, int] = {}
        chunks = []
        for column in frame.columns:
            name = str(column)
            if name.startswith("_") or name.startswith("Unnamed:") or not name:
                continue
            series = frame[column]
            if series.dtype == bool:
                continue
            key = keymap.key(name)
            if key is None:
                continue
            if series.dtype == object:  # mixed cells: a boolean is not a number here
                series = series.where(~series.map(lambda cell: isinstance(cell, bool)))
            values = pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64,
                                                                     na_value=np.nan)
            present = ~np.isnan(values)
            if not present.any():
                continue
            keep = present & has_step
            if (lost := int((present & ~has_step).sum())):
                skipped[key] = lost
            chunks.append(Chunk(key, step_col[keep].astype(np.int64), values[keep],
                                None if walls is None else walls[keep]))
        return tuple(chunks), skipped


def unwrap_config(raw: Mapping[str, Any]) -> dict[str, Any]:
    """W&B's config file (``{"lr": {"desc": null, "value": 0.1}, "_wandb": {...}}``) as plain
    ``{"lr": 0.1}``; a plain mapping stays as it is. W&B's own ``_wandb`` entry is dropped."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "_wandb":
            continue
        if isinstance(value, Mapping) and "value" in value and set(value) <= {"value", "desc"}:
            value = value["value"]
        out[str(key)] = value
    return out


def history_file(path: str | os.PathLike[str], *, run_path: str | None = None,
                 name: str | None = None, step_column: str = STEP_COLUMN) -> WandbHistory:
    """A history file as a run to import: its identity is ``run_path`` (W&B's
    ``entity/project/run_id``) when given, else the file's absolute path.

    Raises:
        ImportInputError: no such file.
    """
    file = Path(path).expanduser()
    if not file.is_file():
        raise ImportInputError(f"{file}: no such file (a W&B history exported as CSV or JSON "
                               "lines)")
    file = file.resolve()
    source: dict[str, Any] = {"kind": KIND, "path": str(file)}
    if run_path:
        source["run_path"] = run_path
    run_name = name or (run_path.rsplit("/", 1)[-1] if run_path else file.name.split(".")[0])
    run = SourceRun(kind=KIND, identity=run_path or str(file), name=run_name[:200] or "wandb",
                    status_reason="imported from W&B", source=source)
    return WandbHistory(run=run, path=file, step_column=step_column)


def read_curves(path: str | os.PathLike[str], step_column: str = STEP_COLUMN
                ) -> dict[str, tuple[list[float], list[float]]]:
    """Every metric of a history file, by key, whole (for ``curvecast forecast``)."""
    curves: dict[str, tuple[list[float], list[float]]] = {}
    history = history_file(path, step_column=step_column)
    for checkpoint in history.checkpoints(KeyMap(), batch_points=1 << 20):
        for chunk in checkpoint.chunks:
            steps, values = curves.setdefault(chunk.key, ([], []))
            steps.extend(chunk.steps.astype(float).tolist())
            values.extend(chunk.values.tolist())
    return curves
