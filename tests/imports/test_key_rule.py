"""The one rule by which another tracker's metric names become curvecast keys."""

from __future__ import annotations

import pytest

from curvecast.contract import KEY_MAX_LENGTH, is_valid_key, key_for_name
from curvecast.service.importers.batches import typed_param


@pytest.mark.parametrize(("name", "key"), [
    ("Loss/train", "Loss/train"),        # a valid key stays as it is
    ("eval/loss", "eval/loss"),
    ("_private", "_private"),
    ("train loss", "train_loss"),
    ("acc@1", "acc_1"),
    ("loss (val)", "loss_val"),
    ("  loss  ", "loss"),
    ("métrique/entropie", "m_trique/entropie"),
    ("@@@", None),
])
def test_names_map_to_keys(name: str, key: str | None) -> None:
    assert key_for_name(name) == key


def test_long_names_are_cut_to_a_valid_key() -> None:
    key = key_for_name("x y" * 200)
    assert key is not None and len(key) == KEY_MAX_LENGTH and is_valid_key(key)


@pytest.mark.parametrize(("text", "value"), [
    ("1000", 1000), ("-3", -3), ("0.1", 0.1), ("1e-4", 1e-4), ("true", True), ("False", False),
    ("nan", "nan"), ("inf", "inf"), ("adamw", "adamw"), ("[1, 2]", "[1, 2]"),
])
def test_params_read_as_the_numbers_they_spell(text: str, value: object) -> None:
    assert typed_param(text) == value
