"""The one cache shape the service uses: least recently used entries dropped first once the
entries' total weight passes a bound, thread-safe, optionally one per database engine.

Three readers keep data between requests or worker rounds (the points a refit reads again, the
alert worker's recent windows, parsed fits); each says in its own module *what* it may trust.
This module holds only the mechanics they share, so that a bound and an eviction order are
written once.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, TypeVar

from sqlalchemy.orm import Session

__all__ = ["BoundedLRU", "PerEngine"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
C = TypeVar("C")


class BoundedLRU(Generic[K, V]):
    """A map that drops its least recently used entries while their total weight is over
    ``max_weight`` (the newest entry is always kept, however heavy).

    Args:
        max_weight: the bound on the sum of ``weight(value)`` over the entries.
        weight: an entry's weight (default 1: ``max_weight`` counts entries).
    """

    def __init__(self, max_weight: int, weight: Callable[[V], int] = lambda _v: 1) -> None:
        self.max_weight = max_weight
        self._weight = weight
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._total = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[K]:
        """The keys held, least recently used first."""
        with self._lock:
            return list(self._entries)

    @property
    def total_weight(self) -> int:
        """The sum of the entries' weights."""
        return self._total

    def get(self, key: K) -> V | None:
        """The entry of ``key`` (now the most recently used), or None."""
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def take(self, key: K) -> V | None:
        """Remove and return the entry of ``key`` (None if absent): for a reader that builds a
        new value from the old one and :meth:`put`\\ s it back."""
        with self._lock:
            value = self._entries.pop(key, None)
            if value is not None:
                self._total -= self._weight(value)
            return value

    def put(self, key: K, value: V) -> None:
        """Keep ``value`` under ``key`` as the most recently used entry."""
        self.put_many([(key, value)])

    def put_many(self, items: Iterable[tuple[K, V]]) -> None:
        """Keep each ``(key, value)``, in order, then drop the least recently used entries
        until the total weight is within the bound."""
        with self._lock:
            for key, value in items:
                old = self._entries.pop(key, None)
                if old is not None:
                    self._total -= self._weight(old)
                self._entries[key] = value
                self._total += self._weight(value)
            while self._total > self.max_weight and len(self._entries) > 1:
                _, dropped = self._entries.popitem(last=False)
                self._total -= self._weight(dropped)


class PerEngine(Generic[C]):
    """One cache per database engine, made by ``factory`` on first use and dropped with the
    engine (tests and benches open many databases in one process; what one holds must never
    answer for another)."""

    def __init__(self, factory: Callable[[], C]) -> None:
        self._factory = factory
        self._lock = threading.Lock()
        self._by_engine: weakref.WeakKeyDictionary[Any, C] = weakref.WeakKeyDictionary()

    def of(self, session: Session) -> C:
        """The cache of ``session``'s engine."""
        return self.of_engine(session.get_bind())

    def of_engine(self, engine: Any) -> C:
        """The cache of ``engine``."""
        with self._lock:
            cache = self._by_engine.get(engine)
            if cache is None:
                cache = self._by_engine[engine] = self._factory()
            return cache
