"""Reading the runs we trained: the ScheduleFree+ corpus (``bench/data/sfplus_corpus``, made by
``python -m bench run sfplus_corpus``) one run at a time (:func:`load`), and every recorded run with
an eval loss as the forecast benches see them (:func:`load_runs`: the corpus plus the 3,000-step
training-quality runs of ``python -m bench run train_quality``)."""

from __future__ import annotations

import csv
import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bench.optimizer.sfplus_corpus import DATA_DIR


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


@dataclass(frozen=True)
class BenchRun:
    """One recorded run: its eval and training loss, its config, and what kind of schedule."""

    name: str
    kind: str  # "sfplus", "sf_adamw", "adamw_const" (anytime) or "decay"
    eval_steps: np.ndarray
    eval_values: np.ndarray
    train_steps: np.ndarray
    train_values: np.ndarray
    config: dict[str, Any]
    #: The learning rate as ``Monitor.watch()`` logs it for optimizers other than ScheduleFree+
    #: (``opt/lr``): recorded, or for runs recorded before the corpus logged it, recomputed from
    #: the run's schedule (the trainers set it exactly). ``None`` for ScheduleFree+ runs.
    lr: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def total(self) -> float:
        return float(self.eval_steps[-1])

    @property
    def final(self) -> float:
        return float(self.eval_values[-1])

    @property
    def anytime(self) -> bool:
        return self.kind != "decay"

    def upto(self, k: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Eval and training points with ``step <= k * total``."""
        cut = k * self.total
        me, mt = self.eval_steps <= cut, self.train_steps <= cut
        return (self.eval_steps[me], self.eval_values[me], self.train_steps[mt],
                self.train_values[mt])


def _kind(optimizer: str) -> str:
    if optimizer in ("sfplus", "sf_adamw", "adamw_const"):
        return optimizer
    return "decay"


def load_runs() -> list[BenchRun]:
    """Both recorded corpora; runs that diverged (a non-finite eval loss) are left out."""
    from bench.optimizer import sfplus_corpus
    from bench.optimizer import train_quality as tq

    runs = []
    for name in names():
        r = load(name)
        if "eval_loss" not in r.series or "loss" not in r.series:
            continue
        et, ev = r.series["eval_loss"]
        tt, tv = r.series["loss"]
        if not np.all(np.isfinite(ev)):
            continue
        lr = None
        if "opt/lr" in r.series:
            lr = (r.series["opt/lr"][0].astype(float), r.series["opt/lr"][1])
        elif r.optimizer != "sfplus":
            spec = sfplus_corpus.Spec(**r.meta["spec"])
            factor = sfplus_corpus._schedule(spec)  # what the trainer set before each step
            lr = (tt.astype(float), np.array([spec.lr * factor(int(t)) for t in tt]))
        runs.append(BenchRun(name, _kind(r.optimizer), et.astype(float), ev, tt.astype(float),
                             tv, r.config, lr))
    defaults = tq.sfplus_defaults()
    for spec in tq.planned():
        path = tq.DATA_DIR / f"{spec.name}.csv.gz"
        if not path.exists():
            continue
        rows: dict[str, tuple[list[float], list[float]]] = {"train": ([], []), "val": ([], [])}
        with gzip.open(path, "rt", encoding="ascii", newline="") as f:
            reader = csv.reader(f)
            next(reader)
            for split, step, value in reader:
                if split in rows:
                    rows[split][0].append(float(step))
                    rows[split][1].append(float(value))
        options = dict(spec.options)
        config: dict[str, Any] = {"total_steps": int(rows["val"][0][-1])}
        if spec.kind == "sfplus":
            warmup = int(options.get("warmup_steps", defaults["warmup_steps"]))
            config.update(warmup_steps=warmup, c_warmup=2 * warmup)  # resolve_c_warmup's rule
        train_steps = np.asarray(rows["train"][0])
        lr = None
        if spec.kind != "sfplus":  # LambdaLR: the factor after t - 1 completed steps
            factor = tq._adamw_factor(spec, tq.Setup())
            lr = (train_steps, np.array([options["lr"] * factor(int(t) - 1)
                                         for t in train_steps]))
        runs.append(BenchRun(f"train_quality_3k/{spec.name}",
                             "sfplus" if spec.kind == "sfplus" else "decay",
                             np.asarray(rows["val"][0]), np.asarray(rows["val"][1]),
                             train_steps, np.asarray(rows["train"][1]), config, lr))
    return runs
