"""``curvecast sync`` sends the token only to a URL the user named: a spool
copied from elsewhere, whose ``run.json`` names some other host, must not receive it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from curvecast.client._batcher import encode_records
from curvecast.client._spool import Spool
from curvecast.client.sync import resolve_target
from tests import REPO

TOKEN = "cc_secret-token-of-the-user"


class Receiver:
    """A real HTTP server on loopback that answers like the service and records every request's
    method, path and ``Authorization`` header."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str | None]] = []
        received = self.requests

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                received.append((self.command, self.path, self.headers.get("Authorization")))
                body = b'{"accepted": 1, "duplicates": 0}' if self.command == "POST" else b"{}"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_PUT = do_POST = do_PATCH = do_GET = _answer

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def tokens(self) -> set[str | None]:
        return {auth for _, _, auth in self.requests}


@contextmanager
def receiver() -> Iterator[Receiver]:
    rec = Receiver()
    thread = threading.Thread(target=rec.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield rec
    finally:
        rec.server.shutdown()
        rec.server.server_close()
        thread.join(timeout=5)


def spooled_run(root: Path, url: str) -> Path:
    """A run directory as a monitor logging to ``url`` leaves it: run.json and one segment."""
    run_id = str(uuid.uuid4())
    meta = {"run_id": run_id, "project": "copied", "url": url, "status": "finished"}
    spool = Spool(root, run_id, meta=lambda: meta)
    spool.append(encode_records([(1, 0.0, {"loss": 1.0}, None)])[0][0].body)
    spool.close()
    return spool.path


def sync(root: Path, *args: str, env_url: str | None = None,
         token: str | None = TOKEN) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CURVECAST_URL", "CURVECAST_TOKEN")}
    if env_url is not None:
        env["CURVECAST_URL"] = env_url
    if token is not None:
        env["CURVECAST_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "curvecast.client", "sync", str(root), *args],
        env={**env, "PYTHONPATH": str(REPO)}, cwd=REPO, capture_output=True, text=True, timeout=60,
    )


def test_the_token_never_reaches_a_url_only_run_json_names(tmp_path: Path) -> None:
    with receiver() as foreign, receiver() as mine:
        run_dir = spooled_run(tmp_path, foreign.url)

        # No URL named: refused, nothing sent anywhere, the spool kept.
        out = sync(tmp_path)
        assert out.returncode == 2, out.stderr
        assert f"run.json names {foreign.url}" in out.stderr and "--url" in out.stderr
        # $CURVECAST_URL names another service: ambiguous, refused too.
        out = sync(tmp_path, env_url=mine.url)
        assert out.returncode == 2, out.stderr
        assert f"CURVECAST_URL is {mine.url}" in out.stderr
        assert foreign.requests == [] and mine.requests == []
        assert list(run_dir.glob("*.jsonl"))

        # --url says where: the token goes there and only there.
        out = sync(tmp_path, "--url", mine.url, env_url=foreign.url)
        assert out.returncode == 0, out.stderr
        assert foreign.requests == []
        assert mine.tokens == {f"Bearer {TOKEN}"}
        assert [m for m, _, _ in mine.requests] == ["PUT", "POST", "PATCH"]
        assert not run_dir.exists()


def test_without_a_token_the_runs_own_url_is_still_used(tmp_path: Path) -> None:
    with receiver() as service:
        run_dir = spooled_run(tmp_path, service.url)
        out = sync(tmp_path, token=None)
        assert out.returncode == 0, out.stderr
        assert service.tokens == {None} and len(service.requests) == 3
        assert not run_dir.exists()


@pytest.mark.parametrize(
    ("url", "env_url", "token", "target"),
    [
        ("http://named", None, "t", "http://named"),
        ("http://named", "http://env", "t", "http://named"),
        (None, "http://run/", "t", "http://run/"),  # the same service, spelled with a slash
        (None, None, None, "http://run"),
        (None, None, "t", ""),
        (None, "http://env", None, ""),
    ],
)
def test_resolve_target(url: str | None, env_url: str | None, token: str | None,
                        target: str) -> None:
    got, refusal = resolve_target(url, {"url": "http://run"}, token, env_url=env_url or "")
    assert got == target and (refusal is None) == bool(target)
