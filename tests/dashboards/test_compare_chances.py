"""The compare page shows each run's P(best) beside it: the decision core's chance at the step
the page compares at, the same the ranking API and the leaderboard give. Rendered by the real
app with its worker, on each backend."""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from curvecast.dashboards import fmt
from curvecast.service.migrate import upgrade
from tests.dashboards.conftest import TOTAL, Tab, app_server, live_settings, make_run, new_app

Clients = Callable[[str], httpx.Client]


@pytest.fixture(scope="module")
def dash(database_url: str) -> Iterator[str]:
    """A live service (worker on) on each backend."""
    with app_server(new_app(live_settings(database_url))) as url:
        yield url


def shown(page: str) -> dict[str, str]:
    """The P(best) the page shows beside each run, by run id."""
    found = re.findall(r'data-p-best="([0-9a-f-]+)"[^>]*>P\(best\) ([^<]+)</span>', page)
    return {run: html.unescape(p) for run, p in found}


def test_the_compare_page_shows_each_runs_chance_of_ending_best(
        dash: str, project: str, client_for: Clients) -> None:
    client = client_for(dash)
    low = make_run(client, project, name="low", steps=3000, curve=(60.0, 300.0, 1.8))
    high = make_run(client, project, name="high", steps=3000, curve=(60.0, 300.0, 2.6))
    horizon = 20_000
    page = client.get("/compare", params={"runs": f"{low},{high}", "horizon": horizon})
    assert page.status_code == 200
    ranking = client.get(f"/api/v1/projects/{project}/ranking",
                         params={"horizon": horizon}).json()
    expected = {r["run_id"]: fmt.chance(r["p_best"]) for r in ranking["runs"]}
    assert shown(page.text) == expected
    assert expected[str(low)] not in ("—", "<0.1%")  # the lower curve is the likely best
    assert f"chance of ending best (lowest loss) at step {horizon}" in page.text

    # One run alone is never "best": the chip says so instead of a number.
    alone = client.get("/compare", params={"runs": str(low), "horizon": horizon}).text
    assert shown(alone) == {str(low): "—"}
    assert "the only run that can be compared" in html.unescape(alone)


@pytest.mark.browser
def test_the_compare_page_in_a_browser_shows_p_best_at_its_default_horizon(
        dash: str, project: str, client_for: Clients, tab: Tab) -> None:
    """Opened with no horizon, the page compares at its default (the furthest step every run
    can be compared at: here both runs' planned end) and shows beside each run the chance the
    ranking API gives at that step; the compare chart is drawn out to it."""
    client = client_for(dash)
    low = make_run(client, project, name="low", steps=3000, curve=(60.0, 300.0, 1.8))
    high = make_run(client, project, name="high", steps=3000, curve=(60.0, 300.0, 2.6))
    tab.page.goto(f"{dash}/compare?runs={low},{high}")
    tab.wait_for_charts(("compare", "ranking"))
    horizon_box = tab.page.locator("input[name=horizon]")
    assert horizon_box.input_value() == ""
    assert horizon_box.get_attribute("placeholder") == f"default: {TOTAL}"
    ranking = client.get(f"/api/v1/projects/{project}/ranking",
                         params={"horizon": TOTAL}).json()
    expected = {r["run_id"]: f"P(best) {fmt.chance(r['p_best'])}" for r in ranking["runs"]}
    chips = tab.page.locator("[data-p-best]")
    assert chips.count() == 2
    seen = {chips.nth(i).get_attribute("data-p-best"): chips.nth(i).inner_text().strip()
            for i in range(2)}
    assert seen == expected
    assert chips.first.is_visible() and seen[str(low)] not in ("P(best) —", "P(best) <0.1%")
    assert f"at step {TOTAL}" in (chips.first.get_attribute("title") or "")
    x_end = tab.page.evaluate("() => document.getElementById('chart-compare')"
                              "._fullLayout.xaxis.range[1]")
    assert x_end >= TOTAL * 0.95  # the chart reaches the step it compares at
    tab.no_errors()


@pytest.mark.browser
def test_one_run_alone_opens_the_picker_only_when_it_has_runs_to_offer(
        tmp_path: Path, tab: Tab) -> None:
    """With no other run in the service, "No other runs yet." waits for the user to open the
    picker instead of covering the page's verdict."""
    url = f"sqlite:///{tmp_path / 'alone.db'}"
    upgrade(url)
    with app_server(new_app(live_settings(url))) as dash, httpx.Client(base_url=dash,
                                                                        timeout=60) as client:
        alone = make_run(client, "alone", name="alone", steps=1500)
        tab.page.goto(f"{dash}/compare?runs={alone}")
        tab.wait_for_charts(("compare",))
        results = tab.page.locator("#picker-results")
        assert results.is_hidden()
        tab.page.focus("#picker-search")
        results.get_by_text("No other runs yet.").wait_for()
        other = make_run(client, "alone", name="other", steps=1500)
        tab.page.goto(f"{dash}/compare?runs={alone}")
        results.locator(f".picker-item[data-run-id='{other}']").wait_for()
        tab.no_errors()
