"""Pure figure builders: data shaped like the REST API's answers in, a Plotly figure out (as
plain dictionaries, :class:`FigureSpec`; ``.figure()`` gives the Plotly object).

No HTTP, no database: the web pages, the tests and the benchmark call these with dictionaries
(or the parsed dataclasses of :mod:`curvecast.dashboards.data`). One module per kind of chart:
:mod:`.loss` (loss and forecast, forecast evolution), :mod:`.telemetry` (optimizer statistics),
:mod:`.compare` (runs overlaid, ranking); :mod:`.base` holds what they share. Conventions every
builder follows, because the page's JavaScript relies on them:

* each trace that draws a metric carries ``meta = {"key": <metric key>, "role": ...}`` with role
  ``"last"`` (the line through each bucket's last point, or the raw points), ``"min"``/``"max"``
  (the band between each bucket's extremes, so a one-step spike inside a bucket stays
  visible); live updates append new points to these traces;
* derived traces carry ``meta = {"role": ...}`` (``"fit"``, ``"forecast"``, ``"band_lo"``,
  ``"band_hi"``, ``"f_star"``, ``"prediction"``, ``"ratio"``, ``"guide"``, ...);
* ``layout.meta`` names the chart and the keys it shows; ``layout.uirevision`` is constant so a
  redraw with fresh data keeps the user's zoom;
* every string that came from a user (run names, keys, alert text) is escaped for Plotly's
  pseudo-HTML with :func:`dashboards.fmt.esc`.
"""

from curvecast.dashboards.figures.compare import (
    CompareEntry,
    Ranking,
    compare_figure,
    ended_before,
    rank_forecasts,
    ranking_figure,
    run_label,
    shared_names,
)
from curvecast.dashboards.figures.loss import evolution_figure, loss_figure
from curvecast.dashboards.figures.spec import FigureSpec
from curvecast.dashboards.figures.telemetry import (
    Line,
    averaging_figure,
    gradient_figure,
    norms_figure,
    step_size_figure,
    telemetry_figure,
)

__all__ = [
    "CompareEntry",
    "FigureSpec",
    "Line",
    "Ranking",
    "averaging_figure",
    "compare_figure",
    "ended_before",
    "evolution_figure",
    "gradient_figure",
    "loss_figure",
    "norms_figure",
    "rank_forecasts",
    "ranking_figure",
    "run_label",
    "shared_names",
    "step_size_figure",
    "telemetry_figure",
]
