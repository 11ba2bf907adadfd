"""What every source hands over: runs, their columns of points, and how far they were read.

A source describes each run it found as a :class:`SourceRun` and streams its points as
:class:`Checkpoint` items, each holding at most ``batch_points`` points as per-key numpy
columns (:class:`Chunk`). :class:`ColumnBuffer` gathers points into those columns while a source
reads, and :class:`KeyMap` turns the source's metric names into keys by the contract's rule.
"""

from __future__ import annotations

import fnmatch
import math
import re
import uuid
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import ValidationError

from curvecast.contract import MAX_STEP, key_for_name
from curvecast.service.schemas import RunConfigIn

__all__ = ["DEFAULT_BATCH_POINTS", "Checkpoint", "Chunk", "ColumnBuffer", "ImportInputError",
           "KeyMap", "SourceRun", "clean_config", "typed_param"]

#: Points per checkpoint: what an import holds in memory and stores in one transaction.
DEFAULT_BATCH_POINTS = 50_000
#: The namespace of imported runs' ids: ``uuid5(IMPORT_NAMESPACE, "<kind>:<identity>")``, so the
#: same source run always maps to the same curvecast run and an import run again finds it.
IMPORT_NAMESPACE = uuid.UUID("6f1c2d0e-8a47-5b4e-9d3a-c0ffee5eed55")


class ImportInputError(ValueError):
    """A source that cannot be read as asked; the message says what to fix."""


@dataclass(frozen=True)
class Chunk:
    """Points of one metric key: steps (int64), values (float64; NaN is a logged NaN) and wall
    times (float64 seconds since the epoch, NaN where the source has none), or no wall times."""

    key: str
    steps: np.ndarray
    values: np.ndarray
    wall_times: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.steps)


@dataclass(frozen=True)
class Checkpoint:
    """A unit of work: chunks to store together, and what to record once they are stored.

    Attributes:
        chunks: the points, at most a batch of them in all.
        position: merged into the run's recorded source once the chunks are stored (a
            TensorBoard file's offset read up to); empty when the source has no positions.
        progress: how far this moves the import's progress bar (bytes or series).
        skipped: points the source held that are not imported (a step outside
            [0, 2**62]), by key.
    """

    chunks: tuple[Chunk, ...]
    position: Mapping[str, Any] = field(default_factory=dict)
    progress: int = 0
    skipped: Mapping[str, int] = field(default_factory=dict)

    @property
    def n_points(self) -> int:
        """Points in all chunks."""
        return sum(len(chunk) for chunk in self.chunks)

    def columns(self) -> list[tuple[np.ndarray, np.ndarray | None, dict[str, np.ndarray]]]:
        """The chunks as columnar batches: chunks at the same steps (tags logged together)
        share one ``(steps, wall_times, {key: values})``, so they are stored in one call."""
        out: list[tuple[np.ndarray, np.ndarray | None, dict[str, np.ndarray]]] = []
        for chunk in self.chunks:
            chunk_walls = chunk.wall_times
            for steps, walls, values in out:
                same_walls = (walls is None and chunk_walls is None) or (
                    walls is not None and chunk_walls is not None
                    and np.array_equal(walls, chunk_walls, equal_nan=True))
                if same_walls and len(steps) == len(chunk.steps) and np.array_equal(
                        steps, chunk.steps):
                    values[chunk.key] = chunk.values
                    break
            else:
                out.append((chunk.steps, chunk.wall_times, {chunk.key: chunk.values}))
        return out


@dataclass
class SourceRun:
    """A run found in a source, before any of its points are read.

    Attributes:
        kind: ``tensorboard``, ``mlflow`` or ``wandb``.
        identity: the source's own identity of the run (an event directory's absolute path, an
            MLflow run id, a W&B run path or history file's absolute path).
        name: the run's display name.
        config: the run's config (MLflow params, a W&B config), already checked.
        status: the final status to record (``finished`` or ``failed``).
        status_reason: why (e.g. "imported from TensorBoard").
        source: what is recorded on the run as its source (kind, path or URI, ids).
        default_project: the project the source suggests (an MLflow experiment's name).
        warnings: what was left out of the config, for the import's report.
    """

    kind: str
    identity: str
    name: str
    config: dict[str, Any] = field(default_factory=dict)
    status: str = "finished"
    status_reason: str | None = None
    source: dict[str, Any] = field(default_factory=dict)
    default_project: str | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def run_id(self) -> uuid.UUID:
        """The curvecast run this source run is imported into: the same on every import."""
        return uuid.uuid5(IMPORT_NAMESPACE, f"{self.kind}:{self.identity}")


class KeyMap:
    """Metric names of a source run to curvecast keys (:func:`curvecast.contract.key_for_name`),
    keeping only the names that match ``include`` (shell patterns; none given: every name).

    Two names that map to one key (``train loss`` and ``train_loss``) would mix two series:
    :meth:`key` refuses the second with an error that names both.
    """

    def __init__(self, include: Sequence[str] = ()) -> None:
        self._include = tuple(include)
        self._keys: dict[str, str | None] = {}
        self._names: dict[str, str] = {}
        #: Names left out because nothing of them is a valid key.
        self.unmappable: list[str] = []

    def key(self, name: str) -> str | None:
        """The key ``name`` is stored under; None when it is not imported."""
        try:
            return self._keys[name]
        except KeyError:
            pass
        key: str | None = None
        if not self._include or any(fnmatch.fnmatchcase(name, p) for p in self._include):
            key = key_for_name(name)
            if key is None:
                self.unmappable.append(name)
            elif (other := self._names.setdefault(key, name)) != name:
                raise ImportInputError(
                    f"the metrics {other!r} and {name!r} both map to the key {key!r}; import "
                    "one of them (--tags) or the other")
        self._keys[name] = key
        return key


class ColumnBuffer:
    """Points gathered per key while a source reads, until they are handed over as chunks."""

    def __init__(self) -> None:
        self._columns: dict[str, tuple[array[int], array[float], array[float]]] = {}
        self.n_points = 0

    def column(self, key: str) -> tuple[array[int], array[float], array[float]]:
        """The key's (steps, values, wall times) arrays, to append to (a reader's hot loop
        appends itself and adds to :attr:`n_points`)."""
        cols = self._columns.get(key)
        if cols is None:
            cols = self._columns[key] = (array("q"), array("d"), array("d"))
        return cols

    def add(self, key: str, steps: Iterable[int], values: Iterable[float],
            wall_times: Iterable[float]) -> None:
        """Append points of one key (steps, values and wall times of the same length)."""
        s, v, w = self.column(key)
        before = len(s)
        s.extend(steps)
        v.extend(values)
        w.extend(wall_times)
        self.n_points += len(s) - before

    def take(self, *, position: Mapping[str, Any] | None = None, progress: int = 0
             ) -> Checkpoint:
        """Everything gathered, as one checkpoint; the buffer is empty afterwards."""
        chunks = []
        skipped: dict[str, int] = {}
        for key, (s, v, w) in self._columns.items():
            if not s:
                continue
            steps = np.frombuffer(s, dtype=np.int64).copy()
            values = np.frombuffer(v, dtype=np.float64).copy()
            walls = np.frombuffer(w, dtype=np.float64).copy()
            ok = (steps >= 0) & (steps <= MAX_STEP)
            if not ok.all():
                skipped[key] = int((~ok).sum())
                steps, values, walls = steps[ok], values[ok], walls[ok]
            if len(steps):
                chunks.append(Chunk(key, steps, values,
                                    None if np.isnan(walls).all() else walls))
        self._columns.clear()
        self.n_points = 0
        return Checkpoint(tuple(chunks), dict(position or {}), progress, skipped)


_INT = re.compile(r"[+-]?\d+")


def typed_param(text: str) -> Any:
    """A parameter as text (MLflow stores them so) read back as the number it spells, if any:
    ``"1000"`` -> 1000, ``"0.1"`` -> 0.1, ``"true"``/``"false"`` -> booleans; anything else
    (and NaN or infinities, which a config cannot hold) stays text."""
    stripped = text.strip()
    if _INT.fullmatch(stripped):
        return int(stripped)
    low = stripped.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        number = float(stripped)
    except ValueError:
        return text
    return number if math.isfinite(number) else text


def clean_config(raw: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A source's config as the service would store it (``RunConfigIn``), and what was left out.

    A key the service reads with a type (``total_steps``, ``c_warmup``, ...) whose value does
    not have that type is left out with a warning rather than failing the run's import; other
    keys are kept as they are (values that are not plain JSON are kept as text).
    """
    config = {str(k): _json_value(v) for k, v in raw.items()}
    warnings: list[str] = []
    for _ in range(len(config) + 1):
        try:
            checked = RunConfigIn.model_validate(config)
        except ValidationError as exc:
            bad = {str(err["loc"][0]) for err in exc.errors() if err["loc"]}
            if not bad & config.keys():
                raise ImportInputError(f"config: {exc.errors()[0]['msg']}") from None
            for key in sorted(bad & config.keys()):
                warnings.append(f"config key {key!r} left out: {config.pop(key)!r} is not what "
                                "curvecast reads there")
            continue
        return checked.model_dump(exclude_none=True), warnings
    raise AssertionError("unreachable")  # pragma: no cover


def _json_value(value: Any, depth: int = 0) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping) and depth < 16:
        return {str(k): _json_value(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple) and depth < 16:
        return [_json_value(v, depth + 1) for v in value]
    return str(value)


