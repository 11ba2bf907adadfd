"""Fits parsed from their stored JSON, kept per database for the life of the process: the
forecast reads and the worker's refits share them, so a fit's JSON is parsed once.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import event, select
from sqlalchemy.orm import Session

from curvecast.service.bounded_cache import BoundedLRU, PerEngine
from curvecast.service.errors import RunNotFound
from curvecast.service.forecast.fit import Fit
from curvecast.service.models import FitRecord
from curvecast.service.store._common import as_utc

__all__ = ["ParsedFits", "parsed_fits"]

#: A fit row: (fit id, run id, creation time).
_Ident = tuple[int, uuid.UUID, datetime]


class ParsedFits:
    """Fits parsed from their JSON, kept per database by (fit id, run id, creation time).

    A fit row is written once and never updated, so its parsed :class:`Fit` can be reused for
    as long as the process lives. The run id and creation time in the key guard against SQLite
    reusing the id of a deleted newest row. Bounded (least recently used goes first;
    :mod:`curvecast.service.bounded_cache`) and thread-safe: requests run in a thread pool.
    """

    def __init__(self, size: int = 4096) -> None:
        self._caches: PerEngine[BoundedLRU[_Ident, Fit]] = PerEngine(lambda: BoundedLRU(size))

    def get(self, session: Session, fit_id: int, run_id: uuid.UUID, created: datetime) -> Fit:
        """The parsed fit of row ``fit_id``, read from the database only on first use."""
        fit = self.get_many(session, [(fit_id, run_id, created)]).get(fit_id)
        if fit is None:  # the run was deleted between the two reads
            raise RunNotFound(f"run {run_id} not found")
        return fit

    def remember_on_commit(self, session: Session, records: list[FitRecord]) -> None:
        """Keep the parsed fits of ``records`` (flushed, so with their ids) once ``session``
        commits; nothing is kept if it rolls back. Parsed from the stored JSON, so a cached fit
        is exactly what a read of the row would give."""
        engine = session.get_bind()
        parsed = [((r.id, r.run_id, as_utc(r.created_at)), Fit.from_dict(r.fit))
                  for r in records]

        event.listen(session, "after_commit", lambda _s: self._keep(engine, parsed), once=True)

    def _keep(self, engine: Any, parsed: list[tuple[_Ident, Fit]]) -> None:
        """Add ``(key, fit)`` pairs to ``engine``'s fits, dropping the least recently used."""
        self._caches.of_engine(engine).put_many(parsed)

    def get_many(self, session: Session, idents: list[tuple[int, uuid.UUID, datetime]]
                 ) -> dict[int, Fit]:
        """The parsed fits of rows ``(fit id, run id, created_at)``, by fit id; the ones not
        seen before are read in one statement. A row deleted meanwhile is left out."""
        engine = session.get_bind()
        fits = self._caches.of_engine(engine)
        found: dict[int, Fit] = {}
        for ident in idents:
            fit = fits.get(ident)
            if fit is not None:
                found[ident[0]] = fit
        missing = {ident[0]: ident for ident in idents if ident[0] not in found}
        if not missing:
            return found
        rows = session.execute(
            select(FitRecord.id, FitRecord.fit).where(FitRecord.id.in_(missing))).all()
        parsed = {fit_id: Fit.from_dict(data) for fit_id, data in rows}
        self._keep(engine, [(missing[fit_id], fit) for fit_id, fit in parsed.items()])
        return found | parsed


parsed_fits = ParsedFits()
