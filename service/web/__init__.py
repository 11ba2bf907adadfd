"""The dashboards on the web: HTML pages and the chart data they draw.

One module per concern, each routed under :data:`router`:

* :mod:`.pages` -- the runs list, a run, a comparison (HTML);
* :mod:`.alerts_page` -- alerts across runs, with acknowledge and silence (HTML);
* :mod:`.projects_page` -- the projects and each project's runs (HTML);
* :mod:`.charts` -- their figures as JSON (``/dashboards/api/...``);
* :mod:`.live` -- the run page's live poll (run, new points, forecast, alerts) in one request;
* :mod:`.reads` -- what a page shows, read from the store and the forecast answer builder
  (never through the app's own REST routes);
* :mod:`.login` -- who is asking (the REST API's principal logic) and the cookie login;
* :mod:`.proxy` -- the pages' scripts' read-only way into the REST API when auth is on;
* :mod:`.static` -- plotly.js and our CSS and JavaScript;
* :mod:`.responses` -- the pages' headers (CSP ...), error pages and the one HTML 404.

The figures themselves are built by :mod:`curvecast.dashboards` (pure: data in, figures out).
"""

from fastapi import APIRouter

from curvecast.service.web import (
    alerts_page,
    charts,
    live,
    login,
    pages,
    projects_page,
    proxy,
    static,
)

router = APIRouter(tags=["dashboards"], include_in_schema=False)
for _module in (pages, alerts_page, projects_page, charts, live, login, proxy, static):
    router.include_router(_module.router)
