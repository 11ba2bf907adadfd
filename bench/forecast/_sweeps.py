"""The sweeps the pruning and P(best) benches replay: groups of runs of one task, so that "which
run ends best" is a meaningful question.

How the groups are formed:

* ``corpus``: the ScheduleFree+ corpus (``bench/data/sfplus_corpus``) by model size and planned
  steps (``d_model x n_layers, steps``): the same model trained with different hyper-parameters
  and optimizers; groups of five runs or more.
* ``charlm a``, ``charlm b``: the two sweeps of ``python -m bench run charlm_sweeps``
  (``bench/data/charlm_sweeps``), by their name's prefix: one task and one number of steps each,
  lr scale, lambda, warmups, width and batch varied, ScheduleFree+ mostly, a few schedule-free
  and constant-LR AdamW runs.
* Public curves (``../shared/curves``, or ``$CURVECAST_CURVES_DIR``), constant-LR and
  schedule-free only:

  - ``mpl constant-LR, 24k`` / ``72k``: the MultiPowerLaw ``constant_*`` runs of one length
    (25M, 100M and 400M models: a model-size sweep). Runs of one size are not grouped: the
    24k and 72k runs of one size have the same constant schedule, so the shorter is the
    longer's prefix and "which wins" is only "which ran longer".
  - ``schaipp 124M constant-LR``: the constant-LR validation curves of the 124M model at
    ``lr`` 1e-4 to 3e-3 (an lr sweep, 50k steps).
  - ``algoperf SF <workload>``: AlgoPerf's schedule-free AdamW validation losses of one
    workload, the v0.5 studies (one hyper-parameter setting, five seeds) and the v0.6 "v2"
    studies (another setting); the workload variants (``*_tanh``, ``*_bn_init``, ...) are other
    models and left out. Runs stop at different steps (target reached or time budget): every
    run of a group is cut at the group's shortest run's last step, so all are compared at the
    same budget. The seed repeats end within noise of each other, on purpose: a sweep where
    nobody can tell the winner.

  A public curve reports at most ``MAX_REPORTS`` evenly spaced points (its last kept): a
  trial reporting every 1-2% of its run, as the corpus's do. It has no recorded config: the
  fit gets ``total_steps`` only and takes the burn-in from the data.

Every group leaves out runs with a non-finite loss (diverged).
"""

from __future__ import annotations

import csv
import gzip
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._corpus import CorpusRun, load, names
from bench._paths import REPO
from bench.optimizer import charlm_sweeps

KEY = "eval_loss"
MIN_CORPUS_GROUP = 5
MIN_PUBLIC_GROUP = 3
MAX_REPORTS = 50
#: The schedule the hook would log for the corpus's decaying AdamW runs.
SCHEDULES = {"adamw_linear": "linear", "adamw_cosine": "cosine"}
CURVES_DIR = Path(os.environ.get("CURVECAST_CURVES_DIR", REPO.parent / "shared" / "curves"))
_ALGOPERF = re.compile(
    r"^algoperf_sf/v0[56]_schedule_free_adamw(?:_v2)?_(?P<workload>\w+?)_pytorch_study_\d+_"
    r"trial_\d+:validation/(?:ctc_)?loss$")
#: AlgoPerf's base workloads (their variants are other models).
ALGOPERF_WORKLOADS = ("criteo1tb", "fastmri", "imagenet_resnet", "imagenet_vit",
                      "librispeech_conformer", "librispeech_deepspeech", "ogbg", "wmt")
_MPL = re.compile(r"^mpl/(?P<size>\d+M)_constant_(?P<length>\d+)$")
_SCHAIPP = re.compile(r"^schaipp/(?:grad_norm__)?stable-124m_nlayers12_nhead12_lr(?P<lr>[\d.]+)_"
                      r"sched_wsd_warmup300_decay_linear_0\.0_iter50000:val$")


@dataclass(frozen=True)
class SweepRun:
    """One recorded run as a trial replays it."""

    name: str
    steps: tuple[int, ...]
    values: tuple[float, ...]
    total_steps: int
    config: dict[str, Any]

    @property
    def final(self) -> float:
        return self.values[-1]


def sweep_run(run: CorpusRun) -> SweepRun | None:
    """The run as a trial, or None when its eval loss has non-finite values (diverged)."""
    if KEY not in run.series:
        return None
    steps, values = run.series[KEY]
    if not all(math.isfinite(v) for v in values):
        return None
    config = dict(run.config)
    if (schedule := SCHEDULES.get(str(config.get("optimizer")))) is not None:
        config["lr_schedule"] = schedule
    return SweepRun(run.name, tuple(int(s) for s in steps), tuple(float(v) for v in values),
                    run.total_steps, config)


def corpus_sweeps(min_group: int = MIN_CORPUS_GROUP) -> dict[str, list[SweepRun]]:
    """The corpus's runs by ``d_model x n_layers, steps``, groups of ``min_group`` or more."""
    groups: dict[str, list[SweepRun]] = {}
    for name in names():
        run = load(name)
        made = sweep_run(run)
        if made is None:
            continue
        c = run.meta["config"]
        groups.setdefault(f"corpus {c['d_model']}x{c['n_layers']}, {made.total_steps:,} steps",
                          []).append(made)
    return {k: v for k, v in groups.items() if len(v) >= min_group}


def charlm(data_dir: Path = charlm_sweeps.DATA_DIR) -> dict[str, list[SweepRun]]:
    """The char-LM sweeps on disk, by their name's prefix (``a-``, ``b-``)."""
    groups: dict[str, list[SweepRun]] = {}
    for name in names(data_dir):
        made = sweep_run(load(name, data_dir))
        if made is not None:
            prefix = name.split("-", 1)[0]
            label = f"charlm {prefix}, {charlm_sweeps.STEPS.get(prefix, made.total_steps):,} steps"
            groups.setdefault(label, []).append(made)
    return groups


def read_curves(curves_dir: Path, wanted: re.Pattern[str]) -> dict[str, tuple[list[int],
                                                                               list[float]]]:
    """The public curves whose name matches one of ``wanted``: ``name -> (steps, losses)``."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    with gzip.open(curves_dir / "all_curves_long.csv.gz", "rt", encoding="utf-8",
                   newline="") as f:
        reader = csv.reader(f)
        next(reader)
        for curve, _schedule, step, loss in reader:
            if wanted.match(curve):
                s, v = out.setdefault(curve, ([], []))
                s.append(int(float(step)))
                v.append(float(loss))
    return out


def thin(steps: list[int], values: list[float], most: int = MAX_REPORTS
         ) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """At most ``most`` evenly spaced points of a curve, its last kept."""
    n = len(steps)
    if n <= most:
        return tuple(steps), tuple(values)
    keep = sorted({round(i * (n - 1) / (most - 1)) for i in range(most)})
    return tuple(steps[i] for i in keep), tuple(values[i] for i in keep)


def _group(label: str, curves: dict[str, tuple[list[int], list[float]]],
           short: dict[str, str]) -> tuple[str, list[SweepRun]] | None:
    """One public group, each curve cut at the group's shortest curve's last step."""
    finite = {k: v for k, v in curves.items() if all(math.isfinite(x) for x in v[1])}
    if len(finite) < MIN_PUBLIC_GROUP:
        return None
    horizon = min(s[-1] for s, _ in finite.values())
    runs = []
    for name, (steps, values) in sorted(finite.items()):
        pairs = [(s, v) for s, v in zip(steps, values, strict=True) if s <= horizon]
        kept_s, kept_v = thin([s for s, _ in pairs], [v for _, v in pairs])
        runs.append(SweepRun(short[name], kept_s, kept_v, horizon, {"total_steps": horizon}))
    return label, runs


def public_sweeps(curves_dir: Path = CURVES_DIR) -> dict[str, list[SweepRun]]:
    """The public constant-LR and schedule-free groups (empty, with a note on stderr, when the
    curves are not there)."""
    if not (curves_dir / "all_curves_long.csv.gz").exists():
        print(f"public curves not found in {curves_dir} (set CURVECAST_CURVES_DIR): left out",
              file=sys.stderr)
        return {}
    curves = read_curves(curves_dir, re.compile("|".join(
        p.pattern for p in (_ALGOPERF, _MPL, _SCHAIPP))))
    made: list[tuple[str, list[SweepRun]] | None] = []
    for length in ("24000", "72000"):
        picked = {k: v for k, v in curves.items()
                  if (m := _MPL.match(k)) and m["length"] == length}
        made.append(_group(f"mpl constant-LR, {int(length) // 1000}k steps", picked,
                           {k: k.removeprefix("mpl/") for k in picked}))
    picked = {k: v for k, v in curves.items() if _SCHAIPP.match(k)}
    made.append(_group("schaipp 124M constant-LR, lr sweep", picked,
                       {k: f"124M lr{m['lr']}" for k in picked if (m := _SCHAIPP.match(k))}))
    for workload in ALGOPERF_WORKLOADS:
        picked = {k: v for k, v in curves.items()
                  if (m := _ALGOPERF.match(k)) and m["workload"] == workload}
        made.append(_group(f"algoperf SF {workload}", picked,
                           {k: k.removeprefix("algoperf_sf/").split(":")[0] for k in picked}))
    return dict(g for g in made if g is not None)


def all_sweeps() -> dict[str, list[SweepRun]]:
    """Every sweep: the corpus's, the char-LM sweeps, the public groups."""
    return {**corpus_sweeps(), **charlm(), **public_sweeps()}
