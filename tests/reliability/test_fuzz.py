"""Schemathesis over the whole OpenAPI schema against a real server, on SQLite and PostgreSQL:
no 5xx, every response as documented, schema-violating input refused. A bounded, seeded run
(the long one is ``python -m bench run fuzz``; its results are in BENCHMARKS.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.service.fuzz import BOUNDED_EXAMPLES, BOUNDED_SEED, fuzz_url
from curvecast.service.migrate import upgrade

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_schemathesis_finds_nothing(backend: str, tmp_path: Path,
                                    request: pytest.FixtureRequest) -> None:
    if backend == "postgres":
        database_url = str(request.getfixturevalue("fresh_pg_url"))
    else:
        database_url = f"sqlite:///{tmp_path / 'fuzz.db'}"
    upgrade(database_url)
    run = fuzz_url(database_url, tmp_path, label=backend, auth=False,
                   max_examples=BOUNDED_EXAMPLES, seed=BOUNDED_SEED)
    assert run.operations is not None and run.operations >= 20, run.output[-3000:]
    assert run.ok, (
        f"schemathesis: exit {run.returncode}, {run.failures} failures, "
        f"{run.server_tracebacks} server tracebacks\n{run.output[-15_000:]}\n"
        f"--- server log ---\n{run.server_log[-5_000:]}"
    )
