"""Dashboard routes over real HTTP on both backends: pages, chart data, static files, auth.
(The browser tests render them; these check what the server sends.)"""

from __future__ import annotations

import json
import re
import statistics
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import plotly
import pytest

from curvecast.dashboards import fmt, html
from curvecast.service.config import Settings
from curvecast.service.db import make_engine, make_sessionmaker, session_scope
from curvecast.service.store import dashboard as dashboard_store
from curvecast.service.web import static
from tests.dashboards.conftest import (
    FakeAlerts,
    app_server,
    live_settings,
    make_run,
    new_app,
    wait_for_fit,
)
from tests.support import create_token
from tests.support import synthetic as syn

XSS = "</script><script>alert(1)</script><img src=x onerror=alert(2)>"
Clients = Callable[[str], httpx.Client]


@pytest.fixture(scope="module")
def dash(database_url: str) -> Iterator[str]:
    """A live service (worker on) on each backend."""
    with app_server(new_app(live_settings(database_url))) as url:
        yield url


def config_of(page: str) -> dict[str, Any]:
    match = re.search(r'<script type="application/json" id="cc-config">(.*?)</script>', page,
                      re.S)
    assert match, "no config element"
    return dict(json.loads(match.group(1)))


def test_pages_render_and_escape_user_text(dash: str, project: str, client_for: Clients) -> None:
    client = client_for(dash)
    run_id = uuid.uuid4()
    config: dict[str, Any] = {"note": XSS, "<b>key</b>": "<i>v</i>"}
    syn.create_run(client, run_id, project, name=XSS, **config)
    syn.stream(client, run_id, 0, 3000, total_steps=20_000, eval_every=500)
    wait_for_fit(client, run_id)
    for path in ("/", f"/?project={project}", f"/runs/{run_id}", f"/compare?runs={run_id}"):
        resp = client.get(path)
        assert resp.status_code == 200, (path, resp.text[:300])
        assert resp.headers["content-type"].startswith("text/html")
        csp = resp.headers["content-security-policy"]
        script_src = csp.split("script-src")[1].split(";")[0]
        assert script_src.strip() == "'self'"  # no inline scripts, no eval
        assert resp.headers["cache-control"] == "no-store"
        body = resp.text
        # The name is escaped wherever it appears: as text, and inside the JSON config.
        assert XSS not in body and "<img src=x" not in body
        assert "&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in body or path == "/"
        assert not re.search(r"<script[^>]+src=\"https?://", body), "no CDN scripts"
        config_of(body)
    page = client.get(f"/?project={project}").text
    assert "&lt;/script&gt;&lt;script&gt;alert(1)" in page
    run_page = client.get(f"/runs/{run_id}").text  # config keys and values, escaped
    assert "<b>key</b>" not in run_page and "&lt;b&gt;key&lt;/b&gt;" in run_page
    assert "<i>v</i>" not in run_page and "&lt;i&gt;v&lt;/i&gt;" in run_page


def test_runs_list_shows_progress_loss_forecast_and_trend(dash: str, project: str,
                                                         client_for: Clients) -> None:
    client = client_for(dash)
    fitted = make_run(client, project, name="fitted", steps=3000)
    empty = uuid.uuid4()
    syn.create_run(client, empty, project, name="empty")
    body = client.get("/", params={"project": project}).text
    rows = {m.group(1): m.group(0) for m in
            re.finditer(r'<tr data-run-id="([0-9a-f-]+)">.*?</tr>', body, re.S)}
    assert set(rows) == {str(fitted), str(empty)}
    fitted_row = rows[str(fitted)]
    assert "2,999" in fitted_row and re.search(r'<path d="M[0-9. ML]+"/>', fitted_row)
    assert re.search(r"\[\d\.\d+, \d\.\d+\] @ 20k", fitted_row)  # forecast interval at the end
    assert "pending" in rows[str(empty)]
    table = client.get("/dashboards/api/runs-table", params={"project": project}).text
    assert str(fitted) in table and "<html" not in table
    assert "Older runs" not in body
    finished = client.get("/", params={"project": project, "status": "finished"}).text
    assert str(fitted) not in finished
    # What the filter form sends for "any status" (and an empty project box).
    form = client.get("/", params={"project": project, "status": "", "page_token": ""})
    assert form.status_code == 200 and str(fitted) in form.text
    assert client.get("/", params={"project": "", "status": ""}).status_code == 200
    # A query the page cannot read gets the error page, as every other error of a page does
    # (it was the API's JSON body), with the API's message; the pages' scripts still get JSON.
    for path, params, message in (
            ("/", {"status": "bogus"},
             "status: Input should be &#39;running&#39;, &#39;finished&#39;, &#39;failed&#39;, "
             "&#39;crashed&#39;, &#39;lost&#39; or &#39;&#39;"),
            ("/compare", {"runs": str(fitted), "horizon": "abc"},
             "horizon: Input should be a valid integer")):
        resp = client.get(path, params=params)
        assert resp.status_code == 422 and resp.headers["content-type"].startswith("text/html")
        assert message in resp.text and "Content-Security-Policy" in resp.headers
    # An address no page has (not a run id) is the one 404 page, as every unknown page is.
    missing = client.get("/runs/not-a-run")
    assert missing.status_code == 404 and "404 · Not found" in missing.text
    api = client.get("/dashboards/api/compare", params={"runs": str(fitted), "horizon": "abc"})
    assert api.status_code == 422 and api.json()["message"].startswith("horizon: ")


def test_runs_list_gives_a_finished_run_the_loss_it_reached(dash: str, project: str,
                                                          client_for: Clients) -> None:
    """A run that got to its planned end: its "Forecast (final)" is the loss it reached there,
    as the run page's card says, with the fit beside it (it showed the fit's value alone):
    the series' median over the last 1% of the steps, not its last point."""
    from curvecast.dashboards import fmt

    client = client_for(dash)
    run_id = make_run(client, project, name="done", steps=3001, total=3000)
    forecast = client.get(f"/api/v1/runs/{run_id}/forecast").json()
    assert forecast["prediction"]["step"] == 3000
    key = forecast["key"]
    metrics = client.get(f"/api/v1/runs/{run_id}/metrics", params={"keys": key}).json()
    (series,) = metrics["series"]
    assert series["steps"][-1] == 3000
    window = [v for s, v in zip(series["steps"], series["values"], strict=True) if s > 2970]
    assert len(window) > 1  # the training loss, logged at every step
    reached = statistics.median(window)
    assert forecast["prediction"]["reached"] == pytest.approx(reached)
    body = client.get("/", params={"project": project}).text
    row = re.search(rf'<tr data-run-id="{run_id}">.*?</tr>', body, re.S)
    assert row is not None
    cell = row.group(0)
    assert f"reached @ 3k; fit {fmt.loss(forecast['prediction']['value'])}" in cell
    assert f'data-sort="{float(reached)!r}"' in cell and f">{fmt.loss(reached)}</span>" in cell


def test_run_summaries_store_query(database_url: str, dash: str, project: str,
                                   client_for: Clients) -> None:
    client = client_for(dash)
    run_id = make_run(client, project, steps=2000, eval_every=None, fit=False)
    engine = make_engine(Settings(database_url=database_url))
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            summaries, token = dashboard_store.run_summaries(
                session, project=project, status=None, limit=10, page_token=None,
                allowed_project=None)
            (summary,) = summaries
            assert token is None and summary.run.id == run_id and summary.loss_key == "loss"
            assert summary.last_loss_step == 1999
            assert len(summary.spark_steps) == 40 and summary.spark_steps[0] < 100
            # Window means of a falling curve fall.
            assert summary.spark_values[0] > summary.spark_values[-1] > 2.0
            none, _ = dashboard_store.run_summaries(
                session, project=None, status=None, limit=10, page_token=None,
                allowed_project=project + "-other")
            assert none == []
    finally:
        engine.dispose()


def test_run_figures_endpoint_and_zoom(dash: str, project: str, client_for: Clients) -> None:
    client = client_for(dash)
    run_id = make_run(client, project, steps=4000)
    resp = client.get(f"/dashboards/api/runs/{run_id}/figures")
    assert resp.status_code == 200 and resp.headers["cache-control"] == "no-store"
    body = resp.json()
    assert list(body["charts"]) == ["loss", "step_size", "gradient", "norms", "averaging",
                                    "evolution"]
    loss = body["charts"]["loss"]
    roles = [t["meta"]["role"] for t in loss["data"]]
    assert {"last", "fit", "forecast", "band_lo", "band_hi", "f_star", "prediction"} <= set(roles)
    assert body["state"]["cursor"]["loss"] == 3999 and body["state"]["horizon"] == 20_000
    assert body["state"]["total_steps"] == 20_000  # the planned end (null when not planned)
    assert {k["id"] for k in body["kpis"]} >= {"progress", "last_loss", "forecast", "f_star"}
    # Zoom: the visible range is re-read at full resolution.
    zoom = client.get(f"/dashboards/api/runs/{run_id}/figures",
                      params={"charts": "loss", "start": 1000, "end": 1499}).json()
    assert list(zoom["charts"]) == ["loss"]
    (line,) = [t for t in zoom["charts"]["loss"]["data"]
               if t["meta"] == {"key": "loss", "role": "last"}]
    steps = _decode(line["x"])
    assert len(steps) == 500 and steps[0] == 1000 and steps[-1] == 1499  # every point
    assert zoom["charts"]["loss"]["layout"]["xaxis"]["range"] == [1000.0, 1499.0]
    bad = client.get(f"/dashboards/api/runs/{run_id}/figures", params={"charts": "nope"})
    assert bad.status_code == 422 and "nope" in bad.json()["message"]
    missing = client.get(f"/dashboards/api/runs/{uuid.uuid4()}/figures")
    assert missing.status_code == 404 and missing.json()["error_code"] == "run_not_found"
    assert client.get(f"/runs/{uuid.uuid4()}").status_code == 404


def test_run_page_forecasts_the_series_the_user_chooses(
        dash: str, project: str, client_for: Clients) -> None:
    """A run that evaluates is forecast on its eval loss; ``?key=loss`` shows the forecast of
    its training loss instead: the headline numbers, the loss chart's fit, the evolution, the
    live poll and the page's config (which the ask box sends on) all of that series."""
    client = client_for(dash)
    run_id = make_run(client, project, name="both", steps=3000, eval_every=250,
                      curve=(60.0, 300.0, 1.8), eval_offset=0.6)
    wait_for_fit(client, run_id, key="loss")
    rest = {key: client.get(f"/api/v1/runs/{run_id}/forecast", params={"key": key}).json()
            for key in ("loss", "eval_loss")}
    assert rest["eval_loss"]["key"] == "eval_loss"  # the default

    def figures(**params: Any) -> dict[str, Any]:
        resp = client.get(f"/dashboards/api/runs/{run_id}/figures", params=params)
        assert resp.status_code == 200, resp.text
        return resp.json()

    for key, params in (("eval_loss", {}), ("loss", {"key": "loss"})):
        body = figures(**params)
        forecast = next(k for k in body["kpis"] if k["id"] == "forecast")
        assert forecast["value"] == fmt.loss(rest[key]["prediction"]["value"]), key
        fit = next(t for t in body["charts"]["loss"]["data"] if t["meta"]["role"] == "fit")
        assert fit["name"].endswith("eval loss" if key == "eval_loss" else "training loss")
        (drawn,) = [t for t in body["charts"]["evolution"]["data"]
                    if t["meta"].get("role") == "forecast"]
        history = client.get(f"/api/v1/runs/{run_id}/forecast/history",
                             params={"key": key}).json()
        assert _decode(drawn["y"])[-1] == pytest.approx(history["points"][-1]["final"]["value"])
        live = client.get(f"/dashboards/api/runs/{run_id}/live",
                          params={"horizon": 20_000, **params}).json()
        assert live["forecast"]["key"] == key
    html = client.get(f"/runs/{run_id}", params={"key": "loss"}).text
    assert '<option value="loss" selected>loss</option>' in html
    assert config_of(html)["key"] == "loss"
    assert "figures?key=loss" in html  # the first data the page asks for
    assert f"/compare?runs={run_id}&amp;key=loss" in html
    default = client.get(f"/runs/{run_id}", params={"key": ""}).text
    assert config_of(default)["key"] is None
    assert '<option value="" selected>default: eval_loss</option>' in default
    # A run that logs one loss series offers no list.
    single = make_run(client, project, name="one", steps=1000, eval_every=None)
    assert 'id="run-key"' not in client.get(f"/runs/{single}").text
    missing = client.get(f"/runs/{run_id}", params={"key": "val_loss"})
    assert missing.status_code == 404 and "has no series &#39;val_loss&#39;" in missing.text
    assert client.get(f"/runs/{run_id}", params={"key": "a b"}).status_code == 422
    assert client.get(f"/dashboards/api/runs/{run_id}/figures",
                      params={"key": "a b"}).status_code == 422


def _decode(array: object) -> list[float]:
    """A Plotly array: a list, or a typed-array spec {dtype, bdata}."""
    import base64

    import numpy as np

    if isinstance(array, list):
        return [float(x) for x in array]
    assert isinstance(array, dict)
    decoded: list[float] = np.frombuffer(base64.b64decode(array["bdata"]),
                                         dtype=array["dtype"]).tolist()
    return decoded


def test_runs_forecast_on_different_series_are_compared_on_one(
        dash: str, project: str, client_for: Clients) -> None:
    """One run evaluates often (its forecast: the eval loss), the other never (the training
    loss): the compare page ranked one's eval loss against the other's training loss, without
    a word. It now compares both on the first series each has a forecast on: here ``loss``."""
    client = client_for(dash)
    evals = make_run(client, project, name="evals", steps=3000, eval_every=250)
    train_only = make_run(client, project, name="train-only", steps=3000, eval_every=None,
                          curve=(60.0, 300.0, 1.8))
    assert wait_for_fit(client, evals)["key"] == "eval_loss"  # its default
    assert wait_for_fit(client, train_only)["key"] == "loss"
    wait_for_fit(client, evals, key="loss")  # the worker fits its other loss series too
    body = client.get("/dashboards/api/compare", params={"runs": f"{evals},{train_only}",
                                                         "horizon": 10_000}).json()
    keys = {t["meta"]["run_id"]: t["meta"]["key"] for t in body["charts"]["compare"]["data"]
            if t["meta"].get("role") == "last"}
    assert keys == {str(evals): "loss", str(train_only): "loss"}
    assert body["charts"]["compare"]["layout"]["yaxis"]["title"]["text"] == "training loss"
    assert "Not like with like" not in body["verdict"]["message"]
    assert body["verdict"]["best"] == str(train_only)


def test_runs_with_no_series_in_common_are_compared_with_a_warning(
        dash: str, project: str, client_for: Clients) -> None:
    """One run logs only an eval loss, the other only a training loss: no series has a
    forecast in both, so the page ranks them as they are, and its verdict says that the series
    differ and names no clear winner."""
    client = client_for(dash)
    eval_only = uuid.uuid4()
    syn.create_run(client, eval_only, project, name="eval-only")
    steps = list(range(100, 3001, 100))
    client.post(f"/api/v1/runs/{eval_only}/metrics", json={
        "steps": steps, "values": {"eval_loss": [60 / (s + 300) ** 0.5 + 2.0 for s in steps]},
    }).raise_for_status()
    train_only = make_run(client, project, name="train-only", steps=3000, eval_every=None,
                          curve=(60.0, 300.0, 1.8))
    assert wait_for_fit(client, eval_only)["key"] == "eval_loss"
    body = client.get("/dashboards/api/compare", params={"runs": f"{eval_only},{train_only}",
                                                         "horizon": 10_000}).json()
    verdict = body["verdict"]
    assert not verdict["clear"]
    assert ("Not like with like: the runs are forecast on different series (train-only: "
            "loss; eval-only: eval_loss)") in verdict["message"]


def test_compare_on_the_series_the_user_chooses(
        dash: str, project: str, client_for: Clients) -> None:
    """Two runs that both evaluate are compared on their eval losses by default; ``?key=loss``
    compares their training losses instead (the page offers the series the runs log). A run
    that does not log the chosen series is named, not ranked; a bad name is a 4xx."""
    client = client_for(dash)
    # The training losses rank the other way round from the eval losses.
    first = make_run(client, project, name="first", steps=3000, eval_every=250,
                     curve=(60.0, 300.0, 1.8), eval_offset=0.6)
    second = make_run(client, project, name="second", steps=3000, eval_every=250,
                      curve=(60.0, 300.0, 2.1), eval_offset=0.1)
    for run in (first, second):
        wait_for_fit(client, run, key="eval_loss")
        wait_for_fit(client, run, key="loss")
    runs = f"{first},{second}"

    def compare(**params: Any) -> dict[str, Any]:
        resp = client.get("/dashboards/api/compare",
                          params={"runs": runs, "horizon": 10_000, **params})
        assert resp.status_code == 200, resp.text
        return resp.json()

    def keys(body: dict[str, Any]) -> set[str]:
        return {t["meta"]["key"] for t in body["charts"]["compare"]["data"]
                if t["meta"].get("role") == "last"}

    default = compare()
    assert keys(default) == {"eval_loss"} and default["verdict"]["best"] == str(second)
    train = compare(key="loss")
    assert keys(train) == {"loss"} and train["verdict"]["best"] == str(first)
    assert train["charts"]["compare"]["layout"]["yaxis"]["title"]["text"] == "training loss"
    # As the form submits it, the horizon left empty ("planned end"): that was a 422.
    html = client.get("/compare", params={"runs": runs, "horizon": "", "key": "loss"}).text
    assert '<option value="loss" selected>loss</option>' in html
    assert '<option value="eval_loss">eval_loss</option>' in html
    assert config_of(html)["key"] == "loss"
    assert "&amp;key=loss" in html  # the links that drop a run keep the choice
    # A third run logs no eval loss: with key=eval_loss it is named, and the others ranked.
    third = make_run(client, project, name="third", steps=3000, eval_every=None,
                     curve=(60.0, 300.0, 1.5))
    wait_for_fit(client, third)
    body = client.get("/dashboards/api/compare", params={
        "runs": f"{runs},{third}", "horizon": 10_000, "key": "eval_loss"}).json()
    assert body["verdict"]["best"] == str(second)
    assert "Not compared: third logs no eval_loss." in body["verdict"]["message"]
    row = next(r for r in body["rows"] if r["name"] == "third")
    assert (row["forecast"], row["interval"]) == ("—", "logs no eval_loss")
    html = client.get("/compare", params={"runs": f"{runs},{third}"}).text
    assert '<option value="eval_loss">eval_loss (2 of 3 runs)</option>' in html
    none = client.get("/dashboards/api/compare", params={"runs": str(third),
                                                         "key": "eval_loss"}).json()
    assert none["verdict"]["message"] == "No run here logs eval_loss: choose another series."
    for bad in ("no spaces", "x" * 201):
        assert client.get("/dashboards/api/compare",
                          params={"runs": runs, "key": bad}).status_code == 422
        page = client.get("/compare", params={"runs": runs, "key": bad})
        assert page.status_code in (400, 422), bad
    assert "is not a metric name" in client.get(
        "/compare", params={"runs": runs, "key": "no spaces"}).text


def test_compare_endpoint_names_the_best_run(dash: str, project: str,
                                             client_for: Clients) -> None:
    client = client_for(dash)
    worse = make_run(client, project, name="worse", steps=3000, eval_every=None,
                     curve=(60.0, 300.0, 2.4))
    better = make_run(client, project, name="better", steps=3000, eval_every=None,
                      curve=(60.0, 300.0, 1.8))
    body = client.get("/dashboards/api/compare", params={"runs": f"{worse},{better}"}).json()
    assert body["verdict"]["best"] == str(better) and body["verdict"]["horizon"] == 20_000
    assert "better will be best" in body["verdict"]["message"]
    assert [r["name"] for r in body["rows"]] == ["better", "worse"]
    roles = {t["meta"]["role"] for t in body["charts"]["compare"]["data"]}
    assert {"last", "forecast", "prediction"} <= roles
    custom = client.get("/dashboards/api/compare",
                        params={"runs": f"{worse},{better}", "horizon": 50_000}).json()
    assert custom["verdict"]["horizon"] == 50_000
    for bad in ("", "not-a-uuid", ",".join(str(uuid.uuid4()) for _ in range(9))):
        resp = client.get("/dashboards/api/compare", params={"runs": bad})
        assert resp.status_code == 422, bad
    page = client.get("/compare", params={"runs": "nope"})
    assert page.status_code == 422 and "not a run id" in page.text
    # Two runs of one name: the chips, like the chart and the verdict, carry the short ids.
    twin = make_run(client, project, name="worse", steps=300, eval_every=None,
                    curve=(60.0, 300.0, 2.4))
    html = client.get("/compare", params={"runs": f"{worse},{twin}"}).text
    assert f"worse ({str(worse)[:8]})" in html and f"worse ({str(twin)[:8]})" in html
    rows = client.get("/dashboards/api/compare", params={"runs": f"{worse},{twin}"}).json()
    assert sorted(r["name"] for r in rows["rows"]) == sorted(
        f"worse ({str(i)[:8]})" for i in (worse, twin))


def test_plotly_js_is_the_vendored_basic_bundle(dash: str, client_for: Clients) -> None:
    client = client_for(dash)
    bundle = (html.STATIC_DIR / "vendor" / "plotly-basic.min.js").read_bytes()
    # The figures are written in the format of the installed plotly's plotly.js: same version.
    assert static.plotly_js_version() == plotly.offline.get_plotlyjs_version()
    url = static.plotly_url()
    assert url == f"/static/plotly-basic.min.js?v={plotly.offline.get_plotlyjs_version()}"
    plain = client.get(url, headers={"accept-encoding": "identity"})
    assert plain.status_code == 200 and plain.content == bundle
    assert "immutable" in plain.headers["cache-control"]
    assert plain.headers["content-type"].startswith("text/javascript")
    packed = httpx.get(f"{dash}{url}", headers={"accept-encoding": "gzip"})
    assert packed.headers["content-encoding"] == "gzip" and packed.content == bundle
    assert int(packed.headers["content-length"]) < len(bundle) / 2
    again = client.get(url, headers={"if-none-match": plain.headers["etag"]})
    assert again.status_code == 304
    run_id = uuid.uuid4()
    syn.create_run(client, run_id, f"p-{uuid.uuid4().hex[:10]}", name="plotly")
    page = client.get(f"/runs/{run_id}")
    assert page.status_code == 200 and f'src="{url}"' in page.text
    assert client.get("/static/plotly.min.js").status_code == 404  # the full bundle is not served
    js = client.get("/static/dashboards.js")
    assert js.status_code == 200 and js.headers["cache-control"] == "no-cache"
    assert client.get("/static/../pyproject.toml").status_code == 404
    assert client.get("/static/nothing.js").status_code == 404


def test_alerts_are_shown_on_the_pages(sqlite_url: str, project: str,
                                                     client_for: Clients) -> None:
    alerts = FakeAlerts()
    with app_server(new_app(live_settings(sqlite_url), alerts)) as url:
        client = client_for(url)
        run_id = make_run(client, project, steps=2000)
        alerts.add(run_id, project, step=1900, fired_step=1500, summary="<b>drift</b>")
        alerts.add(run_id, project, step=1200, since_step=800, fired_step=None,
                   state="pending", rule="polyak_negative")
        body = client.get(f"/dashboards/api/runs/{run_id}/figures").json()
        marks = [a for a in body["charts"]["loss"]["layout"]["annotations"]
                 if a.get("name") == "alert"]
        assert sorted(a["x"] for a in marks) == [800, 1500]
        assert all("<b>drift" not in a["hovertext"] for a in marks)
        kpis = {k["id"]: k for k in body["kpis"]}
        assert kpis["alerts"]["value"] == "1 firing" and kpis["alerts"]["tone"] == "bad"
        assert kpis["alerts"]["detail"] == "1 pending, 0 resolved"
        rows = client.get("/", params={"project": project}).text
        assert re.search(r'<span class="badge firing">1</span>', rows)


def test_alerts_from_the_alerts_api(dash: str, project: str, client_for: Clients) -> None:
    """The real alerts (none for a healthy run): the page lists them."""
    client = client_for(dash)
    run_id = make_run(client, project, steps=500, fit=False)
    page = client.get(f"/runs/{run_id}").text
    assert "Alerting is not enabled" not in page
    kpis = {k["id"]: k for k in client.get(f"/dashboards/api/runs/{run_id}/figures").json()["kpis"]}
    assert kpis["alerts"]["value"] == "0 firing"


# --- auth ---------------------------------------------------------------------------------------


def test_pages_need_a_read_token_when_auth_is_on(database_url: str, project: str) -> None:
    read = create_token(database_url, project, "read")
    ingest = create_token(database_url, project, "ingest")
    other = create_token(database_url, project + "-other", "read")
    settings = Settings(database_url=database_url, auth_enabled=True, worker_enabled=False)
    with app_server(new_app(settings)) as url:
        auth = {"authorization": f"Bearer {ingest}"}
        run_id = uuid.uuid4()
        httpx.put(f"{url}/api/v1/runs/{run_id}", json={"project": project, "name": "secret"},
                  headers=auth).raise_for_status()
        httpx.post(f"{url}/api/v1/runs/{run_id}/metrics", headers=auth,
                   json=syn.batch(0, 300, total_steps=1000)).raise_for_status()
        for path in ("/", f"/runs/{run_id}", f"/compare?runs={run_id}"):
            resp = httpx.get(url + path)
            assert resp.status_code == 401, path
            assert "?token=" in resp.text and "secret" not in resp.text
        assert httpx.get(f"{url}/dashboards/api/runs/{run_id}/figures").status_code == 401
        assert httpx.get(f"{url}/dashboards/api/v1/runs/{run_id}").status_code == 401
        bad = httpx.get(f"{url}/runs/{run_id}", params={"token": "cc_nope_nope"})
        assert bad.status_code == 401 and "set-cookie" not in bad.headers

        with httpx.Client(base_url=url) as browser:
            login = browser.get(f"/runs/{run_id}", params={"token": read, "x": "1"})
            assert login.status_code == 303 and login.headers["location"] == f"/runs/{run_id}?x=1"
            cookie = login.headers["set-cookie"]
            assert "HttpOnly" in cookie and "SameSite=lax" in cookie and "Path=/" in cookie
            page = browser.get(f"/runs/{run_id}")
            assert page.status_code == 200 and "secret" in page.text
            assert read not in page.text  # the token never reaches the page
            assert config_of(page.text)["api"] == "/dashboards/api/v1"
            figs = browser.get(f"/dashboards/api/runs/{run_id}/figures")
            assert figs.status_code == 200 and "loss" in figs.json()["charts"]
            proxied = browser.get(f"/dashboards/api/v1/runs/{run_id}/metrics",
                                  params={"keys": "loss", "start": 290})
            assert proxied.status_code == 200
            assert proxied.json()["series"][0]["steps"] == list(range(290, 300))
            assert browser.get("/dashboards/api/v1/runs/../../healthz").status_code == 404
            assert str(run_id) in browser.get("/").text
            assert browser.post("/logout").status_code == 303
            assert browser.get(f"/runs/{run_id}").status_code == 401

        # A token of another project sees neither the run nor its page.
        with httpx.Client(base_url=url, headers={"authorization": f"Bearer {other}"}) as stranger:
            assert stranger.get(f"/runs/{run_id}").status_code == 404
            assert stranger.get(f"/dashboards/api/runs/{run_id}/figures").status_code == 404
            assert str(run_id) not in stranger.get("/").text


def test_runs_page_lists_only_the_tokens_project(database_url: str, project: str,
                                                 client_for: Clients) -> None:
    del client_for
    admin_a = create_token(database_url, project, "ingest")
    admin_b = create_token(database_url, project + "-b", "ingest")
    settings = Settings(database_url=database_url, auth_enabled=True, worker_enabled=False)
    with app_server(new_app(settings)) as url:
        for token, proj in ((admin_a, project), (admin_b, project + "-b")):
            httpx.put(f"{url}/api/v1/runs/{uuid.uuid4()}", json={"project": proj, "name": proj},
                      headers={"authorization": f"Bearer {token}"}).raise_for_status()
        page = httpx.get(f"{url}/", headers={"authorization": f"Bearer {admin_a}"}).text
        assert f">{project}<" in page and f">{project}-b<" not in page


def test_figures_survive_a_run_without_points(dash: str, project: str,
                                              client_for: Clients) -> None:
    client = client_for(dash)
    run_id = uuid.uuid4()
    syn.create_run(client, run_id, project, name="fresh")
    body = client.get(f"/dashboards/api/runs/{run_id}/figures").json()
    assert body["state"]["cursor"] == {} and body["state"]["fit_status"] == "pending"
    texts = [a.get("text", "") for a in body["charts"]["loss"]["layout"].get("annotations", [])]
    assert any("no data yet" in t for t in texts)
    syn.stream(client, run_id, 0, 1000, total_steps=20_000)
    wait_for_fit(client, run_id)
