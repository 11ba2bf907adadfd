"""PostgreSQL's binary formats, encoded with numpy (no per-row Python): whole columns as array
parameters (:class:`PgArray`, what ingest sends), and rows for ``COPY`` (:func:`encode_rows`:
ingest's batches of new points, and the raw-COPY baseline of ``bench/service/ingest.py``).

A COPY row is (series_id int4, step int8, value float8 | NULL, wall_time float8 | NULL). NaN
values and missing wall times are NULLs, which have a different byte layout, so rows are grouped
by their NULL pattern and each group is packed as one fixed-size numpy record array. COPY does
not care about row order.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
_TRAILER = struct.pack(">h", -1)


def _dtype(value_null: bool, wall_null: bool) -> np.dtype:
    fields: list[tuple[str, str]] = [
        ("nfields", ">i2"), ("sid_len", ">i4"), ("sid", ">i4"), ("step_len", ">i4"),
        ("step", ">i8"), ("value_len", ">i4"),
    ]  # fmt: skip
    if not value_null:
        fields.append(("value", ">f8"))
    fields.append(("wall_len", ">i4"))
    if not wall_null:
        fields.append(("wall", ">f8"))
    return np.dtype(fields)


def encode_rows(
    series_id: np.ndarray, step: np.ndarray, value: np.ndarray, wall: np.ndarray | None
) -> bytes:
    """The complete COPY ... (FORMAT BINARY) payload for these rows.

    Args:
        series_id: int array. step: int array. value: float64 array, NaN meaning NULL.
        wall: float64 array (NaN meaning NULL) or None when no row has a wall time.
    """
    value_null = np.isnan(value)
    wall_null = np.isnan(wall) if wall is not None else np.ones(len(step), dtype=bool)
    chunks = [_HEADER]
    for v_null in (False, True):
        for w_null in (False, True):
            mask = (value_null == v_null) & (wall_null == w_null)
            n = int(mask.sum())
            if n == 0:
                continue
            rec = np.empty(n, dtype=_dtype(v_null, w_null))
            rec["nfields"] = 4
            rec["sid_len"] = 4
            rec["sid"] = series_id[mask]
            rec["step_len"] = 8
            rec["step"] = step[mask]
            rec["value_len"] = -1 if v_null else 8
            if not v_null:
                rec["value"] = value[mask]
            rec["wall_len"] = -1 if w_null else 8
            if not w_null:
                assert wall is not None
                rec["wall"] = wall[mask]
            chunks.append(rec.tobytes())
    chunks.append(_TRAILER)
    return b"".join(chunks)


# --- Binary array parameters -------------------------------------------------------------------
#
# A query parameter holding a whole numpy column, sent in PostgreSQL's binary array format
# (built by numpy, no per-element Python): psycopg's own list dumper walks every element in
# Python, which made the rollup upsert a large share of ingest's CPU (BENCHMARKS.md, "Load on
# PostgreSQL").


class PgArray:
    """A one-dimensional array parameter, pre-encoded; pass it with a ``%(name)b`` placeholder
    to a connection that :func:`register_array_dumpers` prepared."""

    __slots__ = ("payload",)

    #: (element type oid, array type oid, numpy big-endian dtype); set by each subclass.
    elem_oid = 0
    array_oid = 0
    dtype = ""

    def __init__(self, values: np.ndarray) -> None:
        n = len(values)
        if n == 0:
            self.payload = struct.pack(">iii", 0, 0, self.elem_oid)
            return
        rec = np.empty(n, dtype=[("len", ">i4"), ("v", self.dtype)])
        rec["len"] = np.dtype(self.dtype).itemsize
        rec["v"] = values
        # One dimension, no NULL elements (NaN travels as NaN; SQL turns it into NULL where the
        # column means that), lower bound 1.
        self.payload = struct.pack(">iiiii", 1, 0, self.elem_oid, n, 1) + rec.tobytes()


class Int2Array(PgArray):
    elem_oid, array_oid, dtype = 21, 1005, ">i2"


class Int4Array(PgArray):
    elem_oid, array_oid, dtype = 23, 1007, ">i4"


class Int8Array(PgArray):
    elem_oid, array_oid, dtype = 20, 1016, ">i8"


class Float8Array(PgArray):
    elem_oid, array_oid, dtype = 701, 1022, ">f8"


def register_array_dumpers(conn: Any) -> None:
    """Teach a psycopg connection to send :class:`PgArray` parameters (idempotent, cheap)."""
    from psycopg.adapt import Dumper
    from psycopg.pq import Format

    adapters = conn.adapters
    if getattr(adapters, "_curvecast_arrays", False):
        return
    for cls in (Int2Array, Int4Array, Int8Array, Float8Array):

        class _Dumper(Dumper):
            format = Format.BINARY
            oid = cls.array_oid

            def dump(self, obj: PgArray) -> bytes:
                return obj.payload

        adapters.register_dumper(cls, _Dumper)
    adapters._curvecast_arrays = True
