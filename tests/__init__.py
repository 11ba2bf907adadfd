"""curvecast's tests. Shared helpers: :mod:`tests.support` (servers, databases)."""

from pathlib import Path

#: The repository checkout the tests run from.
REPO = Path(__file__).resolve().parent.parent
