"""Chart data: the run page's and the compare page's Plotly figures as JSON.

The pages load these once (declared with ``<link rel="preload">`` so they are asked for while
plotly.js loads), after a zoom (``start``/``end``: the visible steps, re-read at full
resolution once they fit), and when a new fit arrives. Errors answer as the REST API's do.
"""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from curvecast.contract import MAX_STEP
from curvecast.dashboards import views
from curvecast.service.deps import SessionDep
from curvecast.service.errors import InvalidInput
from curvecast.service.queries import SeriesKey
from curvecast.service.routing import OneHopRoute
from curvecast.service.web import reads
from curvecast.service.web.login import PagePrincipal
from curvecast.service.web.responses import chart_json

router = APIRouter(route_class=OneHopRoute)

Step = Annotated[int | None, Query(ge=0, le=MAX_STEP)]


def _span(start: int | None, end: int | None) -> tuple[tuple[int | None, int | None],
                                                       list[float] | None]:
    """The steps to read and the x range to show after a zoom (None, None: everything)."""
    if start is None and end is None:
        return (None, None), None
    lo = max(0, start or 0)
    hi = end if end is not None else MAX_STEP
    if hi < lo:
        lo, hi = hi, lo
    return (lo, hi), [float(lo), float(hi)]


@router.get("/dashboards/api/runs/{run_id}/figures")
def run_figures(
    run_id: uuid.UUID,
    session: SessionDep,
    principal: PagePrincipal,
    charts: Annotated[str | None, Query(description="Comma-separated chart ids")] = None,
    key: SeriesKey = None,
    start: Step = None,
    end: Step = None,
) -> Response:
    """The run page's figures (all, or ``charts``), optionally for the steps [start, end],
    with the headline numbers and the live-update cursor; the forecast of the series ``key``
    (default: the run's default series)."""
    wanted = [c for c in (charts or "").split(",") if c] or list(views.RUN_CHARTS)
    unknown = [c for c in wanted if c not in views.RUN_CHARTS]
    if unknown:
        raise InvalidInput(f"charts: unknown {unknown[0]!r}; choose from "
                           f"{', '.join(views.RUN_CHARTS)}")
    span, x_range = _span(start, end)
    run = reads.get_run(session, principal, run_id)
    page = reads.run_page(session, principal, run, wanted, span, key)
    return chart_json(views.run_payload(page, wanted, x_range))


@router.get("/dashboards/api/compare")
def compare_figures(
    session: SessionDep,
    principal: PagePrincipal,
    runs: Annotated[str, Query(max_length=2000)],
    horizon: Annotated[int | None, Query(ge=1, le=MAX_STEP)] = None,
    key: SeriesKey = None,
    start: Step = None,
    end: Step = None,
) -> Response:
    """The compare page's figures: losses and forecasts overlaid, the ranking and verdict
    (on the series ``key``, else on one every run has a forecast on)."""
    span, x_range = _span(start, end)
    items, common = reads.compare_runs(session, principal, reads.parse_run_ids(runs), horizon,
                                       span, key)
    return chart_json(views.compare_payload(items, common, x_range))
