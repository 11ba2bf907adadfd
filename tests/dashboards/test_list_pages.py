"""The alerts page, the projects pages, the navigation and the one HTML 404 page, over real
HTTP on both backends (the browser tests click through them; these check what the server
answers, with auth off and on)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from curvecast.service.config import Settings
from tests.dashboards.conftest import FakeAlerts, app_server, new_app
from tests.support import create_token
from tests.support import synthetic as syn

READABLE_TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


@pytest.fixture(scope="module")
def alerts() -> FakeAlerts:
    return FakeAlerts()


@pytest.fixture(scope="module")
def site(database_url: str, alerts: FakeAlerts) -> Iterator[str]:
    """The service (auth off, no worker: the alerts are the test's) on each backend."""
    settings = Settings(database_url=database_url, worker_enabled=False)
    with app_server(new_app(settings, alerts)) as url:
        yield url


def _run(client: httpx.Client, project: str, name: str, steps: int = 200,
         status: str | None = None) -> uuid.UUID:
    run_id = uuid.uuid4()
    syn.create_run(client, run_id, project, name=name, total_steps=1000)
    syn.stream(client, run_id, 0, steps, total_steps=1000)
    if status is not None:
        assert client.patch(f"/api/v1/runs/{run_id}", json={"status": status}).status_code == 200
    return run_id


def _rows(html: str, table_body: str) -> list[str]:
    body = html.split(f'id="{table_body}"', 1)[1].split("</tbody>", 1)[0]
    return re.findall(r"<tr[ >].*?</tr>", body, re.S)


def _text(fragment: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", fragment)).strip()


def test_alerts_page_lists_every_state_across_runs(site: str, alerts: FakeAlerts,
                                                   project: str) -> None:
    with httpx.Client(base_url=site, timeout=60) as client:
        first = _run(client, project, "first")
        second = _run(client, project, "second <b>")
        other = _run(client, f"{project}-other", "elsewhere")
    alerts.add(first, project, rule="loss_spike", state="resolved", fired_step=50, step=60,
               resolved_at="2026-01-01T00:02:00Z")
    alerts.add(second, project, rule="grad_l1_drift", fired_step=150, step=190)
    alerts.add(first, project, rule="loss_plateau", state="pending", since_step=100,
               step=180, fired_step=None)
    alerts.add(other, project, rule="grad_l1_drift", step=10)
    with httpx.Client(base_url=site, timeout=60) as client:
        page = client.get("/alerts", params={"project": project})
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        rows = _rows(page.text, "alerts-body")
        assert [re.search(r'class="alert-(\w+)"', r).group(1) for r in rows] == [  # type: ignore[union-attr]
            "firing", "pending", "resolved"]
        firing = _text(rows[0])
        # REST's step, the run's name (escaped), its project, a readable time.
        rest = client.get("/api/v1/alerts", params={"project": project}).json()["alerts"]
        assert {a["rule"]: a["step"] for a in rest}["grad_l1_drift"] == 190
        assert "second &lt;b&gt;" in rows[0] and " 190 " in f" {firing} "
        assert re.search(READABLE_TIME, firing) and "T00:" not in firing
        assert "ago" in firing and "Acknowledge" in firing
        assert "Acknowledge" not in _text(rows[2])  # resolved: nothing to act on
        assert re.search(r">\s*1 firing\s*<", page.text) and re.search(r">\s*1 pending\s*<",
                                                                        page.text)
        every = _rows(client.get("/alerts").text, "alerts-body")
        assert len(every) >= 4  # other projects too, with auth off
        only = _rows(client.get("/alerts", params={"project": project, "state": "pending"}).text,
                     "alerts-body")
        assert len(only) == 1 and "loss_plateau" in only[0]
        bad = client.get("/alerts", params={"state": "bogus"})
        assert bad.status_code == 422 and "text/html" in bad.headers["content-type"]
        assert "state: Input should be" in bad.text
        fragment = client.get("/dashboards/api/alerts-table", params={"project": project})
        assert fragment.status_code == 200 and len(_rows(
            f'<tbody id="x">{fragment.text}</tbody>', "x")) == 3
        none = client.get("/dashboards/api/alerts-table", params={"project": "nobody-here"})
        assert none.status_code == 200 and "No alerts" in none.text


def test_acknowledge_and_silence_from_the_page(site: str, alerts: FakeAlerts,
                                               project: str) -> None:
    with httpx.Client(base_url=site, timeout=60) as client:
        run_id = _run(client, project, "acted on")
        alerts.add(run_id, project, rule="grad_l1_drift", step=120)
        alert = client.get(f"/api/v1/runs/{run_id}/alerts").json()["alerts"][0]
        back = f"/alerts?project={project}"
        ack = client.post(f"/alerts/{alert['id']}/ack", params={"next": back},
                          headers={"origin": site})
        assert ack.status_code == 303 and ack.headers["location"] == back
        silence = client.post(f"/alerts/{alert['id']}/silence",
                              params={"hours": 24, "next": back}, headers={"origin": site})
        assert silence.status_code == 303
        after = client.get(f"/api/v1/runs/{run_id}/alerts").json()["alerts"][0]
        assert after["acknowledged_at"] is not None
        until = datetime.fromisoformat(after["silenced_until"].replace("Z", "+00:00"))
        assert timedelta(hours=23) < until - datetime.now(UTC) <= timedelta(hours=24)
        row = _text(_rows(client.get(back).text, "alerts-body")[0])
        assert re.search("acknowledged " + READABLE_TIME, row)
        assert re.search("silenced until " + READABLE_TIME, row) and "Lift silence" in row
        lift = client.post(f"/alerts/{alert['id']}/silence", params={"next": back},
                           headers={"origin": site})
        assert lift.status_code == 303
        assert client.get(f"/api/v1/runs/{run_id}/alerts").json()["alerts"][0][
            "silenced_until"] is None
        # Another site's form cannot act; an unknown alert is the 404 page; no open redirect.
        forged = client.post(f"/alerts/{alert['id']}/ack", headers={"origin": "https://evil.test"})
        assert forged.status_code == 403
        missing = client.post("/alerts/2147483000/ack", headers={"origin": site})
        assert missing.status_code == 404 and "text/html" in missing.headers["content-type"]
        away = client.post(f"/alerts/{alert['id']}/ack", params={"next": "//evil.test/x"},
                           headers={"origin": site})
        assert away.headers["location"] == "/alerts"


def test_alert_actions_need_an_ingest_token_with_auth_on(sqlite_url: str) -> None:
    project = f"auth-{uuid.uuid4().hex[:8]}"
    read = create_token(sqlite_url, project, "read")
    ingest = create_token(sqlite_url, project, "ingest")
    settings = Settings(database_url=sqlite_url, worker_enabled=False, auth_enabled=True)
    mine = FakeAlerts()
    with app_server(new_app(settings, mine)) as url:
        with httpx.Client(base_url=url, timeout=60,
                          headers={"authorization": f"Bearer {ingest}"}) as writer:
            run_id = _run(writer, project, "private")
        mine.add(run_id, project, rule="grad_l1_drift", step=120)
        with httpx.Client(base_url=url, timeout=60) as browser:
            assert browser.get("/alerts").status_code == 401  # no token: the login hint
            browser.cookies.set("curvecast_token", read)
            page = browser.get("/alerts")
            assert page.status_code == 200 and "private" in page.text
            assert "Acknowledge" not in page.text  # a read token cannot act: no buttons
            alert_id = re.search(r'data-alert-id="(\d+)"', page.text).group(1)  # type: ignore[union-attr]
            denied = browser.post(f"/alerts/{alert_id}/ack", headers={"origin": url})
            assert denied.status_code == 403 and "this needs &#39;ingest&#39;" in denied.text
            browser.cookies.set("curvecast_token", ingest)
            assert "Acknowledge" in browser.get("/alerts").text
            done = browser.post(f"/alerts/{alert_id}/ack", headers={"origin": url})
            assert done.status_code == 303
            assert browser.get("/projects").text.count('data-project="') == 1
            assert browser.get("/projects/other-project").status_code == 404


def test_projects_pages(site: str, project: str, alerts: FakeAlerts) -> None:
    with httpx.Client(base_url=site, timeout=60) as client:
        ids = [_run(client, project, "a"), _run(client, project, "b", status="finished"),
               _run(client, project, "c", status="failed")]
        other = _run(client, f"{project}-x", "not here")
        alerts.add(ids[0], project, rule="grad_l1_drift", step=10)
        listing = client.get("/projects")
        assert listing.status_code == 200
        row = re.search(rf'<tr data-project="{project}">.*?</tr>', listing.text, re.S)
        assert row is not None
        cells = _text(row.group(0))
        assert cells.startswith(f"{project} 3 1 running, 1 failed, 1 finished 1 ")
        page = client.get(f"/projects/{project}")
        assert page.status_code == 200
        rows = _rows(page.text, "runs-body")
        assert len(rows) == 3 and str(other) not in page.text
        assert all(any(str(i) in r for r in rows) for i in ids)
        # Its table refreshes with this project's runs only.
        config = re.search(r'id="cc-config">(.*?)</script>', page.text, re.S)
        assert config is not None
        assert json.loads(config.group(1))["rows_query"] == f"?project={project}"
        missing = client.get("/projects/no-such-project")
        assert missing.status_code == 404 and "404 · Not found" in missing.text


def test_every_page_has_the_navigation_and_unknown_pages_one_404(site: str,
                                                                 project: str) -> None:
    with httpx.Client(base_url=site, timeout=60) as client:
        run_id = _run(client, project, "nav")
        nav = re.compile(r'<nav aria-label="pages">.*?href="/".*?href="/projects".*?'
                         r'href="/alerts".*?href="/docs".*?</nav>', re.S)
        for path in ("/", f"/runs/{run_id}", f"/compare?runs={run_id}", "/alerts",
                     "/projects", f"/projects/{project}"):
            page = client.get(path)
            assert page.status_code == 200 and nav.search(page.text), path
        for path in ("/nope", "/alerts/nope", "/runs/nope", f"/runs/{uuid.uuid4()}",
                     "/projects/x/y", "/compare/1"):
            page = client.get(path)
            assert page.status_code == 404, path
            assert "text/html" in page.headers["content-type"], path
            assert "<h1>404 · Not found</h1>" in page.text and nav.search(page.text), path
            assert page.headers["content-security-policy"], path
        for path in ("/api/v1/nope", "/api/v1/runs/nope/x", "/dashboards/api/nope",
                     "/static/nope.js"):
            answer = client.get(path)
            assert answer.status_code == 404, path
            assert answer.json()["error_code"] == "not_found", path
