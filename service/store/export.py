"""A run's points for the CSV export, page by page, in key then step order, at a cost that
grows with the points and not with the keys.

Reading each series with a query of its own cost a session and a round trip per key, so a run
of many one-point keys took far longer than one of millions of points in a few keys. Here the
series are taken in groups: one statement asks the size of up to :data:`GROUP` series, each
counted only up to one page (a large series costs a page's worth of index, not its size);
consecutive series that fit in a page together are read with one statement; a series larger
than a page is read alone, in keyset pages of the primary key. Each page is one short session
of the caller's (no transaction stays open while a slow client reads).
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from curvecast.service.errors import RunNotFound
from curvecast.service.store._common import (
    is_postgres,
    require_series,
    run_created_at,
    run_series,
)

__all__ = ["EXPORT_PAGE", "GROUP", "ExportReader", "ExportRow", "export_series"]

#: Points read per statement: bounds the memory an export holds at any moment.
EXPORT_PAGE = 20_000
#: Series per statement when they are small.
GROUP = 1_000

#: (key, step, value with NaN for a stored NaN, wall time or None)
ExportRow = tuple[str, int, float, float | None]

_PG_IDS = "unnest(CAST(:sids AS BIGINT[])) AS ids(sid)"
_SQLITE_IDS = "(SELECT value AS sid FROM json_each(:sids)) AS ids"
# A count of at most :cap points per series: the inner LIMIT stops the index scan there.
_SIZES = (
    "SELECT ids.sid, (SELECT count(*) FROM (SELECT 1 FROM metric_points"
    " WHERE series_id = ids.sid LIMIT :cap) AS capped) FROM {ids}"
)
_WHOLE = (
    "SELECT series_id, step, value, wall_time FROM metric_points"
    " WHERE series_id IN (SELECT ids.sid FROM {ids}) ORDER BY series_id, step"
)
_SIZES_SQL = {True: text(_SIZES.format(ids=_PG_IDS)), False: text(_SIZES.format(ids=_SQLITE_IDS))}
_WHOLE_SQL = {True: text(_WHOLE.format(ids=_PG_IDS)), False: text(_WHOLE.format(ids=_SQLITE_IDS))}
_KEYSET = text(
    "SELECT step, value, wall_time FROM metric_points WHERE series_id = :sid AND step > :after"
    " ORDER BY step LIMIT :limit"
)


def export_series(
    session: Session, *, run_id: uuid.UUID, keys: Sequence[str] | None, allowed_project: str | None
) -> list[tuple[str, int]]:
    """The (key, series id) pairs of a run an export covers, in key order (``keys`` only, if
    given).

    Raises:
        RunNotFound: no such run, or ``allowed_project`` does not own it.
        NotFound: ``keys`` names a series the run does not have (the message names those it has).
    """
    if run_created_at(session, run_id, allowed_project) is None:
        raise RunNotFound(f"run {run_id} not found")
    found = run_series(session, run_id, keys)
    require_series(session, run_id, keys, dict(found))
    return found


def _ids(session: Session, sids: Sequence[int]) -> Any:
    return list(sids) if is_postgres(session) else json.dumps(list(sids))


class ExportReader:
    """Where an export stands: :meth:`next_page` returns the next points (empty at the end).

    Args:
        series: (key, series id) pairs in the order to export them (:func:`export_series`).
        page: points per statement.
    """

    def __init__(self, series: Sequence[tuple[str, int]], page: int = EXPORT_PAGE) -> None:
        self.series = list(series)
        self.page = page
        self.statements = 0  #: statements sent so far (what the tests and benches count)
        self._position = 0  # the next series to read
        self._after = -1  # the last step read of that series (-1: none yet)
        self._sizes: dict[int, int] = {}  # position -> points, counted up to page + 1

    def next_page(self, session: Session) -> list[ExportRow]:
        """The next page of points, read in ``session``; an empty list once all are read."""
        while self._position < len(self.series):
            if self._after >= 0 or self._size(session, self._position) > self.page:
                rows = self._keyset(session)
            else:
                rows = self._small_series(session)
            if rows:
                return rows
        return []

    def _size(self, session: Session, position: int) -> int:
        if position not in self._sizes:
            group = self.series[position:position + GROUP]
            self.statements += 1
            found: dict[int, int] = dict(session.execute(_SIZES_SQL[is_postgres(session)], {
                "sids": _ids(session, [sid for _, sid in group]), "cap": self.page + 1}).all())
            for offset, (_, sid) in enumerate(group):
                self._sizes[position + offset] = int(found.get(sid, 0))
        return self._sizes[position]

    def _keyset(self, session: Session) -> list[ExportRow]:
        """The next page of the current series (one larger than a page)."""
        key, sid = self.series[self._position]
        self.statements += 1
        rows = session.execute(_KEYSET, {"sid": sid, "after": self._after, "limit": self.page})
        out = [(key, int(step), _value(value), wall) for step, value, wall in rows]
        if len(out) < self.page:
            self._next_series()
        else:
            self._after = out[-1][1]
        return out

    def _small_series(self, session: Session) -> list[ExportRow]:
        """Whole series from the current one on, as many as fit in a page together."""
        start = end = self._position
        total = 0
        while end < len(self.series) and end - start < GROUP:
            size = self._size(session, end)
            if end > start and total + size > self.page:
                break
            total += size
            end += 1
        for position in range(start, end):
            self._sizes.pop(position, None)
        self._position, self._after = end, -1
        group = self.series[start:end]
        self.statements += 1
        rows = session.execute(_WHOLE_SQL[is_postgres(session)],
                               {"sids": _ids(session, [sid for _, sid in group])}).all()
        by_series: dict[int, list[ExportRow]] = {}
        keys = {sid: key for key, sid in group}
        for sid, step, value, wall in rows:  # in (series id, step) order
            by_series.setdefault(int(sid), []).append(
                (keys[int(sid)], int(step), _value(value), wall))
        # In key order (the series' ids are in creation order).
        return [row for _, sid in group for row in by_series.get(sid, ())]

    def _next_series(self) -> None:
        self._sizes.pop(self._position, None)
        self._position += 1
        self._after = -1


def _value(value: float | None) -> float:
    return math.nan if value is None else float(value)
