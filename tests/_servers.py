"""The real-server helpers, for the tests that import them from here.

They live in :mod:`curvecast.service.testing` (benches use them too), the checkout's root in
:mod:`tests`; this module only names them where tests look for them.
"""

from __future__ import annotations

from curvecast.service.testing import (
    ServerProcess,
    free_port,
    serve_app,
    start_server_process,
    thread_server,
)
from tests import REPO

__all__ = ["REPO", "ServerProcess", "free_port", "serve_app", "start_server_process",
           "thread_server"]
