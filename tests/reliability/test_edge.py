"""What is refused at the edge, from the headers, before a body is read.

Writes are authenticated before their body is read; config step counts are bounded by the
contract's ``MAX_STEP``; ``Host`` names, cross-site state changes, login CSRF and a POST-only
logout; and ``/readyz`` tells an anonymous caller nothing about the database.
"""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
import pytest

from curvecast.client._validate import check_config
from curvecast.contract import MAX_STEP
from curvecast.service.app import create_app
from curvecast.service.config import Settings
from tests.reliability._helpers import wait_for
from tests.support import (
    create_token,
    free_port,
    serve_app,
    start_server_process,
    thread_server,
)

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def authed(sqlite_url: str) -> Iterator[str]:
    """A server with auth on (SQLite, no worker)."""
    settings = Settings(database_url=sqlite_url, auth_enabled=True, worker_enabled=False)
    with thread_server(settings) as url:
        yield url


def _raw_post_head(url: str, path: str, length: int, extra: str = "") -> socket.socket:
    """Open a connection and send a POST's head declaring ``length`` body bytes."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n{extra}\r\n".encode()
    )
    return sock


def _read_answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


# --- authenticate from the headers before reading the body --------------------------------------


def test_a_bad_body_without_a_token_is_refused_as_unauthenticated(authed: str,
                                                                    sqlite_url: str) -> None:
    path = f"/api/v1/runs/{uuid.uuid4()}/metrics"
    resp = httpx.post(authed + path, content=b"not json",
                      headers={"content-type": "application/json"})
    assert resp.status_code == 401, resp.text  # was 400 malformed_json: the body was parsed
    assert resp.json()["error_code"] == "unauthenticated"
    assert resp.headers["www-authenticate"] == "Bearer"
    # A read token cannot write: refused on its scope, still without parsing the body.
    read = create_token(sqlite_url, f"p-{uuid.uuid4().hex[:8]}", "read")
    resp = httpx.post(authed + path, content=b"not json",
                      headers={"authorization": f"Bearer {read}"})
    assert resp.status_code == 403 and resp.json()["error_code"] == "forbidden", resp.text
    # A valid ingest token still gets its body read (and the parse error).
    ingest = create_token(sqlite_url, f"p-{uuid.uuid4().hex[:8]}", "ingest")
    resp = httpx.post(authed + path, content=b"not json",
                      headers={"authorization": f"Bearer {ingest}",
                               "content-type": "application/json"})
    assert resp.status_code == 400 and resp.json()["error_code"] == "malformed_json"


def test_a_large_body_without_a_token_is_answered_before_it_is_sent(authed: str) -> None:
    """The 401 arrives before the client has sent a byte of a declared 15 MiB body: the server
    answered from the headers (before, it waited for the whole body and parsed it)."""
    sock = _raw_post_head(authed, f"/api/v1/runs/{uuid.uuid4()}/metrics", 15 * MIB)
    with sock:
        # No body byte is sent: a server that reads the body before authenticating never
        # answers (the socket's 30 s timeout fails the test).
        answer = _read_answer(sock)  # the server closes the connection after answering
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 401"), answer[:300]
    assert b"connection: close" in head.lower()
    assert b'"unauthenticated"' in body


def test_anonymous_floods_do_not_grow_the_server(sqlite_url: str, tmp_path: Path) -> None:
    """Four 15 MiB bodies without a token: the server's RSS stays flat (it grew by ~400 MB per
    body while they were buffered and parsed before the 401)."""
    server = start_server_process(sqlite_url, tmp_path,
                                  env={"CURVECAST_AUTH_ENABLED": "true",
                                       "CURVECAST_WORKER_ENABLED": "false"})
    try:
        process = psutil.Process(server.proc.pid)
        httpx.get(f"{server.url}/readyz").raise_for_status()
        before = process.memory_info().rss
        body = b"[" + b"1.0," * (15 * MIB // 4)
        socks = [_raw_post_head(server.url, f"/api/v1/runs/{uuid.uuid4()}/metrics", len(body))
                 for _ in range(4)]
        for sock in socks:
            with sock:
                try:
                    sock.sendall(body)
                except OSError:  # closed on us after the 401: the point
                    pass
        # The server is still well and answers a real client.
        assert httpx.get(f"{server.url}/healthz").status_code == 200
        grown = process.memory_info().rss - before
        assert grown < 50 * MIB, f"server RSS grew by {grown / MIB:.0f} MiB"
    finally:
        server.stop()


# --- config step counts bounded by the contract --------------------------------------------------


@pytest.mark.parametrize("key", ["total_steps", "warmup_steps", "c_warmup"])
def test_config_step_counts_are_bounded(server: str, project: str, key: str) -> None:
    run_id = uuid.uuid4()
    url = f"{server}/api/v1/runs/{run_id}"
    resp = httpx.put(url, json={"project": project, "config": {key: 10**30}})
    assert resp.status_code == 422, resp.text
    assert resp.json()["error_code"] == "invalid_request"
    assert f"config.{key}" in resp.json()["message"]
    ok = httpx.put(url, json={"project": project, "config": {key: MAX_STEP}})
    assert ok.status_code in (200, 201), ok.text
    patched = httpx.patch(url, json={"config": {key: MAX_STEP + 1}})
    assert patched.status_code == 422 and f"config.{key}" in patched.json()["message"]
    # The run's figures still answer (an unbounded total_steps made them 422).
    assert httpx.get(f"{server}/dashboards/api/runs/{run_id}/figures").status_code == 200
    # The client refuses the same configs before sending them.
    with pytest.raises(ValueError, match=key):
        check_config({key: MAX_STEP + 1})
    assert check_config({key: MAX_STEP}) == {key: MAX_STEP}


# --- /readyz -----------------------------------------------------------------------------------


def test_readyz_does_not_show_the_database_error(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    dead = f"postgresql://secret-user-x1@127.0.0.1:{port}/secret-db-x1"
    settings = Settings(database_url=dead, worker_enabled=False)
    with caplog.at_level(logging.WARNING), thread_server(settings) as url:
        resp = httpx.get(f"{url}/readyz")
    assert resp.status_code == 503
    assert resp.json()["status"] == "unavailable"
    for secret in ("secret-user-x1", "secret-db-x1", str(port), "refused"):
        assert secret not in resp.text, resp.text
    assert "readiness check failed" in caplog.text  # the reason goes to the server's log
    assert str(port) in caplog.text


# --- Host names, cross-site requests, login CSRF, logout ------------------------------------


def test_unknown_host_names_are_refused(sqlite_url: str) -> None:
    settings = Settings(database_url=sqlite_url, worker_enabled=False,
                        allowed_hosts="curvecast.example",
                        public_url="https://dash.example.org")
    with serve_app(create_app(settings)) as url:
        evil = httpx.get(f"{url}/", headers={"host": "rebind.evil.example"})
        assert evil.status_code == 400 and evil.json()["error_code"] == "host_not_allowed"
        assert "CURVECAST_ALLOWED_HOSTS" in evil.json()["message"]
        api = httpx.get(f"{url}/api/v1/runs", headers={"host": "rebind.evil.example:8000"})
        assert api.status_code == 400
        # Probes answer under any name (an orchestrator probes the pod's address).
        assert httpx.get(f"{url}/healthz", headers={"host": "10.1.2.3"}).status_code == 200
        for host in ("curvecast.example", "dash.example.org:443", "localhost:8000", "[::1]"):
            assert httpx.get(f"{url}/api/v1/runs", headers={"host": host}).status_code == 200
        assert httpx.get(f"{url}/api/v1/runs").status_code == 200  # 127.0.0.1:port


@pytest.fixture(scope="module")
def open_server(sqlite_url: str) -> Iterator[str]:
    """Auth off, with the worker (so that a NaN raises a real alert)."""
    settings = Settings(database_url=sqlite_url, worker_interval_s=0.1)
    with thread_server(settings) as url:
        yield url


def test_cross_site_writes_are_refused_with_auth_off(open_server: str, project: str) -> None:
    url = open_server
    run_id = uuid.uuid4()
    httpx.put(f"{url}/api/v1/runs/{run_id}", json={"project": project}).raise_for_status()
    httpx.post(f"{url}/api/v1/runs/{run_id}/metrics", json={
        "steps": [1, 2], "values": {"loss": [1.0, "NaN"]}}).raise_for_status()
    alerts = wait_for(lambda: httpx.get(f"{url}/api/v1/runs/{run_id}/alerts").json()["alerts"],
                      60, "the NaN alert")
    ack = f"{url}/api/v1/alerts/{alerts[0]['id']}/ack"
    for headers in ({"origin": "https://evil.example"}, {"origin": "null"},
                    {"referer": "https://evil.example/page"}):
        resp = httpx.post(ack, headers=headers)
        assert resp.status_code == 403, (headers, resp.text)
        assert resp.json()["error_code"] == "forbidden"
    stored = httpx.get(f"{url}/api/v1/runs/{run_id}/alerts").json()["alerts"][0]
    assert stored["acknowledged_at"] is None  # nothing changed
    # The pages' own requests (same origin) and API clients (no Origin) still work.
    netloc = urlsplit(url).netloc
    assert httpx.post(ack, headers={"origin": f"http://{netloc}"}).status_code == 200
    assert httpx.get(f"{url}/", headers={"origin": "https://evil.example"}).status_code == 200


def test_an_authorization_header_does_not_open_cross_site_writes(open_server: str,
                                                                   project: str) -> None:
    """With auth off, ``Origin: evil`` plus any ``Authorization`` header (empty, or a made-up
    token) passed the cross-site check: ack 200, DELETE run 204."""
    url = open_server
    run_id = uuid.uuid4()
    httpx.put(f"{url}/api/v1/runs/{run_id}", json={"project": project}).raise_for_status()
    httpx.post(f"{url}/api/v1/runs/{run_id}/metrics", json={
        "steps": [1, 2], "values": {"loss": [1.0, "NaN"]}}).raise_for_status()
    alerts = wait_for(lambda: httpx.get(f"{url}/api/v1/runs/{run_id}/alerts").json()["alerts"],
                      60, "the NaN alert")
    ack = f"{url}/api/v1/alerts/{alerts[0]['id']}/ack"
    for authorization in ("", "Bearer x", "Bearer cc_000000000000_" + "a" * 43):
        evil = {"origin": "https://evil.example", "authorization": authorization}
        resp = httpx.post(ack, headers=evil)
        assert resp.status_code == 403, (authorization, resp.text)
        resp = httpx.delete(f"{url}/api/v1/runs/{run_id}", headers=evil)
        assert resp.status_code == 403, (authorization, resp.text)
        referred = {"referer": "https://evil.example/x", "authorization": authorization}
        assert httpx.post(ack, headers=referred).status_code == 403
    assert httpx.get(f"{url}/api/v1/runs/{run_id}").status_code == 200  # not deleted
    stored = httpx.get(f"{url}/api/v1/runs/{run_id}/alerts").json()["alerts"][0]
    assert stored["acknowledged_at"] is None
    # Two Origin headers, the second this site's: the first still counts.
    netloc = urlsplit(url).netloc
    two = [("origin", "https://evil.example"), ("origin", f"http://{netloc}")]
    assert httpx.post(ack, headers=two).status_code == 403


def test_with_auth_on_only_a_valid_token_opens_a_cross_site_api_write(authed: str,
                                                                      sqlite_url: str) -> None:
    project = f"p-{uuid.uuid4().hex[:8]}"
    ingest = create_token(sqlite_url, project, "ingest")
    run = f"{authed}/api/v1/runs/{uuid.uuid4()}"
    evil = {"origin": "https://evil.example"}
    # A token the attacker does not have: refused (no token at all: the cross-site 403).
    assert httpx.put(run, json={"project": project}, headers=evil).status_code == 403
    made_up = {**evil, "authorization": "Bearer cc_000000000000_" + "a" * 43}
    assert httpx.put(run, json={"project": project}, headers=made_up).status_code == 401
    assert httpx.put(run, json={"project": project}, headers={**evil, "authorization": ""}
                     ).status_code == 401
    # A real token (a script, or a page of another origin holding one) is an API client.
    real = {**evil, "authorization": f"Bearer {ingest}"}
    assert httpx.put(run, json={"project": project}, headers=real).status_code == 201
    # The pages' cookie-authenticated forms: a header changes nothing there.
    assert httpx.post(f"{authed}/logout", headers=real).status_code == 403


def test_logout_is_a_same_origin_post(authed: str, sqlite_url: str) -> None:
    read = create_token(sqlite_url, f"p-{uuid.uuid4().hex[:8]}", "read")
    with httpx.Client(base_url=authed) as browser:
        assert browser.get("/", params={"token": read}, follow_redirects=True).status_code == 200
        page = browser.get("/").text
        assert 'action="/logout"' in page and 'method="post"' in page
        assert browser.get("/logout").status_code == 405  # a link cannot sign anyone out
        refused = browser.post("/logout", headers={"origin": "https://evil.example"})
        assert refused.status_code == 403
        assert browser.get("/").status_code == 200  # still signed in
        out = browser.post("/logout", headers={"origin": authed}, follow_redirects=False)
        assert out.status_code == 303
        assert browser.get("/").status_code == 401


def test_a_token_link_does_not_silently_replace_a_valid_cookie(authed: str,
                                                              sqlite_url: str) -> None:
    mine, theirs = f"mine-{uuid.uuid4().hex[:8]}", f"theirs-{uuid.uuid4().hex[:8]}"
    victim = create_token(sqlite_url, mine, "read")
    attacker = create_token(sqlite_url, theirs, "read")
    with httpx.Client(base_url=authed) as browser:
        assert browser.get("/", params={"token": victim}, follow_redirects=False
                           ).status_code == 303
        assert browser.cookies["curvecast_token"] == victim
        # The same token again: nothing to ask.
        again = browser.get("/", params={"token": victim}, follow_redirects=False)
        assert again.status_code == 303
        # Another token: a question, not a switch (and the token is not in the page).
        asked = browser.get("/", params={"token": attacker, "project": theirs},
                            follow_redirects=False)
        assert asked.status_code == 200, asked.text
        assert "Switch token" in asked.text and theirs in asked.text and mine in asked.text
        assert attacker not in asked.text
        assert browser.cookies["curvecast_token"] == victim
        # The switch from another site is refused; from the page itself it happens.
        refused = browser.post("/login", params={"next": f"/?project={theirs}"},
                               headers={"origin": "https://evil.example"})
        assert refused.status_code == 403
        assert browser.cookies["curvecast_token"] == victim
        switched = browser.post("/login", params={"next": f"/?project={theirs}"},
                                headers={"origin": authed}, follow_redirects=False)
        assert switched.status_code == 303, switched.text
        assert switched.headers["location"] == f"/?project={theirs}"
        assert browser.cookies["curvecast_token"] == attacker
        # The pending token is used once; and ``next`` never leaves the site.
        again_switch = browser.post("/login", params={"next": "//evil.example/"})
        assert again_switch.status_code == 422


def test_a_login_link_redirects_only_within_the_site(authed: str, sqlite_url: str) -> None:
    first = create_token(sqlite_url, f"a-{uuid.uuid4().hex[:8]}", "read")
    second = create_token(sqlite_url, f"b-{uuid.uuid4().hex[:8]}", "read")
    with httpx.Client(base_url=authed) as browser:
        browser.get("/", params={"token": first})
        browser.get("/", params={"token": second}, follow_redirects=False)
        switched = browser.post("/login", params={"next": "//evil.example/x"},
                                follow_redirects=False)
        assert switched.status_code == 303 and switched.headers["location"] == "/"


def test_switching_tokens_in_a_real_browser(sqlite_url: str, authed: str) -> None:
    """Chromium: the question page, its same-origin "Switch" POST (the pending cookie is sent,
    the Origin is this site's), then "Sign out"."""
    from tests.dashboards.conftest import CHROMIUM, FLAGS, _unavailable

    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed")
    if not Path(CHROMIUM).exists():
        _unavailable(f"Chromium is not installed at {CHROMIUM}")
    first = create_token(sqlite_url, f"first-{uuid.uuid4().hex[:8]}", "read")
    second_project = f"second-{uuid.uuid4().hex[:8]}"
    second = create_token(sqlite_url, second_project, "read")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            context = browser.new_context()
            context.set_default_timeout(30_000)
            page = context.new_page()
            page.goto(f"{authed}/?token={first}")
            assert page.url == f"{authed}/"

            def cookie() -> str:
                jar = {c["name"]: c["value"] for c in context.cookies(authed)}
                return jar["curvecast_token"]

            assert cookie() == first
            page.goto(f"{authed}/?token={second}&project={second_project}")
            assert "Switch token?" in page.locator("main").inner_text()
            assert cookie() == first  # not replaced by the link
            page.click("#switch-token")
            page.wait_for_url(f"{authed}/?project={second_project}")
            assert cookie() == second
            page.click("form.logout button")
            page.wait_for_url(f"{authed}/")
            assert "curvecast_token" not in {c["name"] for c in context.cookies(authed)}
        finally:
            browser.close()
