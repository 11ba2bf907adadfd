"""Every route × (no token, malformed, wrong scheme, unknown, revoked, another project's, wrong
scope, right scope), on both backends, against a real ``curvecast serve`` process with auth
on: 401/403/404 with no data leaked, nothing changed by a refused request, and no secret in the
server's log (access log and debug logging on).

Routes are enumerated from the running app — the OpenAPI paths and the routes hidden from the
schema (dashboard pages) — so an endpoint added later is covered automatically, and a route
the tables below do not classify fails the test: whoever adds one decides here which scope it
needs. (``tests/service/test_auth.py`` checks the token CLI and hashing; this is the matrix.)
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from curvecast.service import auth
from curvecast.service.app import create_app
from curvecast.service.config import Settings
from curvecast.service.db import make_engine, make_sessionmaker, session_scope
from curvecast.service.store import tokens
from tests.reliability._helpers import wait_for
from tests.support import ServerProcess, create_token, start_server_process

# --- what each route needs -------------------------------------------------------------------

#: Public on purpose: probes, the schema and its viewers, static assets, signing out, and
#: confirming a token switch (both POSTs the edge refuses from another site).
PUBLIC = {
    ("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/openapi.json"), ("GET", "/docs"),
    ("GET", "/docs/oauth2-redirect"), ("GET", "/redoc"),
    ("GET", "/static/{name}"), ("POST", "/logout"), ("POST", "/login"),
}
#: (method, path prefix or exact path, scope). Reads of the REST API need ``read``; each write
#: is listed exactly, so a new write endpoint must be classified here.
SCOPES = [
    ("GET", "/api/v1/", "read"),
    ("PUT", "/api/v1/runs/{run_id}", "ingest"),
    ("PATCH", "/api/v1/runs/{run_id}", "ingest"),
    ("POST", "/api/v1/runs/{run_id}/metrics", "ingest"),
    ("POST", "/api/v1/alerts/{alert_id}/ack", "ingest"),
    ("POST", "/api/v1/alerts/{alert_id}/silence", "ingest"),
    ("PUT", "/api/v1/projects/{project}/rules/{rule}", "admin"),
    ("POST", "/api/v1/projects/{project}/webhooks", "admin"),
    ("DELETE", "/api/v1/projects/{project}/webhooks/{webhook_id}", "admin"),
    ("DELETE", "/api/v1/runs/{run_id}", "admin"),
    # Prometheus metrics: the whole server's numbers, any token.
    ("GET", "/metrics", "read"),
]
#: Dashboard pages and their data (hidden from the schema): a read token, header or cookie.
PAGES = {
    "/", "/runs/{run_id}", "/compare", "/dashboards/api/runs-table",
    "/dashboards/api/runs/{run_id}/figures", "/dashboards/api/runs/{run_id}/live",
    "/dashboards/api/compare", "/alerts", "/dashboards/api/alerts-table", "/projects",
    "/projects/{project}",
    "/dashboards/api/v1/{path:path}",
}
#: The pages' own actions (form POSTs, hidden from the schema; errors answer as pages): the
#: scope of the REST API's same action.
PAGE_ACTIONS = {("POST", "/alerts/{alert_id}/ack"): "ingest",
                ("POST", "/alerts/{alert_id}/silence"): "ingest"}
#: Listings answer 200 to another project's token, with only that project's objects.
LISTINGS = {("GET", "/api/v1/runs"), ("GET", "/api/v1/alerts"), ("GET", "/api/v1/projects"),
            ("GET", "/"), ("GET", "/dashboards/api/runs-table"), ("GET", "/alerts"),
            ("GET", "/dashboards/api/alerts-table"), ("GET", "/projects"),
            ("GET", "/metrics")}  # no project, run or key in any label
#: Creating a run in someone else's project is forbidden (the id itself is the caller's).
OTHER_PROJECT_STATUS = {("PUT", "/api/v1/runs/{run_id}"): 403}
ORDER = {"read": 0, "ingest": 1, "admin": 2}

# Strings that exist only in the victim project's data: none may appear in a refused answer.
MARKERS = {
    "run name": "victim-run-7f3a9",
    "config": "victim-config-c0ffee",
    "webhook name": "victim-hook-51d2",
    "webhook url": "victim-url-path-9e1",
    "value": "4242.4242",
}
WEBHOOK_SECRET = "victim-webhook-secret-0123456789"
DB_PASSWORD = "Db-Passw0rd-never-logged"


@dataclass
class Route:
    method: str
    path: str
    needs: str | None  # None: public
    page: bool = False


@dataclass
class World:
    server: ServerProcess
    database_url: str
    victim: str
    other: str
    run_id: str
    alert_id: int
    webhook_id: int
    tokens: dict[str, str] = field(default_factory=dict)

    def secrets(self) -> list[str]:
        """Everything that must never be logged (a token's secret: after ``cc_<12 hex>_``)."""
        out = [WEBHOOK_SECRET, DB_PASSWORD]
        for token in self.tokens.values():
            out += [token, token[16:]]
        return out


def routes_of(app: Any) -> list[Route]:
    """Every (method, path) the app serves, classified; fails on an unknown one."""
    schema_paths = app.openapi()["paths"]
    found: dict[tuple[str, str], bool] = {}

    def walk(routes: list[Any], prefix: str) -> None:
        for route in routes:
            nested = getattr(route, "original_router", None) or getattr(route, "app", None)
            if getattr(route, "methods", None):
                path = prefix + route.path
                for method in route.methods - {"HEAD", "OPTIONS"}:
                    found[(method, path)] = path in schema_paths
            elif nested is not None and hasattr(nested, "routes"):
                context = getattr(route, "include_context", None)
                walk(nested.routes, prefix + (getattr(context, "prefix", "") or ""))
            else:
                pytest.fail(f"cannot enumerate route {route!r}: extend routes_of()")

    walk(app.router.routes, "")
    # Every operation of the schema must have been found (the walk is complete).
    documented = {(m.upper(), p) for p, ops in schema_paths.items() for m in ops}
    assert documented <= set(found), documented - set(found)
    out = []
    for (method, path), _in_schema in sorted(found.items()):
        if (method, path) in PUBLIC:
            out.append(Route(method, path, None))
        elif path in PAGES and method == "GET":
            out.append(Route(method, path, "read", page=True))
        elif (method, path) in PAGE_ACTIONS:
            out.append(Route(method, path, PAGE_ACTIONS[(method, path)], page=True))
        else:
            needs = [s for m, p, s in SCOPES if m == method and (
                path == p or (p.endswith("/") and path.startswith(p)))]
            if not needs:
                pytest.fail(f"{method} {path} is not classified: add it to PUBLIC, SCOPES or "
                            "PAGES in tests/reliability/test_auth_matrix.py", pytrace=False)
            out.append(Route(method, path, needs[0]))
    return out


# --- requests ----------------------------------------------------------------------------------

BODIES: dict[tuple[str, str], Any] = {
    ("PUT", "/api/v1/runs/{run_id}"): lambda w: {"project": w.victim, "name": MARKERS["run name"]},
    ("PATCH", "/api/v1/runs/{run_id}"): lambda w: {"status": "running"},
    ("POST", "/api/v1/runs/{run_id}/metrics"): lambda w: {"steps": [1], "values": {"loss": [9.0]}},
    ("POST", "/api/v1/alerts/{alert_id}/silence"): lambda w: {"until": None},
    ("PUT", "/api/v1/projects/{project}/rules/{rule}"): lambda w: {"enabled": True},
    ("POST", "/api/v1/projects/{project}/webhooks"): lambda w: {
        "url": "http://127.0.0.1:9/new-hook", "enabled": False},
}
QUERY: dict[str, Any] = {"/api/v1/runs/{run_id}/forecast/target": {"loss": "2.5"},
                         "/api/v1/runs/{run_id}/forecast/beat": {"loss": "2.5"},
                         "/compare": "runs", "/dashboards/api/compare": "runs"}


def _request(w: World, route: Route, headers: dict[str, str],
             webhook_id: int | None = None, run_id: str | None = None) -> httpx.Response:
    values = {"run_id": run_id or w.run_id, "alert_id": str(w.alert_id), "project": w.victim,
              "rule": "non_finite", "webhook_id": str(webhook_id or w.webhook_id),
              "path:path": f"runs/{w.run_id}", "name": "nothing.js"}
    path = re.sub(r"\{([^}]+)\}", lambda m: values[m.group(1)], route.path)
    query = QUERY.get(route.path, {})
    if query == "runs":
        query = {"runs": w.run_id}
    body = BODIES.get((route.method, route.path))
    if body is None and route.method in ("PUT", "POST", "PATCH") and route.path not in (
        "/api/v1/alerts/{alert_id}/ack", "/logout", "/login", *(p for _m, p in PAGE_ACTIONS),
    ):
        pytest.fail(f"no request body for {route.method} {route.path}: add one to BODIES")
    return httpx.request(route.method, w.server.url + path, params=query, headers=headers,
                         json=body(w) if body else None, timeout=30, follow_redirects=False)


def _no_leak(resp: httpx.Response, where: str) -> None:
    for what, marker in MARKERS.items():
        assert marker not in resp.text, f"{where} leaked the victim's {what}: {resp.text[:300]}"


# --- the world ---------------------------------------------------------------------------------


def _with_password(database_url: str) -> str:
    # Trust authentication ignores the password: it is there to check it is never printed.
    return database_url.replace("postgresql://postgres@", f"postgresql://postgres:{DB_PASSWORD}@")


@pytest.fixture(scope="module")
def world(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    victim, other = f"victim-{uuid.uuid4().hex[:8]}", f"other-{uuid.uuid4().hex[:8]}"
    toks = {
        "read": create_token(database_url, victim, "read"),
        "ingest": create_token(database_url, victim, "ingest"),
        "admin": create_token(database_url, victim, "admin"),
        "other": create_token(database_url, other, "admin"),
        "revoked": create_token(database_url, victim, "admin"),
    }
    engine = make_engine(Settings(database_url=database_url))
    with session_scope(make_sessionmaker(engine)) as session:
        revoked_id = tokens.authenticate(session, token=toks["revoked"]).token_id
    assert revoked_id is not None
    with session_scope(make_sessionmaker(engine)) as session:
        tokens.revoke_token(session, token_id=revoked_id)
    engine.dispose()
    server = start_server_process(
        _with_password(database_url), tmp_path_factory.mktemp("auth"),
        env={"CURVECAST_AUTH_ENABLED": "true", "CURVECAST_WORKER_INTERVAL_S": "0.1",
             "CURVECAST_WEBHOOK_TIMEOUT_S": "1"},
        extra_args=["--access-log", "--log-level", "debug"],
    )
    admin = {"Authorization": f"Bearer {toks['admin']}"}
    try:
        run_id = str(uuid.uuid4())
        httpx.put(f"{server.url}/api/v1/runs/{run_id}", headers=admin, json={
            "project": victim, "name": MARKERS["run name"],
            "config": {"note": MARKERS["config"], "total_steps": 100}}).raise_for_status()
        httpx.post(f"{server.url}/api/v1/runs/{run_id}/metrics", headers=admin, json={
            "steps": [1, 2, 3], "values": {"loss": [float(MARKERS["value"]), "NaN", 1.0]},
        }).raise_for_status()
        hook = httpx.post(f"{server.url}/api/v1/projects/{victim}/webhooks", headers=admin, json={
            "url": f"http://127.0.0.1:9/{MARKERS['webhook url']}", "name": MARKERS["webhook name"],
            "secret": WEBHOOK_SECRET, "enabled": False})
        hook.raise_for_status()
        alerts = wait_for(lambda: httpx.get(f"{server.url}/api/v1/runs/{run_id}/alerts",
                                            headers=admin).json()["alerts"], 60,
                          "the victim's alert (the NaN)")
        yield World(server, database_url, victim, other, run_id, alerts[0]["id"],
                    hook.json()["id"], toks)
    finally:
        server.stop()


def _victim_state(w: World) -> dict[str, Any]:
    admin = {"Authorization": f"Bearer {w.tokens['admin']}"}
    base = w.server.url + "/api/v1"
    run = httpx.get(f"{base}/runs/{w.run_id}", headers=admin).json()
    return {
        "run": {k: v for k, v in run.items() if k != "updated_at"},
        "updated_at": run["updated_at"],
        "metrics": httpx.get(f"{base}/runs/{w.run_id}/metrics", headers=admin).json(),
        "webhooks": httpx.get(f"{base}/projects/{w.victim}/webhooks", headers=admin).json(),
        "rules": httpx.get(f"{base}/projects/{w.victim}/rules", headers=admin).json(),
        "alerts": [(a["id"], a["acknowledged_at"], a["silenced_until"]) for a in
                   httpx.get(f"{base}/runs/{w.run_id}/alerts", headers=admin).json()["alerts"]],
    }


@pytest.fixture(scope="module")
def routes(world: World) -> list[Route]:
    app = create_app(Settings(database_url=world.database_url, worker_enabled=False))
    found = routes_of(app)
    assert sum(r.needs is not None for r in found) >= 20, found
    return found


# --- the matrix --------------------------------------------------------------------------------

BAD_CREDENTIALS = ["none", "malformed", "wrong_scheme", "unknown", "revoked", "empty", "cookie"]


def _bad_headers(w: World, case: str) -> dict[str, str]:
    return {
        "none": {},
        "malformed": {"Authorization": "Bearer not-a-token"},
        "wrong_scheme": {"Authorization": f"Basic {w.tokens['admin']}"},
        "unknown": {"Authorization": "Bearer cc_0123456789ab_" + "A" * 43},
        "revoked": {"Authorization": f"Bearer {w.tokens['revoked']}"},
        "empty": {"Authorization": "Bearer"},
        # A forged cookie is no better than a forged header.
        "cookie": {"Cookie": f"curvecast_token={w.tokens['admin'][:-1]}x"},
    }[case]


def test_bad_credentials_get_401_on_every_route(world: World, routes: list[Route]) -> None:
    before = _victim_state(world)
    for case in BAD_CREDENTIALS:
        headers = _bad_headers(world, case)
        for route in routes:
            resp = _request(world, route, headers)
            where = f"{case}: {route.method} {route.path}"
            if route.needs is None:
                assert resp.status_code < 500, (where, resp.status_code)
                continue
            assert resp.status_code == 401, (where, resp.status_code, resp.text[:300])
            if not route.page or "json" in resp.headers.get("content-type", ""):
                assert resp.json()["error_code"] == "unauthenticated", where
            _no_leak(resp, where)
    assert _victim_state(world) == before


def test_another_projects_token_sees_and_changes_nothing(world: World,
                                                         routes: list[Route]) -> None:
    before = _victim_state(world)
    headers = {"Authorization": f"Bearer {world.tokens['other']}"}
    for route in routes:
        if route.needs is None:
            continue
        resp = _request(world, route, headers)
        where = f"other project: {route.method} {route.path}"
        _no_leak(resp, where)
        if (route.method, route.path) in LISTINGS:
            assert resp.status_code == 200, (where, resp.text[:300])
            assert world.victim not in resp.text and world.run_id not in resp.text, where
        else:
            expected = OTHER_PROJECT_STATUS.get((route.method, route.path), 404)
            assert resp.status_code == expected, (where, resp.status_code, resp.text[:300])
    assert _victim_state(world) == before


def test_scopes_nest_and_a_lower_scope_is_403(world: World, routes: list[Route]) -> None:
    before = _victim_state(world)
    for scope in ("read", "ingest"):
        headers = {"Authorization": f"Bearer {world.tokens[scope]}"}
        for route in routes:
            if route.needs is None or ORDER[scope] >= ORDER[route.needs]:
                continue
            resp = _request(world, route, headers)
            where = f"{scope} token: {route.method} {route.path}"
            assert resp.status_code == 403, (where, resp.status_code, resp.text[:300])
            if not route.page or "json" in resp.headers.get("content-type", ""):
                assert resp.json()["error_code"] == "forbidden", where
            _no_leak(resp, where)
    after = _victim_state(world)
    assert after == before


def test_the_right_scope_is_enough(world: World, routes: list[Route]) -> None:
    for route in routes:
        if route.needs is None:
            continue
        for scope in ("read", "ingest", "admin"):
            if ORDER[scope] < ORDER[route.needs]:
                continue
            headers = {"Authorization": f"Bearer {world.tokens[scope]}"}
            webhook_id = run_id = None
            if (route.method, route.path) == ("DELETE", "/api/v1/runs/{run_id}"):
                run_id = str(uuid.uuid4())  # delete a run made for the purpose
                made = httpx.put(f"{world.server.url}/api/v1/runs/{run_id}",
                                 headers={"Authorization": f"Bearer {world.tokens['admin']}"},
                                 json={"project": world.victim})
                assert made.status_code == 201, made.text
            elif route.method == "DELETE":  # delete a webhook made for the purpose
                webhook_id = httpx.post(
                    f"{world.server.url}/api/v1/projects/{world.victim}/webhooks",
                    headers={"Authorization": f"Bearer {world.tokens['admin']}"},
                    json={"url": "http://127.0.0.1:9/to-delete", "enabled": False},
                ).json()["id"]
            resp = _request(world, route, headers, webhook_id=webhook_id, run_id=run_id)
            where = f"{scope} token: {route.method} {route.path}"
            assert resp.status_code in (200, 201, 204, 303), (where, resp.status_code,
                                                               resp.text[:300])


def test_dashboard_login_cookie_and_no_secret_in_logs(world: World) -> None:
    url = world.server.url
    login = httpx.get(f"{url}/?token={world.tokens['read']}", follow_redirects=False)
    assert login.status_code == 303 and "token" not in login.headers["location"]
    cookie = login.cookies["curvecast_token"]
    assert httpx.get(f"{url}/runs/{world.run_id}",
                     cookies={"curvecast_token": cookie}).status_code == 200
    bad = httpx.get(f"{url}/?token={world.tokens['revoked']}", follow_redirects=False)
    assert bad.status_code == 401 and "set-cookie" not in bad.headers
    # A token sent where it does not belong (a query string) is not echoed back or logged.
    echo = httpx.get(f"{url}/api/v1/runs", params={"page_token": world.tokens["admin"]},
                     headers={"Authorization": f"Bearer {world.tokens['admin']}"})
    assert echo.status_code == 422 and world.tokens["admin"] not in echo.text

    log = world.server.log()
    assert '"GET /?token=*** HTTP/1.1" 303' in log  # the access log is on, and redacted
    for secret in world.secrets():
        assert secret not in log, f"a secret appears in the server log: {secret[:6]}..."
    first_line = log.splitlines()[0]
    assert "serving at" in first_line
    if world.database_url.startswith("postgresql"):
        assert "***" in first_line and DB_PASSWORD not in first_line, first_line


def test_tokens_are_stored_hashed_and_compared_in_constant_time(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = create_engine(Settings(database_url=world.database_url).database_url)
    with engine.connect() as conn:
        rows = [" ".join(map(str, r)) for r in conn.execute(text("SELECT * FROM api_tokens"))]
    engine.dispose()
    for token in world.tokens.values():
        secret = token[16:]
        assert not any(secret in row for row in rows), "a token secret is stored in clear"
        assert any(hashlib.sha256(token.encode()).hexdigest() in row for row in rows)

    compared: list[tuple[str, str]] = []
    real = hmac.compare_digest
    assert "hmac.compare_digest" in inspect.getsource(auth.verify)

    def spy(a: str, b: str) -> bool:
        compared.append((a, b))
        return bool(real(a, b))

    monkeypatch.setattr(hmac, "compare_digest", spy)
    engine = make_engine(Settings(database_url=world.database_url))
    with session_scope(make_sessionmaker(engine)) as session:
        good = world.tokens["read"]
        assert tokens.authenticate(session, token=good).project == world.victim
        wrong_secret = good[:-4] + ("AAAA" if not good.endswith("AAAA") else "BBBB")
        unknown_prefix = "cc_ffffffffffff_" + good[16:]
        for bad in (wrong_secret, unknown_prefix):
            with pytest.raises(Exception, match="invalid token"):
                tokens.authenticate(session, token=bad)
    engine.dispose()
    # One constant-time comparison of SHA-256 digests per attempt, even for an unknown prefix
    # (against a dummy digest), so timing tells nothing about which prefixes exist.
    assert len(compared) == 3
    assert all(len(a) == len(b) == 64 for a, b in compared)
