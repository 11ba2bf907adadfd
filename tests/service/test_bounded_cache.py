"""The service's one cache shape: least recently used entries go first once their weight passes
the bound, and each database engine has a cache of its own."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from curvecast.service.bounded_cache import BoundedLRU, PerEngine


def test_the_least_recently_used_go_first_by_weight() -> None:
    cache: BoundedLRU[str, list[int]] = BoundedLRU(5, weight=len)
    cache.put("a", [1, 2])
    cache.put("b", [1, 2])
    assert cache.get("a") == [1, 2]  # now "b" is the least recently used
    cache.put("c", [1, 2])  # 6 > 5: "b" goes
    assert cache.get("b") is None and cache.get("a") == [1, 2] and cache.get("c") == [1, 2]
    assert cache.total_weight == 4 and len(cache) == 2


def test_the_newest_entry_stays_however_heavy_and_take_removes() -> None:
    cache: BoundedLRU[str, list[int]] = BoundedLRU(3, weight=len)
    cache.put("small", [1])
    cache.put("big", list(range(10)))
    assert len(cache) == 1 and cache.get("big") is not None
    assert cache.take("big") == list(range(10))
    assert cache.take("big") is None and cache.total_weight == 0


def test_replacing_an_entry_counts_its_weight_once() -> None:
    cache: BoundedLRU[str, list[int]] = BoundedLRU(10, weight=len)
    for n in range(1, 6):
        cache.put("a", list(range(n)))
    assert cache.total_weight == 5 and len(cache) == 1


def test_each_engine_has_its_own_cache(tmp_path: Path) -> None:
    caches: PerEngine[BoundedLRU[str, int]] = PerEngine(lambda: BoundedLRU(10))
    one = create_engine(f"sqlite:///{tmp_path / 'one.db'}")
    two = create_engine(f"sqlite:///{tmp_path / 'two.db'}")
    with Session(one) as a, Session(two) as b, Session(one) as a_again:
        caches.of(a).put("k", 1)
        assert caches.of(b).get("k") is None
        assert caches.of(a_again).get("k") == 1
    one.dispose()
    two.dispose()
