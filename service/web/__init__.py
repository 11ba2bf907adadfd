"""The dashboards on the web: HTML pages and the chart data they draw.

One module per concern, each routed under :data:`router`:

* :mod:`.pages` -- the runs list, a run, a comparison (HTML);
* :mod:`.charts` -- their figures as JSON (``/dashboards/api/...``);
* :mod:`.live` -- the run page's live poll (run, new points, forecast, alerts) in one request;
* :mod:`.reads` -- what a page shows, read from the store and the forecast answer builder
  (never through the app's own REST routes);
* :mod:`.login` -- who is asking (the REST API's principal logic) and the cookie login;
* :mod:`.proxy` -- the pages' scripts' read-only way into the REST API when auth is on;
* :mod:`.static` -- plotly.js and our CSS and JavaScript;
* :mod:`.responses` -- the pages' headers (CSP ...) and error pages.

The figures themselves are built by :mod:`curvecast.dashboards` (pure: data in, figures out).
"""

from fastapi import APIRouter

from curvecast.service.web import charts, live, login, pages, proxy, static

router = APIRouter(tags=["dashboards"], include_in_schema=False)
for _module in (pages, charts, live, login, proxy, static):
    router.include_router(_module.router)
