"""Reading the ScheduleFree+ corpus (``bench/data/sfplus_corpus``, made by
``python -m bench.sfplus_corpus``): one run's series and its summary."""

from __future__ import annotations

import csv
import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bench.sfplus_corpus import DATA_DIR


@dataclass(frozen=True)
class CorpusRun:
    """A recorded run: per key ascending ``steps`` and ``values``; ``meta`` is its JSON."""

    name: str
    series: dict[str, tuple[NDArray[np.int64], NDArray[np.float64]]]
    meta: dict[str, Any]

    @property
    def config(self) -> dict[str, Any]:
        """The run config as the hook would have logged it (``total_steps``, warmups, λ, ...)."""
        return {k: v for k, v in self.meta["config"].items() if v is not None}

    @property
    def total_steps(self) -> int:
        return int(self.meta["config"]["total_steps"])

    @property
    def optimizer(self) -> str:
        return str(self.meta["config"]["optimizer"])


def names(data_dir: Path = DATA_DIR) -> list[str]:
    """The runs on disk (complete ones: both files), sorted."""
    return sorted(
        p.name.removesuffix(".json")
        for p in data_dir.glob("*.json")
        if (data_dir / p.name.replace(".json", ".csv.gz")).exists()
    )


def load(name: str, data_dir: Path = DATA_DIR) -> CorpusRun:
    """One run's series and summary."""
    rows: dict[str, tuple[list[int], list[float]]] = {}
    with gzip.open(data_dir / f"{name}.csv.gz", "rt", encoding="ascii", newline="") as f:
        reader = csv.reader(f)
        next(reader)
        for key, step, value in reader:
            s, v = rows.setdefault(key, ([], []))
            s.append(int(step))
            v.append(float(value))
    series = {
        k: (np.asarray(s, dtype=np.int64), np.asarray(v, dtype=np.float64))
        for k, (s, v) in rows.items()
    }
    meta = json.loads((data_dir / f"{name}.json").read_text())
    return CorpusRun(name, series, meta)
