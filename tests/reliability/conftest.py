"""Fixtures of the reliability tests: a private PostgreSQL cluster that may be stopped."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import IN_CI
from tests.support.pgcluster import PrivateCluster, find_bindir


@pytest.fixture
def private_pg() -> Iterator[PrivateCluster]:
    """A throwaway PostgreSQL cluster of this test's own (never the shared one on :5432)."""
    bindir = find_bindir()
    if bindir is None:
        message = "initdb/pg_ctl not found (set CURVECAST_PG_BINDIR)"
        if IN_CI:
            pytest.fail(f"a private PostgreSQL cluster is required under CI=true: {message}",
                        pytrace=False)
        pytest.skip(message)
    cluster = PrivateCluster(bindir)
    try:
        cluster.create()
    except Exception as exc:
        cluster.destroy()
        if IN_CI:
            raise
        pytest.skip(f"cannot create a private PostgreSQL cluster: {exc}")
    try:
        yield cluster
    finally:
        cluster.destroy()
