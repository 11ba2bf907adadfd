"""One "final training loss": the loss a run reached, by the forecast core's ``reached`` rule (the
median of the points over the last 1% of the steps), named "train loss reached" and the same
number on the run page's card (first draw and live poll), the runs list, the compare page, REST's
``prediction.reached`` and the demo's terminal. A finished run showed three: its last point on
the card (1.233), a mean of 50 steps in the terminal (1.193), REST's reached (1.166)."""

from __future__ import annotations

import math
import re
import uuid
from pathlib import Path

import httpx
import numpy as np

from curvecast.dashboards import fmt
from curvecast.service.config import Settings
from curvecast.service.demo_progress import loss_reached_of
from curvecast.service.migrate import upgrade
from tests.support import thread_server, wait_for

TOTAL = 2000


def test_the_card_the_runs_list_rest_and_the_demo_show_one_loss_reached(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'reached.db'}"
    upgrade(db)
    rng = np.random.default_rng(3)
    steps = list(range(1, TOTAL + 1))
    # A noisy training loss whose last point is well off its median (a lucky last batch).
    loss = [2.0 + 3.0 / math.sqrt(s + 50) + float(rng.normal(0, 0.05)) for s in steps]
    loss[-1] = 1.9
    with thread_server(Settings(database_url=db, worker_interval_s=0.05,
                                refit_min_interval_s=0)) as url:
        run_id = str(uuid.uuid4())
        base = f"{url}/api/v1/runs/{run_id}"
        httpx.put(base, json={"project": "reached", "name": "noisy",
                              "config": {"total_steps": TOTAL}}).raise_for_status()
        httpx.post(f"{base}/metrics", json={"steps": steps, "values": {"loss": loss}}
                   ).raise_for_status()
        httpx.patch(base, json={"status": "finished"}).raise_for_status()
        forecast = wait_for(
            lambda: (f := httpx.get(f"{base}/forecast").json()).get("fitted_upto_step") == TOTAL
            and f, 60, "the last fit")
        rest = forecast["prediction"]["reached"]
        assert rest is not None and abs(rest - loss[-1]) > 0.05  # not the last point

        live = httpx.get(f"{url}/dashboards/api/runs/{run_id}/live").json()["loss_reached"]
        assert live == {"key": "loss", "step": TOTAL, "value": rest}
        cards = httpx.get(f"{url}/dashboards/api/runs/{run_id}/figures").json()["kpis"]
        card = next(k for k in cards if k["id"] == "last_loss")
        assert (card["label"], card["value"]) == ("Train loss reached", fmt.loss(rest))
        page = httpx.get(f"{url}/", params={"project": "reached"}).text
        assert "Train loss reached</button>" in page
        # The row's cells: Step, then Train loss reached.
        cell = re.findall(r'<td class="num" data-sort="([^"]*)">([^<]*)<', page)[1]
        assert float(cell[0]) == rest and cell[1] == fmt.loss(rest)
        # The compare page's table: the same number under the same name.
        compared = httpx.get(f"{url}/dashboards/api/compare", params={"runs": run_id}).json()
        assert compared["rows"][0]["loss_reached"] == fmt.loss(rest)
        assert "Train loss reached</th>" in httpx.get(f"{url}/compare",
                                                     params={"runs": run_id}).text
        # The demo's terminal reads the points over REST and applies the same rule.
        points = httpx.get(f"{base}/metrics", params={"keys": "loss"}).json()["series"][0]
        assert loss_reached_of(points["steps"], points["values"]) == rest
