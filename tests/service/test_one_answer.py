"""One run, one answer: the REST API, the offline CLI (on the service's own export) and the pages
give the same fitted key, horizon, burn-in and status, and the runs list forecasts for the
horizon ``GET /forecast`` answers for (all from :mod:`curvecast.contract`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from curvecast.dashboards import fmt
from curvecast.service.config import Settings
from curvecast.sfplus.functional import averaging_weight
from tests import REPO
from tests.support import thread_server, wait_for

CONFIG = {"total_steps": 4_000, "warmup_steps": 50, "c_warmup": 100}
EVAL_EVERY = 25


@pytest.fixture(scope="module")
def worker_server(database_url: str) -> Iterator[str]:
    settings = Settings(database_url=database_url, worker_interval_s=0.1)
    with thread_server(settings) as url:
        yield url


def _stream_run(url: str, project: str) -> uuid.UUID:
    """A run that logs the training loss every step and the eval loss every 25, in one batch."""
    run_id = uuid.uuid4()
    httpx.put(f"{url}/api/v1/runs/{run_id}", json={"project": project, "name": "agree",
                                                    "config": CONFIG}, timeout=30
              ).raise_for_status()
    rng = np.random.default_rng(3)
    steps = np.arange(1, 1_501)
    clean = 20.3 / np.sqrt(steps + 377.0) + 2.07
    loss = clean + rng.normal(0, 0.02, steps.size)
    evals = clean + rng.normal(0, 0.003, steps.size)
    every = steps % EVAL_EVERY == 0
    # The averaging weight as watch() logs it, from the optimizer's own schedule.
    weight_sum, averaging = 0.0, []
    for t in steps.tolist():
        c, weight_sum = averaging_weight(t, 1e-3, weight_sum, c_warmup=CONFIG["c_warmup"], r=0.0,
                                         weight_lr_power=2.0)
        averaging.append(c)
    for batch in ({"steps": steps.tolist(), "values": {"loss": loss.tolist(),
                                                       "opt/c": averaging}},
                  {"steps": steps[every].tolist(), "values": {"eval_loss": evals[every].tolist()}}):
        httpx.post(f"{url}/api/v1/runs/{run_id}/metrics", json=batch, timeout=30
                   ).raise_for_status()
    return run_id


def _api_forecast(url: str, run_id: uuid.UUID, last_step: int) -> dict[str, Any]:
    def fitted_on_everything() -> dict[str, Any] | None:
        # The final fit: of the eval loss, on every point of it.
        answer = httpx.get(f"{url}/api/v1/runs/{run_id}/forecast", timeout=30).json()
        done = answer["key"] == "eval_loss" and answer["fitted_upto_step"] == last_step
        return answer if done else None

    result: dict[str, Any] = wait_for(fitted_on_everything, timeout=60, what="the final fit")
    return result


def _new_run(url: str, project: str, name: str) -> str:
    """A run without config; returns its API base URL."""
    base = f"{url}/api/v1/runs/{uuid.uuid4()}"
    httpx.put(base, json={"project": project, "name": name, "config": {}},
              timeout=30).raise_for_status()
    return base


def _fitted_upto(base: str, step: int) -> dict[str, Any] | None:
    """The run's forecast once a fit reached ``step``, else None (for ``wait_for``)."""
    answer: dict[str, Any] = httpx.get(f"{base}/forecast", timeout=30).json()
    return answer if (answer["fitted_upto_step"] or 0) >= step else None


def _cli(export: Path, *args: str, config: bool = True) -> str:
    given = ["--config", json.dumps(CONFIG)] if config else []
    proc = subprocess.run(
        [sys.executable, "-m", "curvecast.service.forecast.cli", str(export), "--upto", "1",
         *given, *args],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_api_cli_and_pages_agree(worker_server: str, project: str, tmp_path: Path) -> None:
    url = worker_server
    run_id = _stream_run(url, project)
    api = _api_forecast(url, run_id, last_step=1_500)
    horizon = CONFIG["total_steps"]
    assert api["prediction"]["step"] == horizon
    assert api["burn_in"] == CONFIG["c_warmup"] and api["burn_in_source"] == "config:c_warmup"
    assert api["status"] == "ok"

    # The offline CLI on the service's own export, with the run's config.
    export = tmp_path / "metrics.csv"
    export.write_bytes(httpx.get(f"{url}/api/v1/runs/{run_id}/metrics.csv", timeout=30).content)
    text = _cli(export)
    assert re.search(r"^status: (\w+)", text, re.M)[1] == api["status"]  # type: ignore[index]
    assert re.search(r"^series: (\S+)", text, re.M)[1] == api["key"]  # type: ignore[index]
    burn = re.search(r"^burn-in: step ([\d,]+) \((\S+)\)", text, re.M)
    assert burn is not None
    assert float(burn[1].replace(",", "")) == api["burn_in"] and burn[2] == api["burn_in_source"]
    cli = json.loads(_cli(export, "--json"))
    for field in ("status", "n_points", "fitted_upto_step", "prediction", "f_star"):
        assert cli[field] == api[field], field
    assert api["prediction"]["reached"] is None  # the run is not at its planned end yet
    # "Loss at step 1,000?", a step the run is past: the fit's value and the loss logged there.
    api_mid = httpx.get(f"{url}/api/v1/runs/{run_id}/forecast", params={"horizon": 1_000},
                        timeout=30).json()
    assert api_mid["prediction"]["reached"] is not None
    assert json.loads(_cli(export, "--horizon", "1000", "--json"))["prediction"] == (
        api_mid["prediction"])
    # The history at that step: each fit's forecast there, beside the loss logged there for
    # its series (the default series switched from loss to eval_loss mid-run).
    history = httpx.get(f"{url}/api/v1/runs/{run_id}/forecast/history",
                        params={"horizon": 1_000}, timeout=30).json()
    by_key = {p["key"]: p["final"]["reached"] for p in history["points"]}
    assert by_key[api_mid["key"]] == api_mid["prediction"]["reached"]
    assert all(value is not None for value in by_key.values()), by_key
    # Without --config: the export's averaging weight gives c_warmup, so the same fit (it was
    # a fit from a burn-in chosen from the data, another status and forecast).
    text = _cli(export, "--horizon", str(horizon), config=False)
    assert f"averaging start (c_warmup): step {CONFIG['c_warmup']}, read from opt/c" in text
    assert f"burn-in: step {CONFIG['c_warmup']} (config:c_warmup)" in text
    bare = json.loads(_cli(export, "--horizon", str(horizon), "--json", config=False))
    for field in ("status", "n_points", "fitted_upto_step", "prediction", "f_star"):
        assert bare[field] == api[field], field

    # The run page's headline state.
    page = httpx.get(f"{url}/dashboards/api/runs/{run_id}/figures", params={"charts": "loss"},
                     timeout=30).json()["state"]
    assert page["horizon"] == horizon
    assert page["fit_key"] == api["key"]
    assert page["fit_status"] == api["status"]
    assert page["burn_in"] == api["burn_in"]

    # The runs list forecasts the same value for the same step.
    rows = httpx.get(f"{url}/dashboards/api/runs-table", params={"project": project},
                     timeout=30).text
    assert fmt.loss(api["prediction"]["value"]) in rows
    assert f"@ {fmt.short_step(horizon)}" in rows


def test_the_service_fits_the_points_alone_as_the_cli_does(
        worker_server: str, project: str, tmp_path: Path) -> None:
    """A run without ``c_warmup`` whose loss sits on a plateau before it falls: the refits made
    on the plateau chose an early burn-in, and a refit warm-started from them kept it for good
    (``no_asymptote``, burn-in ``warm_start``). The worker fits the points alone: its answer is
    the CLI's on the run's export, with the burn-in the data give."""
    base = _new_run(worker_server, project, "plateau")
    rng = np.random.default_rng(1)
    steps = np.arange(10, 3_001, 10)
    fall = 2.0 + 9.0 / np.sqrt(np.maximum(steps - 900, 0) + 81.0)
    loss = np.where(steps < 900, 3.0 + 0.05 * np.sin(steps / 50), fall)
    loss = loss + rng.normal(0, 0.01, steps.size)

    def post(part: np.ndarray) -> None:
        httpx.post(f"{base}/metrics", json={"steps": steps[part].tolist(),
                                            "values": {"loss": loss[part].tolist()}},
                   timeout=30).raise_for_status()

    post(steps < 900)
    wait_for(lambda: _fitted_upto(base, 890), timeout=60, what="a fit of the plateau")
    post(steps >= 900)
    api = wait_for(lambda: _fitted_upto(base, 3_000), timeout=60, what="the fit of every point")
    export = tmp_path / "metrics.csv"
    export.write_bytes(httpx.get(f"{base}/metrics.csv", timeout=30).content)
    cli = json.loads(_cli(export, "--json", config=False))
    for field in ("status", "n_points", "fitted_upto_step", "a", "b", "c", "prediction",
                  "f_star"):
        assert cli[field] == api[field], field
    assert api["status"] == "ok" and api["burn_in_source"] == "data" and api["burn_in"] > 800
    assert f"burn-in: step {api['burn_in']:,.0f} (data)" in _cli(export, config=False)


def test_a_resumed_run_s_repeated_steps_fit_as_the_service_stores_them(
        worker_server: str, project: str, tmp_path: Path) -> None:
    """A run resumed from its step-1,200 checkpoint after a crash at 2,000 logs steps 1,201 to
    2,000 twice, on another trajectory the second time. The service keeps the first value of a
    step; the CLI, on the log as the run wrote it (a step,loss file with the repeats), fits the
    same points and says that it left the later rows out."""
    base = _new_run(worker_server, project, "resumed")
    rng = np.random.default_rng(5)
    first = np.arange(10, 2_001, 10)
    again = np.arange(1_210, 3_001, 10)
    first_loss = 9.0 / np.sqrt(first + 200.0) + 2.0 + rng.normal(0, 0.01, first.size)
    # The resumed trajectory sits visibly lower: fitting both copies would move the fit.
    again_loss = 9.0 / np.sqrt(again + 200.0) + 1.9 + rng.normal(0, 0.01, again.size)
    rows = [(int(s), float(v)) for s, v in zip(first, first_loss, strict=True)]
    rows += [(int(s), float(v)) for s, v in zip(again, again_loss, strict=True)]
    for part in (rows[:first.size], rows[first.size:]):
        httpx.post(f"{base}/metrics", json={"steps": [s for s, _ in part],
                                            "values": {"loss": [v for _, v in part]}},
                   timeout=30).raise_for_status()
    # The last step is 3,000: a fit that reached it fitted every point.
    api = wait_for(lambda: _fitted_upto(base, 3_000), timeout=60, what="the fit of every point")
    log_file = tmp_path / "train_log.csv"
    log_file.write_text("step,loss\n" + "".join(f"{s},{v!r}\n" for s, v in rows))
    proc = subprocess.run(
        [sys.executable, "-m", "curvecast.service.forecast.cli", str(log_file), "--json"],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    repeated = int(np.isin(again, first).sum())
    assert f"note: {repeated:,} row(s) of loss repeat an earlier step" in proc.stderr
    cli = json.loads(proc.stdout)
    for field in ("status", "n_points", "fitted_upto_step", "a", "b", "c", "prediction", "f_star"):
        assert cli[field] == api[field], field
