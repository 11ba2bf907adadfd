"""Forecasts in the service: the background worker refits as a run streams, the REST endpoints
answer from stored fits, and several processes never fit the same data twice."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from sqlalchemy import create_engine, text

from curvecast.service.config import Settings
from tests._servers import start_server_process, thread_server
from tests.support import wait_for

A, B, C = 20.3, 377.0, 2.07  # the paper's 500M-model fit


def curve(steps: np.ndarray, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return A / np.sqrt(steps + B) + C + rng.normal(0, 0.004, len(steps))


@pytest.fixture(scope="module")
def worker_server(database_url: str) -> Iterator[str]:
    settings = Settings(database_url=database_url, worker_interval_s=0.1, refit_max_age_s=1.0)
    with thread_server(settings) as url:
        yield url


def stream(url: str, run_id: uuid.UUID, steps: np.ndarray, *, wall0: float = 1.7e9) -> None:
    values = curve(steps)
    body = {
        "steps": steps.tolist(),
        "wall_time": (wall0 + steps * 0.5).tolist(),
        "values": {"loss": values.tolist()},
    }
    httpx.post(f"{url}/api/v1/runs/{run_id}/metrics", json=body, timeout=30).raise_for_status()


def test_forecast_updates_as_the_run_streams(worker_server: str, project: str) -> None:
    url, run_id = worker_server, uuid.uuid4()
    httpx.put(
        f"{url}/api/v1/runs/{run_id}",
        json={"project": project, "config": {"total_steps": 20_000, "c_warmup": 100}},
    )
    assert httpx.get(f"{url}/api/v1/runs/{run_id}/forecast").json()["status"] == "pending"
    seen_upto = []
    for lo in range(0, 4000, 1000):
        stream(url, run_id, np.arange(lo, lo + 1000))
        want = lo + 999

        def fitted(want: int = want) -> dict | None:
            body = httpx.get(f"{url}/api/v1/runs/{run_id}/forecast").json()
            upto = body["fitted_upto_step"]
            # Long series are binned: the last fitted step is a bin centre near the end.
            return body if upto is not None and upto >= want - 20 else None

        body = wait_for(fitted, timeout=60, what="a fit")
        seen_upto.append(body["fitted_upto_step"])
    assert seen_upto == sorted(seen_upto) and len(set(seen_upto)) == 4
    assert body["status"] == "ok" and body["key"] == "loss"
    assert body["c"] == pytest.approx(C, abs=0.05)
    truth = A / math.sqrt(20_000 + B) + C
    pred = body["prediction"]
    assert pred["step"] == 20_000
    assert pred["lo"] <= truth <= pred["hi"]
    assert abs(pred["value"] - truth) / truth < 0.01
    assert body["f_star"]["lo"] <= body["c"] <= body["f_star"]["hi"]
    # Any horizon and confidence from the stored fit.
    wide = httpx.get(
        f"{url}/api/v1/runs/{run_id}/forecast", params={"horizon": 100_000, "confidence": 0.99}
    ).json()
    narrow = httpx.get(
        f"{url}/api/v1/runs/{run_id}/forecast", params={"horizon": 100_000, "confidence": 0.6}
    ).json()
    assert wide["prediction"]["step"] == 100_000
    assert (
        wide["prediction"]["hi"] - wide["prediction"]["lo"]
        > narrow["prediction"]["hi"] - narrow["prediction"]["lo"]
    )
    history = httpx.get(f"{url}/api/v1/runs/{run_id}/forecast/history").json()
    assert history["horizon"] == 20_000
    uptos = [p["fitted_upto_step"] for p in history["points"]]
    assert len(uptos) >= 4 and uptos == sorted(uptos)
    assert history["points"][-1]["final"]["step"] == 20_000


def test_target_query_and_eta(worker_server: str, project: str) -> None:
    url, run_id = worker_server, uuid.uuid4()
    httpx.put(f"{url}/api/v1/runs/{run_id}", json={"project": project})
    stream(url, run_id, np.arange(0, 5000))
    wait_for(lambda: httpx.get(f"{url}/api/v1/runs/{run_id}/forecast").json()["status"] == "ok",
             timeout=60, what="a fit")
    target_loss = 2.2
    truth = (A / (target_loss - C)) ** 2 - B
    body = httpx.get(
        f"{url}/api/v1/runs/{run_id}/forecast/target", params={"loss": target_loss}
    ).json()
    target = body["target"]
    assert target["reachable"] is True
    assert abs(target["step"] - truth) / truth < 0.1
    assert target["lo"] <= truth <= (target["hi"] or math.inf)
    eta = body["eta"]
    assert eta["steps_per_second"] == pytest.approx(2.0, rel=1e-6)  # wall time: 0.5 s/step
    assert eta["seconds"] == pytest.approx((target["step"] - 4999) / 2.0, rel=1e-6)
    below = httpx.get(f"{url}/api/v1/runs/{run_id}/forecast/target", params={"loss": 1.0})
    assert below.json()["target"]["reachable"] is False
    bad = httpx.get(f"{url}/api/v1/runs/{run_id}/forecast/target", params={"loss": "nan"})
    assert bad.status_code == 422 and "loss" in bad.json()["message"]


def test_forecast_of_unknown_run_is_404(worker_server: str) -> None:
    resp = httpx.get(f"{worker_server}/api/v1/runs/{uuid.uuid4()}/forecast")
    assert resp.status_code == 404 and resp.json()["error_code"] == "run_not_found"


def test_two_processes_never_fit_the_same_data_twice(pg_url: str, tmp_path: Path) -> None:
    env = {"CURVECAST_WORKER_INTERVAL_S": "0.05", "CURVECAST_REFIT_MAX_AGE_S": "0.5"}
    servers = [start_server_process(pg_url, tmp_path, env=env) for _ in range(2)]
    try:
        runs = [uuid.uuid4() for _ in range(4)]
        for run_id in runs:
            httpx.put(f"{servers[0].url}/api/v1/runs/{run_id}", json={"project": "refit"})

        def stream_run(index: int) -> None:
            for n, lo in enumerate(range(0, 3000, 250)):
                url = servers[(index + n) % 2].url  # alternate between the replicas
                stream(url, runs[index], np.arange(lo, lo + 250))

        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(stream_run, range(4)))
        engine = create_engine(Settings(database_url=pg_url).database_url)

        def all_fitted() -> bool:
            with engine.connect() as conn:
                done = conn.execute(
                    text(
                        "SELECT count(*) FROM run_work w JOIN runs r ON r.id = w.run_id "
                        "WHERE r.id = ANY(:ids) AND w.fit_n_points = r.n_points"
                        " AND r.n_points = 3000"
                    ),
                    {"ids": runs},
                ).scalar_one()
            return done == 4

        wait_for(all_fitted, timeout=60, what="every run fitted")
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT run_id, run_n_points, fitted_upto_step FROM fits"
                     " WHERE run_id = ANY(:ids) ORDER BY id"),
                {"ids": runs},
            ).all()
            # Every point stored exactly once, whichever replica took each batch.
            stored = conn.execute(
                text(
                    "SELECT s.run_id, count(*), count(DISTINCT p.step) FROM metric_points p"
                    " JOIN series s ON s.id = p.series_id WHERE s.run_id = ANY(:ids)"
                    " GROUP BY s.run_id"
                ),
                {"ids": runs},
            ).all()
        assert sorted((n, d) for _r, n, d in stored) == [(3000, 3000)] * 4
        engine.dispose()
        per_run: dict[uuid.UUID, list[tuple[int, int]]] = {}
        for run_id, n, upto in rows:
            per_run.setdefault(run_id, []).append((n, upto))
        assert set(per_run) == set(runs)
        for fits in per_run.values():
            counts = [n for n, _ in fits]
            # Each fit saw more data than the one before: no duplicate, no lost update (a job
            # whose data did not change since the last stored fit stores nothing) ...
            assert counts == sorted(set(counts)), counts
            # ... and the last one saw every point.
            assert fits[-1][1] >= 2990  # long series are binned: a bin centre near the end
        for server in servers:
            assert "Traceback" not in server.log()
    finally:
        for server in servers:
            server.stop()


def test_long_runs_are_fitted_from_rollup_means(worker_server: str, project: str) -> None:
    """Past 20,000 steps the worker fits rollup block means instead of raw points."""
    url, run_id = worker_server, uuid.uuid4()
    httpx.put(
        f"{url}/api/v1/runs/{run_id}",
        json={"project": project, "config": {"total_steps": 200_000, "c_warmup": 500}},
    )
    for lo in range(0, 60_000, 20_000):
        stream(url, run_id, np.arange(lo, lo + 20_000))

    def fitted() -> dict | None:
        body = httpx.get(f"{url}/api/v1/runs/{run_id}/forecast").json()
        return body if (body["fitted_upto_step"] or 0) > 59_000 else None

    body = wait_for(fitted, timeout=60, what="a fit")
    assert body["status"] == "ok"
    assert body["n_points"] < 5_000  # block means, not 60,000 raw points
    assert body["c"] == pytest.approx(C, abs=0.02)
    truth = A / math.sqrt(200_000 + B) + C
    assert body["prediction"]["lo"] <= truth <= body["prediction"]["hi"]


def test_series_choice_history_rows_and_passed_targets(worker_server: str, project: str) -> None:
    """?key= picks the series; every answer and history row names it; one history row per fit;
    passed targets come from the data; a finished run gets no ETA."""
    url, run_id = worker_server, uuid.uuid4()
    base = f"{url}/api/v1/runs/{run_id}"
    httpx.put(base, json={"project": project, "config": {"total_steps": 20_000}})
    steps = np.arange(0, 4000)
    evals = steps[::100]
    body = {"steps": steps.tolist(), "values": {"loss": curve(steps).tolist()}}
    httpx.post(f"{base}/metrics", json=body, timeout=30).raise_for_status()
    eval_body = {"steps": evals.tolist(), "values": {"eval_loss": (curve(evals, 1) + 0.1).tolist()}}
    httpx.post(f"{base}/metrics", json=eval_body, timeout=30).raise_for_status()

    def both_fitted() -> tuple[dict, dict] | None:
        default = httpx.get(f"{base}/forecast").json()
        train = httpx.get(f"{base}/forecast", params={"key": "loss"}).json()
        done = default["key"] == "eval_loss" and (train["fitted_upto_step"] or 0) > 3900
        return (default, train) if done and (default["fitted_upto_step"] or 0) >= 3900 else None

    default, train = wait_for(both_fitted, timeout=60, what="fits of both series")
    assert default["key"] == "eval_loss" and train["key"] == "loss"
    assert default["c"] == pytest.approx(C + 0.1, abs=0.1)
    assert train["c"] == pytest.approx(C, abs=0.05)
    missing = httpx.get(f"{base}/forecast", params={"key": "accuracy"})
    assert missing.status_code == 404 and "accuracy" in missing.json()["message"]
    bad = httpx.get(f"{base}/forecast", params={"key": "no spaces allowed"})
    assert bad.status_code == 422 and "key" in bad.json()["message"]
    # A series the run logs that no fit is made of: not "pending" forever.
    httpx.post(f"{base}/metrics", json={"steps": [1, 2], "values": {"opt/eta": [0.1, 0.2]}},
               timeout=30).raise_for_status()
    for route, params in (("forecast", {}), ("forecast/target", {"loss": 2})):
        unfitted = httpx.get(f"{base}/{route}", params={"key": "opt/eta", **params})
        assert unfitted.status_code == 422, unfitted.text
        assert "'opt/eta' is not forecast" in unfitted.json()["message"]
        assert "fit_key" in unfitted.json()["message"]

    history = httpx.get(f"{base}/forecast/history", params={"key": "loss"}).json()
    assert history["key"] == "loss" and history["points"]
    assert {p["key"] for p in history["points"]} == {"loss"}
    rows = [(p["fitted_upto_step"], p["n_points"], p["status"]) for p in history["points"]]
    assert len(rows) == len(set(rows))  # no fit repeated
    # The default series' history: the key may switch once the evaluation loss has enough
    # points (the training loss was the default before); each row says which it is.
    default_rows = httpx.get(f"{base}/forecast/history").json()["points"]
    assert default_rows[-1]["key"] == "eval_loss"
    assert {p["key"] for p in default_rows} <= {"loss", "eval_loss"}

    # A target the run already passed: answered from the data, never a negative step.
    first = float(curve(steps)[0])
    passed = httpx.get(f"{base}/forecast/target", params={"loss": 2.5, "key": "loss"}).json()
    target = passed["target"]
    assert target["reached"] is True and target["reachable"] is True
    crossing = (A / (2.5 - C)) ** 2 - B  # ~1,850: where the noiseless curve passes 2.5
    assert target["step"] == pytest.approx(crossing, rel=0.1)
    assert target["lo"] == target["hi"] == target["step"]
    assert passed["eta"] is None
    assert first > 2.5  # the series did start above the target
    below_floor = httpx.get(f"{base}/forecast/target", params={"loss": -1}).json()["target"]
    assert below_floor["reachable"] is False and "floor" in below_floor["reason"]
    assert below_floor["step"] is None and below_floor["lo"] is None

    # ~12,300 by the noiseless curve: within the planned 20,000 steps, so an ETA.
    future = httpx.get(f"{base}/forecast/target", params={"loss": 2.25, "key": "loss"}).json()
    assert future["target"]["reachable"] and future["eta"] is not None
    assert future["target"]["reason"] == "" and future["target"]["past_planned_end"] is False
    # ~24,000: past the planned end, so no ETA (the run will not last that long), and why.
    later = httpx.get(f"{base}/forecast/target", params={"loss": 2.2, "key": "loss"}).json()
    assert later["target"]["reachable"] and not later["target"]["reached"]
    assert later["target"]["step"] > 20_000 and later["eta"] is None
    assert later["target"]["past_planned_end"] is True
    assert later["target"]["reason"] == (
        "after the run's planned last step (20,000): not in this run; step is where the fitted "
        "curve puts it, were the run longer")
    assert httpx.patch(base, json={"status": "finished"}).status_code == 200
    finished = httpx.get(f"{base}/forecast/target", params={"loss": 2.25, "key": "loss"}).json()
    assert finished["target"]["step"] == future["target"]["step"]
    assert finished["eta"] is None  # no "current pace" for a run that has ended
    # ... and the answer says the run will not get there: the step is where it was heading.
    last_step = httpx.get(base).json()["last_step"]
    assert finished["target"]["reason"] == (
        f"not reached: the run ended at step {last_step:,} before its smoothed loss got there; "
        "step is where the fitted curve puts it, had the run gone on")
    again = httpx.get(f"{base}/forecast/target", params={"loss": 2.5, "key": "loss"}).json()
    assert again["target"]["reached"] and again["target"]["reason"] == ""  # data: no caveat


def test_a_logged_decaying_learning_rate_makes_the_served_forecast_off_model(
    worker_server: str, project: str
) -> None:
    """The worker reads the learning rate the hook logs (``opt/lr``) with the loss: the same
    loss curve is ``ok`` while the rate is flat and ``off_model`` once it decays, with the step
    the decay began in the message. Long enough to be read from rollup means."""
    url = worker_server
    statuses = {}
    for name, decay_from in (("flat", None), ("cosine", 15_000)):
        run_id = uuid.uuid4()
        base = f"{url}/api/v1/runs/{run_id}"
        httpx.put(base, json={"project": project, "config": {"total_steps": 40_000,
                                                             "c_warmup": 500}})
        steps = np.arange(0, 30_000)
        frac = np.clip((steps - (decay_from or 10**9)) / 25_000, 0.0, 1.0)
        lr = 1e-3 * 0.5 * (1 + np.cos(np.pi * frac))
        for lo in range(0, 30_000, 10_000):
            sl = slice(lo, lo + 10_000)
            body = {"steps": steps[sl].tolist(),
                    "values": {"loss": curve(steps[sl]).tolist(), "opt/lr": lr[sl].tolist()}}
            httpx.post(f"{base}/metrics", json=body, timeout=30).raise_for_status()

        def fitted(base: str = base) -> dict | None:
            answer = httpx.get(f"{base}/forecast").json()
            return answer if (answer["fitted_upto_step"] or 0) > 29_000 else None

        statuses[name] = wait_for(fitted, timeout=60, what=f"the {name} run's fit")
    assert statuses["flat"]["status"] == "ok"
    decayed = statuses["cosine"]
    assert decayed["status"] == "off_model" and decayed["off_model"]
    assert "logged learning rate decays" in decayed["message"]


def test_a_run_whose_loss_went_nan_is_diverged_with_no_forecast(
    worker_server: str, project: str
) -> None:
    """The loss was finite for 400 steps, then NaN (a run at a learning rate far too high): the
    fit of the finite points forecast 75 [32, 177] for step 2,000 with status ``too_early``.
    The series ends in non-finite values: ``diverged``, no forecast, the step in the message;
    the run page's forecast card says so. Finite again, the run is forecast again."""
    url, run_id = worker_server, uuid.uuid4()
    base = f"{url}/api/v1/runs/{run_id}"
    httpx.put(base, json={"project": project, "config": {"total_steps": 2_000, "c_warmup": 50}}
              ).raise_for_status()
    steps = np.arange(0, 1_000)
    values: list[float | str] = curve(steps).tolist()
    values[400:] = ["NaN"] * 600
    httpx.post(f"{base}/metrics", json={"steps": steps.tolist(), "values": {"loss": values}},
               timeout=30).raise_for_status()
    answer = wait_for(lambda: (a := httpx.get(f"{base}/forecast").json())["status"] != "pending"
                      and a, timeout=60, what="a fit")
    assert answer["status"] == "diverged", answer
    assert answer["prediction"]["value"] is None and answer["f_star"]["value"] is None
    assert answer["fitted_upto_step"] == 399 and "not finite after step 399" in answer["message"]
    card = httpx.get(f"{url}/dashboards/api/runs/{run_id}/figures",
                     params={"charts": "loss"}).json()["kpis"]
    forecast_card = next(k for k in card if k["id"] == "forecast")
    assert forecast_card["value"] == "—" and "diverged" in forecast_card["detail"]
    # It recovers (a restart from a checkpoint logging on): forecast again.
    later = np.arange(1_000, 2_000)
    httpx.post(f"{base}/metrics", json={"steps": later.tolist(),
                                        "values": {"loss": curve(later).tolist()}},
               timeout=30).raise_for_status()
    again = wait_for(lambda: (a := httpx.get(f"{base}/forecast").json())["fitted_upto_step"]
                     > 1_900 and a, timeout=60, what="a fit of the finite points")
    assert again["status"] != "diverged" and again["prediction"]["value"] is not None
