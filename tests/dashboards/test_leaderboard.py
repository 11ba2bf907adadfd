"""The project page's leaderboard through the real app on both backends: the ranking's runs,
best first, names escaped, the reasons of the runs it cannot judge; none for an empty project."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import httpx
import pytest

from curvecast.dashboards import fmt
from curvecast.service.app import create_app
from curvecast.service.config import Settings
from tests.service.test_decisions_api import TOTAL, World, build
from tests.support import serve_app


@pytest.fixture(scope="module")
def world(database_url: str) -> Iterator[World]:
    settings = Settings(database_url=database_url, worker_enabled=False,
                        refit_min_interval_s=0)
    app = create_app(settings)
    with serve_app(app) as url:
        yield build(url, settings, app.state.sessionmaker, f"board-{uuid.uuid4().hex[:8]}")


def _rows(html: str) -> list[str]:
    body = html.split('id="leaderboard-body"', 1)[1].split("</tbody>", 1)[0]
    return re.findall(r"<tr[ >].*?</tr>", body, re.S)


def _text(fragment: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", fragment)).strip()


def test_the_project_page_shows_the_ranking(world: World) -> None:
    page = httpx.get(f"{world.url}/projects/{world.project}", timeout=60)
    assert page.status_code == 200
    assert f"Leaderboard · loss at step {TOTAL:,}" in page.text
    rows = _rows(page.text)
    ranking = httpx.get(f"{world.url}/api/v1/projects/{world.project}/ranking").json()
    assert [re.search(r'data-ranked-run="([^"]+)"', r).group(1)  # type: ignore[union-attr]
            for r in rows] == [r["run_id"] for r in ranking["runs"]]
    first = _text(rows[0])
    # The run's name is escaped: "<b>" is text, not markup.
    assert "good &lt;b&gt;" in rows[0] and "<b>" not in rows[0]
    assert first.startswith("1 good &lt;b&gt; running &gt;99.9%")
    assert f'href="/runs/{world.runs["good"]}"' in rows[0]
    assert "observed" in _text(next(r for r in rows if str(world.runs["done"]) in r))
    crashed = _text(next(r for r in rows if str(world.runs["crashed"]) in r))
    assert crashed.startswith("— crashed crashed — —") and "the run crashed" in crashed
    # The runs table is still there, below it.
    assert page.text.index('id="leaderboard"') < page.text.index('id="project-runs"')


def test_a_project_without_runs_has_no_leaderboard(world: World) -> None:
    project = f"empty-{uuid.uuid4().hex[:8]}"
    # A project exists once a token or a run names it; its run is deleted again.
    run_id = uuid.uuid4()
    httpx.put(f"{world.url}/api/v1/runs/{run_id}", json={"project": project}
              ).raise_for_status()
    httpx.delete(f"{world.url}/api/v1/runs/{run_id}", timeout=60).raise_for_status()
    page = httpx.get(f"{world.url}/projects/{project}", timeout=60)
    assert page.status_code == 200 and 'id="leaderboard"' not in page.text


def test_chances_never_show_as_certain() -> None:
    assert [fmt.chance(p) for p in (None, 0.0, 0.0004, 0.0006, 0.5, 0.9996, 1.0)] == [
        "—", "<0.1%", "<0.1%", "0.1%", "50.0%", ">99.9%", ">99.9%"]
