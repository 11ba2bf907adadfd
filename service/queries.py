"""Query parameters the REST API and the pages read alike: a series to forecast (``?key=``) and
a list of metric keys (``?keys=``), declared and checked once so both answer a bad value with
the same message."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query

from curvecast.contract import KEY_MAX_LENGTH, KEY_PATTERN, is_valid_key
from curvecast.service.errors import InvalidInput

#: ``?key=``: the series to forecast (None: the run's default series).
SeriesKey = Annotated[
    str | None,
    Query(min_length=1, max_length=KEY_MAX_LENGTH, pattern=KEY_PATTERN,
          description="The series to forecast (default: an evaluation loss with enough points, "
          "else loss; or the config's fit_key)"),
]


def parse_keys(keys: list[str] | None) -> list[str] | None:
    """The keys a ``keys`` query names (None: none named), each checked.

    Raises:
        InvalidInput: a key that is not a valid metric name (its index in the message).
    """
    if not keys:
        return None
    parsed = [k.strip() for part in keys for k in part.split(",") if k.strip()]
    if not parsed:
        return None
    for index, key in enumerate(parsed):
        if not is_valid_key(key):
            raise InvalidInput(f"keys[{index}]: {key!r} does not match {KEY_PATTERN}")
    return parsed
