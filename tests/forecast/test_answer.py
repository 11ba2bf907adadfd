"""The one answer builder: default horizon from the contract, pending, target ETA, the band,
and the offline CLI reading a run config exactly as the server does."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from curvecast.contract import ForecastStatus, RunConfig
from curvecast.service.forecast import Fit
from curvecast.service.forecast.answer import (
    band,
    forecast_answer,
    history_answer,
    offline_json,
    target_answer,
)
from curvecast.service.forecast.cli import forecast_result, main
from curvecast.service.forecast.solver import fit_curve
from curvecast.service.schemas.forecast import OFFLINE_KEYS

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _fit() -> Fit:
    t = np.arange(100, 3000, 10, dtype=float)
    y = 20.3 / np.sqrt(t + 377) + 2.07 + np.random.default_rng(1).normal(0, 0.003, t.size)
    return fit_curve(t, y)


def test_reading_a_fit_does_not_load_scipy() -> None:
    code = (
        "import sys\n"
        "import curvecast.service.forecast.answer, curvecast.service.forecast.fit\n"
        "assert 'scipy' not in sys.modules, 'scipy was imported'\n"
        "assert not any(m.startswith('fastapi') for m in sys.modules), 'fastapi was imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


def test_default_horizon_is_the_contracts() -> None:
    fit = _fit()
    planned = forecast_answer(fit, config=RunConfig(total_steps=20_000), last_step=2_990)
    assert planned.prediction is not None and planned.prediction.step == 20_000
    unplanned = forecast_answer(fit, config=RunConfig(), last_step=2_990)
    assert unplanned.prediction is not None and unplanned.prediction.step == 2_990
    assert forecast_answer(fit, config=RunConfig(), last_step=None).prediction is None
    chosen = forecast_answer(fit, config=RunConfig(total_steps=20_000), last_step=1, horizon=5)
    assert chosen.prediction is not None and chosen.prediction.step == 5


def test_a_step_before_the_fitted_range_has_no_forecast_and_says_why() -> None:
    """The reported bug: on the demo run (burn-in to step 750, fitted from 760) "loss at step
    700?" answered 2.20 [1.98, 2.52], the fitted curve extended backwards, while the eval loss
    logged there was 1.85; at 500 the curve is undefined (t + b < 0) and the answer was null
    without a reason. Before the fitted range there is no forecast, and the message says why
    and where the data are."""
    t = np.arange(760.0, 2001.0, 20.0)
    y = 8.94 / np.sqrt(t - 632.9) + 1.11 + np.random.default_rng(2).normal(0, 0.004, t.size)
    fit = fit_curve(t, y)
    assert fit.fitted_from_step == 760
    for step in (500, 700, 759):
        p = fit.predict(step)
        assert math.isnan(p.value) and math.isnan(p.lo) and math.isnan(p.hi)
        out = forecast_answer(fit, config=RunConfig(total_steps=2000), last_step=2000,
                              horizon=step)
        assert out.prediction is not None and out.prediction.value is None
        assert out.message.endswith(
            f"step {step} is before the fitted range (steps 760 to 2000): the model describes "
            "the loss from there on, not before; the loss the run had there is in GET "
            ".../metrics")
    # With the loss logged there (the caller read it), the answer carries it and says so.
    logged = forecast_answer(fit, config=RunConfig(total_steps=2000), last_step=2000,
                             horizon=700, reached=lambda _key, _step: 1.85)
    assert logged.prediction is not None and logged.prediction.reached == 1.85
    assert logged.message.endswith("the loss the run had there is in prediction.reached")
    values, _, _ = fit.predict_many([700, 760, 1000])
    assert math.isnan(values[0]) and np.isfinite(values[1:]).all()
    assert values[1:] == pytest.approx([fit.predict(760).value, fit.predict(1000).value])
    inside = forecast_answer(fit, config=RunConfig(total_steps=2000), last_step=2000, horizon=760)
    assert inside.prediction is not None and inside.prediction.value is not None
    assert "before the fitted range" not in inside.message


def test_no_fit_is_pending_everywhere() -> None:
    out = forecast_answer(None, config=RunConfig(total_steps=10), last_step=5, key="loss")
    assert out.status == ForecastStatus.PENDING and out.prediction is None and out.f_star is None
    assert out.key == "loss" and "no fit yet" in out.message
    ans = target_answer(None, loss=2.0, confidence=0.9, key="loss", last_step=5,
                        steps_per_second=1.0, now=NOW)
    assert ans.status == ForecastStatus.PENDING and ans.target is None and ans.eta is None
    assert all(math.isnan(v) for v in band(None, [1.0, 2.0]).mid)


def test_target_eta_counts_from_the_last_step() -> None:
    fit = _fit()
    ans = target_answer(fit, loss=2.3, confidence=0.9, key="loss", last_step=2_990,
                        steps_per_second=10.0, now=NOW)
    assert ans.target is not None and ans.target.step is not None and ans.eta is not None
    assert ans.eta.seconds == pytest.approx(max(0.0, (ans.target.step - 2_990) / 10.0))
    assert ans.eta.at is not None and ans.eta.at >= NOW
    no_rate = target_answer(fit, loss=2.3, confidence=0.9, key="loss", last_step=2_990,
                            steps_per_second=None, now=NOW)
    assert no_rate.eta is not None and no_rate.eta.seconds is None and no_rate.eta.at is None


def test_a_target_past_the_planned_end_gets_a_reason_and_no_eta() -> None:
    """A time "at the current pace" past ``total_steps`` is one the run will not last."""
    fit = _fit()
    free = target_answer(fit, loss=2.3, confidence=0.9, key="loss", last_step=2_990,
                         steps_per_second=10.0, now=NOW)
    assert free.target is not None and free.target.step is not None
    step = free.target.step
    before = target_answer(fit, loss=2.3, confidence=0.9, key="loss", last_step=2_990,
                           steps_per_second=10.0, now=NOW, total_steps=round(step) + 1)
    assert before == free  # the run is planned to get there: the same answer
    after = target_answer(fit, loss=2.3, confidence=0.9, key="loss", last_step=2_990,
                          steps_per_second=10.0, now=NOW, total_steps=round(step) - 1)
    assert after.eta is None and after.target is not None
    assert after.target.step == step and after.target.reachable and not after.target.reached
    assert after.target.past_planned_end and not free.target.past_planned_end
    assert after.target.reason.startswith(
        f"after the run's planned last step ({round(step) - 1:,}): not in this run")
    # A run that ended: the reason is that it ended, planned end or not.
    ended = target_answer(fit, loss=2.3, confidence=0.9, key="loss", last_step=2_990,
                          steps_per_second=10.0, now=NOW, finished=True,
                          total_steps=round(step) - 1)
    assert ended.eta is None and ended.target is not None
    assert ended.target.reason.startswith("not reached: the run ended at step 2,990")
    assert ended.target.past_planned_end  # a fact about the plan, whatever the run's status


def test_band_matches_single_predictions() -> None:
    fit = _fit()
    steps = [3_000.0, 10_000.0, 20_000.0]
    b = band(fit, steps, 0.8)
    for i, step in enumerate(steps):
        p = fit.predict(step, 0.8)
        assert (b.lo[i], b.mid[i], b.hi[i]) == (p.lo, p.value, p.hi)


@dataclass(frozen=True)
class _Stored:
    fit: Fit
    created_at: datetime
    key: str = "eval_loss"


def test_history_uses_the_same_horizon() -> None:
    fit = _fit()
    run_id = uuid.uuid4()
    hist = history_answer(run_id, [_Stored(fit, NOW)], config=RunConfig(), last_step=4_000)
    assert hist.horizon == 4_000 and hist.points[0].final is not None
    assert hist.points[0].final == forecast_answer(fit, config=RunConfig(),
                                                   last_step=4_000).prediction


def test_cli_reads_the_config_like_the_server(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    t = np.arange(0, 3000, 10, dtype=float)
    y = 20.3 / np.sqrt(t + 377) + 2.07
    config = RunConfig.read({"c_warmup": 600, "total_steps": 20_000})
    out, fit = forecast_result(t.tolist(), y.tolist(), cut=3000, horizon=None, target=None,
                               confidence=0.9, config=config)
    assert fit.burn_in == 600 and fit.burn_in_source == "config:c_warmup"
    served = fit_curve(t, y, config={"c_warmup": 600, "total_steps": 20_000})
    api = offline_json(forecast_answer(served, config=config, last_step=2_990))
    assert out == api and set(out) == OFFLINE_KEYS
    assert out["prediction"]["step"] == 20_000

    p = tmp_path / "run.json"
    p.write_text(json.dumps({"step": t.tolist(), "loss": y.tolist()}))
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"c_warmup": 600, "total_steps": 20_000}))
    assert main([str(p), "--upto", "1", "--config", str(cfg), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == api
    assert main([str(p), "--upto", "1", "--config", "[1]"]) == 2
    assert "--config" in capsys.readouterr().err
