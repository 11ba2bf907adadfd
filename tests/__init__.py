"""curvecast's tests. Shared helpers: :mod:`curvecast.service.testing` (servers, databases)."""

from pathlib import Path

#: The repository checkout the tests run from.
REPO = Path(__file__).resolve().parent.parent
