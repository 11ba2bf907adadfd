"""The real-server helpers, for the tests that import them from here.

They live in :mod:`tests.support` (benches use them too), the checkout's root in
:mod:`tests`; this module only names them where tests look for them.
"""

from __future__ import annotations

from tests import REPO
from tests.support import (
    ServerProcess,
    free_port,
    serve_app,
    start_server_process,
    thread_server,
)

__all__ = ["REPO", "ServerProcess", "free_port", "serve_app", "start_server_process",
           "thread_server"]
