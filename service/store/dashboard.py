"""Reads for the dashboards' lists: per run the loss it reached, a small trend (sparkline), its
latest stored fit and its firing alerts, for a whole page of runs in a bounded number of index
probes; the loss a run reached, for the run page; per project its runs by status and firing
alerts; run names for the alerts page.

Why not the metrics API per run: a page lists up to a few hundred runs, each with up to 10^6
points per series. Here each run costs two statements that touch O(``spark_points`` ×
``window``) index entries, whatever the length of the run, and the fits of all runs come in one
statement, as do the firing alerts.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from curvecast.contract import EVAL_LOSS_KEYS, TRAIN_LOSS_KEYS
from curvecast.service.forecast.reached import REACHED_MAX_POINTS, smoothed_reached
from curvecast.service.models import Alert, Project, Run, Series
from curvecast.service.schemas import LossReachedOut, RunOut, RunStatus
from curvecast.service.store import runs as run_store
from curvecast.service.store._common import as_utc
from curvecast.service.store.forecasts import StoredFit, newest_default_fits

#: Series a run's trend and the loss it reached are read from, in order of preference. Unlike the
#: forecast's choice (``contract.loss_key``: evaluation loss first), the densely logged training
#: loss comes first: a trend of 40 window means needs many points, not a handful of evaluations.
TREND_KEYS = (*TRAIN_LOSS_KEYS, *EVAL_LOSS_KEYS)
#: Points averaged at each sparkline sample: the per-step training loss is noisy.
SPARK_WINDOW = 32


@dataclass(frozen=True)
class RunSummary:
    """One row of the runs list."""

    run: RunOut
    loss_key: str | None
    last_loss_step: int | None
    #: The loss reached at ``last_loss_step`` (:func:`reached_now`); NaN when the newest stored
    #: value is not finite.
    last_loss: float | None
    spark_steps: list[float]
    spark_values: list[float]  # window means; NaN where a window has no finite value
    latest_fit: StoredFit | None
    firing_alerts: int


def reached_now(session: Session, sid: int) -> tuple[int, float] | None:
    """The newest step of a series and the loss it reached there, by the forecast's
    ``reached`` rule (:func:`~curvecast.service.forecast.reached.smoothed_reached`: the median
    over the last 1% of the steps, from its latest points): the one "loss reached" the run
    page, the runs list, the demo and REST's ``reached`` all show. One statement, the series'
    latest points by its step index. NaN when the newest value is not finite."""
    rows = session.execute(
        text(
            "SELECT step, value FROM metric_points WHERE series_id = :sid"
            " ORDER BY step DESC LIMIT :n"
        ),
        {"sid": sid, "n": REACHED_MAX_POINTS},
    ).all()
    if not rows:
        return None
    step = int(rows[0][0])
    # A non-finite value may be stored as NULL (a backend without NaN): NaN here.
    latest = [(float(s), math.nan if v is None else float(v)) for s, v in rows]
    value = smoothed_reached(latest, step)
    return step, math.nan if value is None else value


def run_loss_reached(session: Session, run_id: uuid.UUID) -> LossReachedOut | None:
    """The loss a run reached (:class:`~curvecast.service.schemas.LossReachedOut`): its first
    series of :data:`TREND_KEYS` at its newest step (:func:`reached_now`); None before the run
    logged a loss. For a run the caller has read already (the pages read it first, with the
    caller's project check), so it is not checked again here.
    """
    rows = session.execute(
        select(Series.key, Series.id).where(Series.run_id == run_id, Series.key.in_(TREND_KEYS))
    ).all()
    ids = {str(k): int(i) for k, i in rows}
    for key in TREND_KEYS:
        reached = reached_now(session, ids[key]) if key in ids else None
        if reached is not None:
            return LossReachedOut(key=key, step=reached[0], value=reached[1])
    return None


def _first_step(session: Session, sid: int) -> int | None:
    value = session.execute(
        text("SELECT min(step) FROM metric_points WHERE series_id = :sid"), {"sid": sid}
    ).scalar()
    return None if value is None else int(value)


def _spark(session: Session, sid: int, lo: int, hi: int, n: int) -> tuple[list[float], list[float]]:
    """Mean of the points in a short window at ``n`` evenly spaced steps of [lo, hi].

    One statement: a VALUES list of window starts and a correlated range aggregate per start,
    each answered from the (series_id, step) primary key.
    """
    if hi <= lo:
        return [float(lo)], [math.nan]
    span = hi - lo
    width = max(1, min(SPARK_WINDOW, span // max(1, n)))
    starts = sorted({lo + (span - width) * i // max(1, n - 1) for i in range(n)})
    values_sql = ", ".join(f"(:s{i})" for i in range(len(starts)))
    params: dict[str, int] = {f"s{i}": s for i, s in enumerate(starts)}
    params.update(sid=sid, w=width)
    rows = session.execute(
        text(
            f"WITH probes(s) AS (VALUES {values_sql}) SELECT probes.s,"
            " (SELECT avg(p.value) FROM metric_points p WHERE p.series_id = :sid"
            " AND p.step >= probes.s AND p.step < probes.s + :w) FROM probes ORDER BY probes.s"
        ),
        params,
    ).all()
    steps = [float(r[0]) + (width - 1) / 2 for r in rows]
    values = [math.nan if r[1] is None else float(r[1]) for r in rows]
    return steps, values


def firing_alert_counts(session: Session, run_ids: list[uuid.UUID]) -> dict[uuid.UUID, int]:
    """How many alerts of each run are firing (one statement; runs without any are absent)."""
    if not run_ids:
        return {}
    rows = session.execute(
        select(Alert.run_id, func.count())
        .where(Alert.run_id.in_(run_ids), Alert.state == "firing")
        .group_by(Alert.run_id)
    ).all()
    return {run_id: int(count) for run_id, count in rows}


def run_summaries(
    session: Session,
    *,
    project: str | None,
    status: RunStatus | None,
    limit: int,
    page_token: str | None,
    allowed_project: str | None,
    spark_points: int = 40,
) -> tuple[list[RunSummary], str | None]:
    """A page of runs (newest first, as ``GET /api/v1/runs``) with what the runs list shows.

    Returns:
        The summaries and the token of the next page (None on the last page).
    """
    page = run_store.list_runs(
        session,
        project=project,
        status=status,
        limit=limit,
        page_token=page_token,
        allowed_project=allowed_project,
    )
    run_ids = [r.id for r in page.runs]
    series: dict[uuid.UUID, dict[str, int]] = {}
    if run_ids:
        rows = session.execute(
            select(Series.run_id, Series.key, Series.id).where(
                Series.run_id.in_(run_ids), Series.key.in_(TREND_KEYS)
            )
        ).all()
        for run_id, series_key, sid in rows:
            series.setdefault(run_id, {})[str(series_key)] = int(sid)
    fits = newest_default_fits(session, run_ids)
    firing = firing_alert_counts(session, run_ids)
    out = []
    for run in page.runs:
        keys = series.get(run.id, {})
        key: str | None = next((k for k in TREND_KEYS if k in keys), None)
        last: tuple[int, float] | None = None
        first: int | None = None
        spark_steps: list[float] = []
        spark_values: list[float] = []
        if key is not None:
            last = reached_now(session, keys[key])
            first = _first_step(session, keys[key])
            if last is not None and first is not None:
                spark_steps, spark_values = _spark(session, keys[key], first, last[0], spark_points)
        out.append(
            RunSummary(
                run=run,
                loss_key=key,
                last_loss_step=last[0] if last else None,
                last_loss=last[1] if last else None,
                spark_steps=spark_steps,
                spark_values=spark_values,
                latest_fit=fits.get(run.id),
                firing_alerts=firing.get(run.id, 0),
            )
        )
    return out, page.next_page_token


@dataclass(frozen=True)
class ProjectSummary:
    """One row of the projects page."""

    name: str
    #: Runs per status (only statuses that have runs).
    runs_by_status: dict[str, int] = field(default_factory=dict)
    #: When a run of the project last changed (None: no runs).
    last_update: datetime | None = None
    firing_alerts: int = 0

    @property
    def runs(self) -> int:
        """How many runs the project has."""
        return sum(self.runs_by_status.values())


def project_summaries(session: Session, *, allowed_project: str | None,
                      name: str | None = None) -> list[ProjectSummary]:
    """Every project the caller may see (or only ``name``), by name, with its runs counted by
    status, its last update and its firing alerts: two grouped statements."""
    runs = (select(Project.name, Run.status, func.count(Run.id), func.max(Run.updated_at))
            .select_from(Project).outerjoin(Run, Run.project_id == Project.id)
            .group_by(Project.name, Run.status))
    firing = (select(Project.name, func.count(Alert.id)).select_from(Project)
              .join(Alert, Alert.project_id == Project.id).where(Alert.state == "firing")
              .group_by(Project.name))
    for wanted in (allowed_project, name):
        if wanted is not None:
            runs = runs.where(Project.name == wanted)
            firing = firing.where(Project.name == wanted)
    counts: dict[str, dict[str, int]] = {}
    updated: dict[str, datetime | None] = {}
    for project, status, n, last in session.execute(runs).all():
        counts.setdefault(project, {})
        if status is not None and n:
            counts[project][str(status)] = int(n)
        newest = updated.get(project)
        if last is not None and (newest is None or as_utc(last) > newest):
            updated[project] = as_utc(last)  # SQLite hands back naive datetimes
    alerts = {project: int(n) for project, n in session.execute(firing).all()}
    return [ProjectSummary(name=project, runs_by_status=counts[project],
                           last_update=updated.get(project), firing_alerts=alerts.get(project, 0))
            for project in sorted(counts)]


def run_names(session: Session, run_ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
    """The names of ``run_ids`` (one statement; runs that no longer exist are absent)."""
    if not run_ids:
        return {}
    rows = session.execute(select(Run.id, Run.name).where(Run.id.in_(set(run_ids)))).all()
    return {run_id: str(name) for run_id, name in rows}
