"""Encode metric points in PostgreSQL's binary COPY format with numpy (no per-row Python).

A row is (series_id int4, step int8, value float8 | NULL, wall_time float8 | NULL). NaN values
and missing wall times are NULLs, which have a different byte layout, so rows are grouped by
their NULL pattern and each group is packed as one fixed-size numpy record array. COPY does not
care about row order.
"""

from __future__ import annotations

import struct

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
