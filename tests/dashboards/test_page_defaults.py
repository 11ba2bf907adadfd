"""What the pages choose for the reader, without HTTP: the compare page's default horizon and
its verdict for one run, the loss chart's y range, a sparse series' markers, and the alerts
and projects pages' rows."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest

from curvecast.dashboards import figures, lists, views
from curvecast.dashboards.figures import base as figure_base
from tests.dashboards.test_figures import BAND, CONFIG, FORECAST, downsampled, entry, raw


@pytest.fixture(autouse=True)
def _validate_figures() -> Iterator[None]:
    figure_base.VALIDATE = True
    yield
    figure_base.VALIDATE = False


def run(status: str, last: int | None, total: int | None = None) -> dict[str, Any]:
    config = {"total_steps": total} if total is not None else {}
    return {"id": status, "status": status, "last_step": last, "config": config}


def test_the_default_horizon_is_one_every_run_can_be_compared_at() -> None:
    finished = [run("finished", 500, 500)] * 3
    # Three finished 500-step runs and one that failed at 300 of 3,000
    # (the default was 3,000, where none of them could be compared).
    assert views.common_horizon([*finished, run("failed", 300, 3000)]) == 500
    # A run still going is compared at its planned end, and no further than the end of a
    # run that finished.
    assert views.common_horizon([run("running", 200, 10_000), run("running", 900, 20_000)]) \
        == 10_000
    assert views.common_horizon([run("running", 200, 10_000), run("finished", 800, 800)]) == 800
    # No planned end: the runs' own last steps, the furthest (as the contract's horizon).
    assert views.common_horizon([run("running", 300), run("running", 700)]) == 700
    assert views.common_horizon([run("running", 300), run("running", 700, 5000)]) == 5000
    # Only runs that broke off (or a status this page does not know, e.g. lost): the earliest
    # end, where every one of them has a loss.
    assert views.common_horizon([run("failed", 300, 3000), run("crashed", 120, 3000),
                                 run("lost", 400, 3000)]) == 120
    assert views.common_horizon([run("running", None, None)]) is None
    assert views.common_horizon(finished, requested=50) == 50


def test_a_run_alone_is_not_called_best() -> None:
    alone = figures.rank_forecasts([entry("a", 2.5, 2.45, 2.55)], 20_000)
    assert alone.best is None and "Add a run to compare it with" in alone.message
    ranking = figures.ranking_figure([entry("a", 2.5, 2.45, 2.55)], alone).figure()
    assert list(ranking.data[0].y) == ["a"]  # no star


def test_an_empty_ranking_draws_no_axes() -> None:
    """Nothing to rank: a note, not Plotly's empty axes from -1 to 6."""
    ended = views.CompareRun(
        run={"id": "x", "name": "x", "status": "failed", "last_step": 300},
        metrics=[raw("loss", [0, 100, 300], [5.0, 4.0, 3.5])], forecast=FORECAST, band=BAND,
        at_horizon=None)
    entries = views.compare_entries([ended])
    ranking = figures.rank_forecasts(entries, 3000)
    fig = figures.ranking_figure(entries, ranking).figure()
    assert fig.layout.xaxis.visible is False and fig.layout.yaxis.visible is False
    assert any("no run has a loss or a forecast" in a.text for a in fig.layout.annotations)


def test_the_loss_chart_shows_where_the_loss_started() -> None:
    """The y range takes in the first steps: it began after the burn-in (and 5% of the run),
    so a curve's fall from its first loss was above the chart."""
    steps = list(range(0, 501, 5))
    values = [60 / np.sqrt(s + 30.0) + 2.0 for s in steps]  # 12.95 at step 0, 4.6 at 500
    fig = figures.loss_figure(train=raw("loss", steps, values),
                              config={"c_warmup": 100, "total_steps": 500}, horizon=500)
    lo, hi = fig.layout["yaxis"]["range"]
    assert lo < min(values) and hi > values[0]
    # Downsampled: the first bucket's maximum is the first step's loss.
    series = downsampled("loss")
    series["max"][0] = 30.0
    fig = figures.loss_figure(train=series, forecast=FORECAST, band=BAND, config=CONFIG,
                              horizon=20_000)
    assert fig.layout["yaxis"]["range"][1] > 30.0
    # A lone spike later on does not stretch it (the min-max band still shows it).
    long_steps = list(range(1001))
    spiky = [60 / np.sqrt(s + 30.0) + 2.0 for s in long_steps]
    spiky[500] = 400.0
    fig = figures.loss_figure(train=raw("loss", long_steps, spiky), horizon=1000)
    assert fig.layout["yaxis"]["range"][1] < 20


def test_a_series_with_few_points_is_drawn_with_markers() -> None:
    """One weight-norm point drew an empty chart (a line needs two points)."""
    one = {"sfplus/x_l2": raw("sfplus/x_l2", [0], [40.0]),
           "sfplus/z_l2": raw("sfplus/z_l2", [0], [41.0])}
    fig = figures.norms_figure(one, prefix="sfplus/").figure()
    lines = [t for t in fig.data if (t.meta or {}).get("role") == "last" and len(t.x)]
    assert lines and all("markers" in t.mode and t.meta["sparse"] for t in lines)
    many = {"sfplus/x_l2": raw("sfplus/x_l2", list(range(0, 1000, 10)), [40.0] * 100)}
    (line,) = [t for t in figures.norms_figure(many, prefix="sfplus/").figure().data
               if (t.meta or {}).get("key") == "sfplus/x_l2"]
    assert line.mode == "lines" and "sparse" not in line.meta


NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def alert(state: str, **fields: Any) -> dict[str, Any]:
    return {"id": 1, "run_id": "0f5c3d7e-0000-0000-0000-000000000000", "project": "p",
            "rule": "grad_l1_drift", "state": state, "severity": "warning", "summary": "s",
            "started_at": "2026-11-28T11:57:00Z", "acknowledged_at": None,
            "silenced_until": None, "step": 1234, "fired_step": 1000, "since_step": 900,
            **fields}


def test_alert_rows_show_rests_step_and_readable_times() -> None:
    rows = lists.alert_rows(
        [alert("resolved"), alert("firing", acknowledged_at="2026-11-28T11:58:00Z",
                                  silenced_until="2026-11-28T13:00:00Z"),
         alert("pending", silenced_until="2026-11-28T11:00:00Z", run_id="other")],
        {"0f5c3d7e-0000-0000-0000-000000000000": "lm"}, NOW)
    assert [r["state"] for r in rows] == ["firing", "pending", "resolved"]
    firing = rows[0]
    assert firing["step"] == "1,234"  # REST's step, not fired_step or since_step
    assert firing["started"] == "2026-11-28 11:57:00 UTC" and firing["started_ago"] == (
        "3 min ago")
    assert firing["acknowledged"] == "2026-11-28 11:58:00 UTC"
    assert firing["silenced_until"] == "2026-11-28 13:00:00 UTC" and firing["open"]
    assert rows[1]["silenced_until"] == "" and rows[1]["run_name"] == "other"  # silence over
    assert not rows[2]["open"]
    assert lists.alert_counts([alert("firing"), alert("firing"), alert("resolved")]) == {
        "firing": 2, "pending": 0, "resolved": 1}


def test_project_rows() -> None:
    (row, empty) = lists.project_rows(
        [{"name": "lm", "runs_by_status": {"finished": 3, "running": 1, "failed": 1},
          "last_update": datetime(2026, 11, 28, 11, 0, tzinfo=UTC), "firing_alerts": 2},
         {"name": "new", "runs_by_status": {}, "last_update": None, "firing_alerts": 0}], NOW)
    assert row["runs"] == 5 and row["running"] == 1 and row["firing"] == 2
    assert row["statuses"] == "1 running, 3 finished, 1 failed"
    assert row["updated"] == "60 min ago" and row["updated_at"] == "2026-11-28 11:00:00 UTC"
    assert empty["statuses"] == "no runs yet" and empty["updated"] == "—"
