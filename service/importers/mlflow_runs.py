"""MLflow runs: a tracking server or a local store, read with MLflow's own client.

``MlflowClient`` lists the experiments (all active ones, or those named), their runs (or the
runs named by id), each run's params (its config: MLflow keeps them as text, read back as the
numbers they spell, :func:`~.batches.typed_param`), status and metric keys, and each metric's
history: its steps, values and timestamps (milliseconds, stored as wall times in seconds). A
metric logged without steps (every point at step 0) gets its points numbered 0, 1, 2, ... in
time order, so that none of them hides another.

The client hands over a metric's whole history at once (the file and SQL stores have no pages),
so an MLflow import holds one series at a time, not one batch.

A local ``mlruns`` directory is read through MLflow's file store, which MLflow keeps in
maintenance mode behind ``MLFLOW_ALLOW_FILE_STORE``: this sets that for its own process when the
source is a directory. ``sqlite:///...``, ``postgresql://...`` and ``http(s)://`` URIs are
passed to the client as they are.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from curvecast.contract import project_for_name
from curvecast.service.importers.batches import (
    Checkpoint,
    Chunk,
    ImportInputError,
    KeyMap,
    SourceRun,
    clean_config,
    typed_param,
)

__all__ = ["MlflowRun", "find_runs", "read_curves", "tracking_uri_for"]

KIND = "mlflow"
_PAGE = 1000
#: MLflow's run statuses, as curvecast records the run's end.
_STATUSES = {
    "FINISHED": ("finished", "imported from MLflow"),
    "FAILED": ("failed", "failed in MLflow; imported"),
    "KILLED": ("failed", "killed in MLflow; imported"),
}
_UNFINISHED = ("finished", "imported from MLflow while it was still running there: import it "
               "again for its newer points")


def tracking_uri_for(source: str) -> str:
    """The client's tracking URI for a source: a directory is a local ``mlruns`` store."""
    if "://" not in source and not source.startswith("file:"):
        path = Path(source).expanduser()
        if not path.is_dir():
            raise ImportInputError(f"{source}: no such directory (an MLflow store: a local "
                                   "mlruns directory, or a tracking URI such as "
                                   "http://host:5000 or sqlite:///mlflow.db)")
        # MLflow refuses its file store unless this is set (a store it no longer develops,
        # which it still reads).
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        return path.resolve().as_uri()
    if source.startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return source


def _redacted(uri: str) -> str:
    """The URI without a password, to record on the run."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass
class MlflowRun:
    """An MLflow run to import, and the client that reads it."""

    run: SourceRun
    mlflow_run_id: str
    metric_keys: list[str]
    client: Any

    def checkpoints(self, keymap: KeyMap, batch_points: int) -> Iterator[Checkpoint]:
        """Each metric's history, ``batch_points`` points a checkpoint."""
        for name in self.metric_keys:
            key = keymap.key(name)
            if key is None:
                yield Checkpoint((), progress=1)
                continue
            history = _history(self.client, self.mlflow_run_id, name)
            n = len(history)
            steps = np.fromiter((m.step for m in history), dtype=np.int64, count=n)
            values = np.fromiter((m.value for m in history), dtype=np.float64, count=n)
            walls = np.fromiter((m.timestamp for m in history), dtype=np.float64, count=n) / 1e3
            del history
            if n > 1 and not steps.any():
                # Logged without steps: number the points in time order.
                order = np.argsort(walls, kind="stable")
                values, walls = values[order], walls[order]
                steps = np.arange(n, dtype=np.int64)
            ok = steps >= 0
            skipped = {} if ok.all() else {key: int((~ok).sum())}
            steps, values, walls = steps[ok], values[ok], walls[ok]
            if not len(steps):
                yield Checkpoint((), progress=1, skipped=skipped)
            for start in range(0, len(steps), batch_points):
                stop = start + batch_points
                last = stop >= len(steps)
                yield Checkpoint(
                    (Chunk(key, steps[start:stop], values[start:stop], walls[start:stop]),),
                    progress=1 if last else 0, skipped=skipped if last else {})


def _history(client: Any, run_id: str, name: str) -> list[Any]:
    from mlflow.exceptions import MlflowException

    try:
        return list(client.get_metric_history(run_id, name))
    except MlflowException as exc:
        raise ImportInputError(f"MLflow run {run_id}, metric {name!r}: {exc.message}") from None


def _client(tracking_uri: str) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def _experiments(client: Any, names: Sequence[str]) -> list[Any]:
    from mlflow.exceptions import MlflowException

    if not names:
        found: list[Any] = []
        token = None
        while True:
            page = client.search_experiments(max_results=_PAGE, page_token=token)
            found.extend(page)
            token = page.token
            if not token:
                return found
    experiments = []
    for name in names:
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            try:
                experiment = client.get_experiment(name)
            except MlflowException:
                experiment = None
        if experiment is None:
            raise ImportInputError(f"MLflow has no experiment named or numbered {name!r}")
        experiments.append(experiment)
    return experiments


def _describe(client: Any, tracking_uri: str, run: Any, experiment_name: str) -> MlflowRun:
    info, data = run.info, run.data
    status, reason = _STATUSES.get(info.status, _UNFINISHED)
    config, warnings = clean_config({k: typed_param(v) for k, v in data.params.items()})
    source = {"kind": KIND, "tracking_uri": _redacted(tracking_uri), "run_id": info.run_id,
              "experiment_id": str(info.experiment_id), "experiment": experiment_name}
    return MlflowRun(
        run=SourceRun(kind=KIND, identity=info.run_id,
                      name=(info.run_name or info.run_id[:8])[:200], config=config,
                      status=status, status_reason=reason, source=source,
                      default_project=project_for_name(experiment_name), warnings=warnings),
        mlflow_run_id=info.run_id, metric_keys=sorted(data.metrics), client=client)


def find_runs(source: str, *, experiments: Sequence[str] = (), run_ids: Sequence[str] = ()
              ) -> list[MlflowRun]:
    """The runs to import: those named by id, else every run of the named experiments, else of
    every active experiment.

    Raises:
        ImportInputError: the store cannot be reached, or an experiment or run is unknown.
    """
    from mlflow.exceptions import MlflowException

    tracking_uri = tracking_uri_for(source)
    client = _client(tracking_uri)
    try:
        if run_ids:
            runs = [client.get_run(run_id) for run_id in run_ids]
            names = {run.info.experiment_id: client.get_experiment(run.info.experiment_id).name
                     for run in runs}
            return [_describe(client, tracking_uri, run, names[run.info.experiment_id])
                    for run in runs]
        found: list[MlflowRun] = []
        for experiment in _experiments(client, experiments):
            token = None
            while True:
                page = client.search_runs([experiment.experiment_id], max_results=_PAGE,
                                          page_token=token)
                found.extend(_describe(client, tracking_uri, run, experiment.name)
                             for run in page)
                token = page.token
                if not token:
                    break
        return found
    except MlflowException as exc:
        raise ImportInputError(f"MLflow ({_redacted(tracking_uri)}): {exc.message}") from None


def read_curves(source: str, run_id: str) -> dict[str, tuple[list[float], list[float]]]:
    """Every metric of one MLflow run, by key, whole (for ``curvecast forecast``)."""
    (run,) = find_runs(source, run_ids=[run_id])
    curves: dict[str, tuple[list[float], list[float]]] = {}
    for checkpoint in run.checkpoints(KeyMap(), batch_points=1 << 62):
        for chunk in checkpoint.chunks:
            steps, values = curves.setdefault(chunk.key, ([], []))
            steps.extend(chunk.steps.astype(float).tolist())
            values.extend(chunk.values.tolist())
    return curves
