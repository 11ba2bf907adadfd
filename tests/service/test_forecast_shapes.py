"""The REST forecast and `curvecast forecast --json` share one JSON shape where they overlap."""

from __future__ import annotations

import httpx
import numpy as np

from curvecast.contract import ForecastStatus, RunConfig
from curvecast.service.config import Settings
from curvecast.service.forecast.answer import forecast_answer
from curvecast.service.forecast.cli import forecast_result
from tests.support import thread_server


def test_api_and_cli_payloads_agree() -> None:
    steps = np.arange(100, 3000, 10, dtype=float)
    losses = (
        20.3 / np.sqrt(steps + 377) + 2.07 + np.random.default_rng(1).normal(0, 0.003, len(steps))
    )
    cli, fit = forecast_result(
        steps.tolist(), losses.tolist(), cut=3000, horizon=20_000, target=2.2, confidence=0.9
    )
    api = forecast_answer(
        fit, config=RunConfig(), last_step=None, horizon=20_000, confidence=0.9, target_loss=2.2
    ).model_dump()
    assert set(cli) <= set(api)
    for key, value in cli.items():
        assert api[key] == value, key


def test_shapes_agree_without_a_forecast() -> None:
    cli, fit = forecast_result(
        [1.0, 2.0], [3.0, 2.9], cut=10, horizon=100, target=None, confidence=0.9
    )
    assert fit.status == "insufficient_data"
    api = forecast_answer(
        fit, config=RunConfig(), last_step=None, horizon=100, confidence=0.9
    ).model_dump()
    for key, value in cli.items():
        assert api[key] == value, key


def test_the_openapi_schema_lists_the_forecast_statuses_as_one_enum(sqlite_url: str) -> None:
    """Every forecast answer's ``status`` is the contract's ``ForecastStatus``: the schema a
    real server publishes names exactly its values, and the answers carry them as strings."""
    with thread_server(Settings(database_url=sqlite_url, worker_enabled=False)) as url:
        schema = httpx.get(f"{url}/openapi.json", timeout=30).json()
    schemas = schema["components"]["schemas"]
    for answer in ("ForecastOut", "TargetAnswer", "ForecastHistoryPoint"):
        ref = schemas[answer]["properties"]["status"]["$ref"]
        status = schemas[ref.rsplit("/", 1)[-1]]
        assert status["type"] == "string", answer
        assert status["enum"] == [s.value for s in ForecastStatus], answer
    assert [s.value for s in ForecastStatus] == [
        "ok", "too_early", "no_asymptote", "off_model", "flat", "insufficient_data", "diverged",
        "no_convergence", "pending"]
    pending = forecast_answer(None, config=RunConfig(), last_step=None)
    assert pending.model_dump(mode="json")["status"] == "pending"
    assert pending.model_dump_json().count('"status":"pending"') == 1
