"""Which series a forecast fits (pure choice)."""

from curvecast.contract import MIN_EVAL_POINTS
from curvecast.contract import fit_key as choose_fit_key


def test_eval_loss_preferred_once_it_has_enough_points() -> None:
    assert choose_fit_key({"loss": 500, "eval_loss": 3}, {}) == "loss"
    assert choose_fit_key({"loss": 500, "eval_loss": MIN_EVAL_POINTS}, {}) == "eval_loss"
    assert choose_fit_key({"val_loss": 50, "loss": 10}, {}) == "val_loss"


def test_config_fit_key_wins_and_missing_series_fall_back() -> None:
    assert choose_fit_key({"loss": 5, "my/loss": 2}, {"fit_key": "my/loss"}) == "my/loss"
    assert choose_fit_key({"loss": 5}, {"fit_key": "absent"}) == "loss"
    assert choose_fit_key({"eval_loss": 2}, {}) == "eval_loss"  # the only candidate there is
    assert choose_fit_key({"accuracy": 9}, {}) is None
