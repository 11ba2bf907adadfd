"""Real servers for tests: uvicorn in a thread (fast) or in a subprocess (killable)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn
from fastapi import FastAPI

from curvecast.service.app import create_app
from curvecast.service.config import Settings

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until_healthy(
    url: str, timeout: float = 30.0, proc: subprocess.Popen[bytes] | None = None
) -> None:
    """Poll /healthz until it answers 200 (a readiness condition, not a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before becoming healthy")
        try:
            if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not become healthy within {timeout}s")


@contextmanager
def serve_app(app: FastAPI, port: int = 0) -> Iterator[str]:
    """Run ``app`` under uvicorn on a loopback port (``0``: a free one) in a background thread."""
    # IPPROTO_TCP explicitly: asyncio only sets TCP_NODELAY on sockets it can tell are TCP,
    # and without it every small test request waits out a delayed ACK (~40 ms).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    # A given port may have just been used by a stopped server of the same test.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@contextmanager
def thread_server(settings: Settings, port: int = 0) -> Iterator[str]:
    """Run the real app for ``settings`` on a loopback port in a background thread."""
    with serve_app(create_app(settings), port) as url:
        yield url


@dataclass
class ServerProcess:
    """A ``curvecast serve`` subprocess."""

    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path

    def kill(self) -> None:
        """SIGKILL: no shutdown handlers run, like a crash."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        """Graceful stop."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        """What the server printed."""
        return self.log_path.read_text(errors="replace")


def start_server_process(
    database_url: str,
    log_dir: Path,
    *,
    port: int | None = None,
    env: dict[str, str] | None = None,
    extra_args: list[str] | None = None,
) -> ServerProcess:
    """Start ``curvecast serve`` on a loopback port and wait until it is healthy."""
    port = port or free_port()
    log_path = log_dir / f"server-{port}-{time.monotonic_ns()}.log"
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    cmd = [
        sys.executable,
        "-m",
        "curvecast.service.cli",
        "serve",
        "--port",
        str(port),
        "--database-url",
        database_url,
        *(extra_args or []),
    ]
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=full_env, stdout=log_file, stderr=subprocess.STDOUT
        )
    server = ServerProcess(url=f"http://127.0.0.1:{port}", port=port, proc=proc, log_path=log_path)
    try:
        wait_until_healthy(server.url, proc=proc)
    except Exception:
        server.stop()
        raise RuntimeError(f"server failed to start:\n{server.log()}") from None
    return server
