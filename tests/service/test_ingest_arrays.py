"""The ingest path's array work, without a server: bodies decode exactly as the standard
library decodes them, a batch flattens to what a point-by-point reading of it gives, every rollup
level aggregates as the one-level function does, and binary array parameters reach PostgreSQL
intact."""

from __future__ import annotations

import json
import math
import random
import struct
from typing import Any

import numpy as np
import pytest

from curvecast.service.api._json import loads
from curvecast.service.schemas import MetricBatch
from curvecast.service.store._pgcopy import (
    Float8Array,
    Int2Array,
    Int4Array,
    Int8Array,
    register_array_dumpers,
)
from curvecast.service.store.metrics import _flatten
from curvecast.service.store.rollups import ROLLUP_WIDTHS, aggregate, aggregate_levels


def _outcome(decode: Any, body: bytes) -> str:
    try:
        return f"ok {decode(body)!r}"  # repr: NaN equals NaN, -0.0 differs from 0.0
    except Exception as exc:  # the error must be the same error
        return f"error {type(exc).__name__}: {exc}"


@pytest.mark.parametrize(
    "body",
    [
        b'{"steps": [1, 2], "values": {"loss": [1.5, -0.0, 1e-320, 5e-324]}}',
        b'[2.2250738585072014e-308, 1.7976931348623157e308, 0.1, 1e23, 9007199254740993]',
        b'{"a": [NaN, Infinity, -Infinity]}',  # what Python's json writes
        b'{"a": 1e400}',
        b'{"a": [-1e400, 1E+400]}',
        b'{"a": 123456789012345678901234567890}',
        b'{"a": -9223372036854775809}',
        b'{"a": 18446744073709551615}',
        b'{"a": 1, "a": 2}',
        b'{"\\ud800": 1}',  # an escaped lone surrogate
        b'{"a": "\\udfff\\ud800"}',
        '{"a": "\u00e9\U0001f680"}'.encode(),
        b'\xef\xbb\xbf{"a": 1}',  # UTF-8 byte order mark
        '{"a": "\u00e9"}'.encode("utf-16"),
        '{"a": "\u00e9"}'.encode("utf-16-le"),
        '{"a": 1}'.encode("utf-32"),
        b' \n\t{"a": [] }\r\n',
        b"",
        b"   ",
        b'{"a": [1, 2,]}',
        b'{"a": 01}',
        b'{"a": .5}',
        b'{"a": "\x01"}',  # a raw control character
        b'{"a": tru}',
        b'{"a": 1} x',
        b"\xff\xfe\x00garbage",
        b"[" * 5000 + b"]" * 5000,  # beyond both parsers' nesting limits
        b'{"a": "' + b"x" * 100_000 + b'"}',
    ],
)
def test_bodies_decode_as_the_standard_library_decodes_them(body: bytes) -> None:
    assert _outcome(loads, body) == _outcome(json.loads, body)


def test_every_double_decodes_to_the_same_double() -> None:
    rng = random.Random(19)
    doubles = [struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
               for _ in range(20_000)]
    finite = [x for x in doubles if math.isfinite(x)]
    for text in (json.dumps(finite), json.dumps([f"{x:.17g}" for x in finite]).replace('"', "")):
        assert [struct.pack("<d", x) for x in loads(text.encode())] == [
            struct.pack("<d", x) for x in json.loads(text)]


def _reference(batch: MetricBatch, series_ids: dict[str, int]) -> list[tuple[int, int, str]]:
    """The batch read point by point: a null is no point, the first value of a repeated
    (series, step) wins; sorted by (series, step). Values as repr (NaN == NaN)."""
    first: dict[tuple[int, int], float] = {}
    for key, column in batch.values.items():
        for step, value in zip(batch.steps, column, strict=True):
            if value is not None:
                first.setdefault((series_ids[key], step), float(value))
    return [(sid, step, repr(v)) for (sid, step), v in sorted(first.items())]


@pytest.mark.parametrize("seed", range(30))
def test_a_batch_flattens_to_its_points_in_series_and_step_order(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.choice([0, 1, 2, 7, 100])
    steps = list(range(n)) if seed % 3 else [rng.randrange(5) for _ in range(n)]
    if seed % 3 == 1:
        rng.shuffle(steps)
    choices = [None, math.nan, "NaN", "Infinity", "-Infinity", 1.0, -2.5, 3]
    values = {key: [rng.choice(choices) if rng.random() < 0.3 else rng.random()
                    for _ in range(n)] for key in rng.sample(["loss", "eta", "lr", "acc"], 3)}
    batch = MetricBatch.model_validate(
        {"steps": steps, "values": values,
         "wall_time": [None if rng.random() < 0.2 else 1e9 + i for i in range(n)]})
    series_ids = {key: rng.randrange(1, 1000) for key in batch.values}
    while len(set(series_ids.values())) < len(series_ids):
        series_ids = {key: rng.randrange(1, 1000) for key in batch.values}
    cols = _flatten(batch, series_ids)
    got = list(zip(cols.series_id.tolist(), cols.step.tolist(), map(repr, cols.value.tolist()),
                   strict=True))
    assert got == _reference(batch, series_ids)
    assert cols.n_sent == sum(v is not None for c in batch.values.values() for v in c)
    # The wall time travels with its step (NaN where the batch had none).
    assert cols.wall is not None
    walls = dict(zip(batch.steps, batch.wall_time or [], strict=True)) if len(set(steps)) == n \
        else None
    if walls is not None:
        assert [repr(w) for w in cols.wall.tolist()] == [
            repr(math.nan if walls[s] is None else walls[s]) for s in cols.step.tolist()]


def test_every_level_aggregates_like_one_level_at_a_time() -> None:
    rng = np.random.default_rng(5)
    sid = np.repeat([3, 8, 9], [5000, 1, 20_000])
    step = np.concatenate([np.sort(rng.choice(2_000_000, 5000, replace=False)), [7],
                           np.arange(600_000, 620_000)])
    value = rng.normal(size=len(step))
    value[rng.choice(len(step), 300, replace=False)] = np.nan
    value[rng.choice(len(step), 20, replace=False)] = np.inf
    value[5000:5001] = np.nan  # a block whose only point is NaN
    both = aggregate_levels(sid, step, value)
    for level, width in enumerate(ROLLUP_WIDTHS):
        one = aggregate(sid, step, value, width)
        mine = both.level == level
        for field in one.__dataclass_fields__:
            np.testing.assert_array_equal(getattr(both.blocks, field)[mine], getattr(one, field),
                                          err_msg=f"level {level}, {field}")
    none = np.zeros(0, dtype=np.int64)
    assert len(aggregate_levels(none, none, np.zeros(0)).level) == 0


@pytest.mark.postgres
def test_binary_array_parameters_reach_postgresql_intact(pg_url: str) -> None:
    import psycopg

    values = np.array([0.0, -0.0, 1.5e-308, np.inf, -np.inf, np.nan, 1e308])
    ints = np.array([0, -1, 2**31 - 1, -(2**31)])
    with psycopg.connect(pg_url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        register_array_dumpers(conn)
        register_array_dumpers(conn)  # idempotent
        for _ in range(7):  # past psycopg's prepare threshold: prepared statements too
            row = conn.execute(
                "SELECT %(f)b::text, %(i4)b::text, %(i8)b::text, %(i2)b::text, %(e)b::text",
                {"f": Float8Array(values), "i4": Int4Array(ints),
                 "i8": Int8Array(np.array([2**62, -(2**62)])), "i2": Int2Array(np.array([5])),
                 "e": Float8Array(np.array([]))},
            ).fetchone()
    assert row == ("{0,-0,1.5e-308,Infinity,-Infinity,NaN,1e+308}",
                   "{0,-1,2147483647,-2147483648}",
                   "{4611686018427387904,-4611686018427387904}", "{5}", "{}")
