"""Hostile and malformed input, on both backends: oversized bodies, deep nesting, huge arrays,
unicode and control characters, SQL metacharacters in every string field, NaN/Inf where they
are not allowed. Each answer is a clear 4xx (the standard error body, a message naming what to
fix), never a 5xx or a hang, and nothing stored changes."""

from __future__ import annotations

import json
import re
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from sqlalchemy import create_engine, inspect, text

from curvecast.contract import KEY_PATTERN, PROJECT_PATTERN
from curvecast.service.app import create_app
from curvecast.service.config import Settings
from curvecast.service.schemas import MAX_CONFIG_DEPTH

LIMIT = Settings().max_body_bytes
SMALL_TABLES = ("projects", "runs", "series", "webhooks", "alert_rules", "api_tokens")
SQL_PAYLOADS = [
    "'",
    "''; DROP TABLE runs; --",
    '" OR 1=1 --',
    "' OR '1'='1",
    "1); DELETE FROM metric_points; --",
    "%",
    "_",
    "\\",
    "%s",
    "$1",
    ":run_id",
    "1; SELECT pg_sleep(10)",
    "x'||(SELECT version())||'",
]
#: The payloads sent to every parameter of every operation (the full list goes to the fields
#: that store text).
SWEEP_PAYLOADS = ["''; DROP TABLE runs; --", "' OR '1'='1", "%", "1; SELECT pg_sleep(10)"]


# --------------------------------------------------------------------------------------------
# Fixtures and helpers
# --------------------------------------------------------------------------------------------


class Api:
    """A server with one canary run (another project) that nothing below may change."""

    def __init__(self, url: str, database_url: str, project: str) -> None:
        self.url = url
        self.database_url = database_url
        self.project = project
        self.client = httpx.Client(base_url=url, timeout=30)
        self.run_id = str(uuid.uuid4())
        self.put_run(self.run_id, {"project": project, "name": "target", "config": {"a": 1}})
        ok = self.client.post(f"/api/v1/runs/{self.run_id}/metrics",
                              json={"steps": [1, 2], "values": {"loss": [2.0, 1.5]}})
        assert ok.status_code == 200, ok.text

    def put_run(self, run_id: str, body: dict[str, Any]) -> httpx.Response:
        resp = self.client.put(f"/api/v1/runs/{run_id}", json=body)
        assert resp.status_code in (200, 201), resp.text
        return resp

    def raw(self, method: str, path: str, body: str | bytes | None = None,
            **kwargs: Any) -> httpx.Response:
        """Send ``body`` as is (for what ``json=`` cannot encode: NaN, lone surrogates)."""
        content = body.encode() if isinstance(body, str) else body
        headers = {"content-type": "application/json"} if content is not None else {}
        return self.client.request(method, path, content=content, headers=headers, **kwargs)

    def snapshot(self) -> dict[str, Any]:
        """Row counts of every table, and the full rows of the small ones."""
        engine = create_engine(Settings(database_url=self.database_url).database_url)
        try:
            with engine.connect() as conn:
                tables = sorted(inspect(conn).get_table_names())
                shot: dict[str, Any] = {
                    t: conn.execute(text(f'SELECT count(*) FROM "{t}"')).scalar_one()
                    for t in tables if t != "alembic_version"
                }
                for table in SMALL_TABLES:
                    rows = conn.execute(text(f'SELECT * FROM "{table}"')).all()
                    shot[f"{table} rows"] = sorted(map(repr, rows))
        finally:
            engine.dispose()
        return shot


@pytest.fixture(scope="module")
def api(server: str, database_url: str) -> Iterator[Api]:
    api = Api(server, database_url, f"hostile-{uuid.uuid4().hex[:8]}")
    yield api
    api.client.close()


@contextmanager
def nothing_changes(api: Api) -> Iterator[None]:
    before = api.snapshot()
    yield
    after = api.snapshot()
    changed = {k for k in before if before[k] != after.get(k)}
    assert not changed, f"refused requests changed {sorted(changed)}"


def refused(resp: httpx.Response, status: int | tuple[int, ...], *words: str) -> None:
    """A clear 4xx: the expected status, the standard error body, a useful message."""
    statuses = (status,) if isinstance(status, int) else status
    assert resp.status_code in statuses, (resp.status_code, resp.text[:500])
    body = resp.json()
    assert set(body) == {"error_code", "message"}, body
    assert body["message"], body
    for word in words:
        assert word in body["message"], (word, body["message"])


def run_body(api: Api, config: str) -> str:
    """A run-creation body around a raw JSON ``config``."""
    return f'{{"project": "{api.project}", "config": {config}}}'


def batch(steps: list[Any], **columns: Any) -> dict[str, Any]:
    return {"steps": steps, "values": columns}


# --------------------------------------------------------------------------------------------
# Size
# --------------------------------------------------------------------------------------------


def test_oversized_bodies_are_413_before_parsing(api: Api) -> None:
    path = f"/api/v1/runs/{api.run_id}/metrics"
    with nothing_changes(api):
        declared = api.raw("POST", path, b" " * (LIMIT + 1))
        refused(declared, 413, str(LIMIT))

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams
            for _ in range(LIMIT // 65536 + 2):
                yield b" " * 65536

        streamed = api.client.post(path, content=chunks(),
                                   headers={"content-type": "application/json"})
        refused(streamed, 413)


def test_a_huge_declared_body_is_refused_without_reading_it(api: Api) -> None:
    host, port = api.url.removeprefix("http://").split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            # A Host of this service (others are refused at the edge).
            f"POST /api/v1/runs/{api.run_id}/metrics HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {100 * LIMIT}\r\n\r\n".encode()
            + b"[" * 1000
        )
        answer = sock.recv(4096).decode(errors="replace")
    assert answer.startswith("HTTP/1.1 413"), answer
    assert time.monotonic() - started < 5


def test_too_many_points_keys_or_steps_are_413(api: Api) -> None:
    path = f"/api/v1/runs/{api.run_id}/metrics"
    n = Settings().max_points_per_request
    with nothing_changes(api):
        refused(api.client.post(path, json=batch(list(range(n + 1)), loss=[1.0] * (n + 1))),
                413, "points", str(n))
        many_keys = {f"k{i}": [1.0] for i in range(1001)}
        refused(api.client.post(path, json=batch([1], **many_keys)), 413, "keys")
        # Even when every value is null: a batch's rows are bounded like its points.
        refused(api.client.post(path, json=batch(list(range(n + 1)), loss=[None] * (n + 1))),
                413, "steps")


# --------------------------------------------------------------------------------------------
# Shape
# --------------------------------------------------------------------------------------------


def _nested(depth: int, leaf: str = "1") -> str:
    return '{"a":' * depth + leaf + "}" * depth


def test_deeply_nested_json_is_refused(api: Api) -> None:
    run = f"/api/v1/runs/{uuid.uuid4()}"
    with nothing_changes(api):
        too_deep = run_body(api, f'{{"x": {_nested(MAX_CONFIG_DEPTH + 2)}}}')
        refused(api.raw("PUT", run, too_deep), 422, "nested deeper")
        for depth in (5_000, 100_000):  # beyond the JSON parser's own recursion limit
            body = f'{{"project": "{api.project}", "config": {{"x": {"[" * depth}{"]" * depth}}}}}'
            refused(api.raw("PUT", run, body), (400, 422))
            refused(api.raw("POST", f"{run}/metrics", "[" * depth + "]" * depth), (400, 422))
        refused(api.client.post(f"/api/v1/runs/{api.run_id}/metrics",
                                json=batch([1], loss=[[[1.0]]])), 422, "values.loss", "item 0")
        refused(api.raw("PUT", f"/api/v1/projects/{api.project}/rules/non_finite",
                        f'{{"params": {{"keys": {_nested(200)}}}}}'), 422, "params.keys")


def test_malformed_batches_name_the_field(api: Api) -> None:
    path = f"/api/v1/runs/{api.run_id}/metrics"
    with nothing_changes(api):
        refused(api.client.post(path, json=batch([1, 2], loss=[1.0])), 422, "values.loss",
                "1 items", "steps has 2")
        refused(api.client.post(path, json={"steps": [1], "values": {"loss": [1.0]},
                                            "wall_time": [1.0, 2.0]}), 422, "wall_time")
        refused(api.client.post(path, json=batch([1], loss=["1.0"])), 422, "item 0")
        refused(api.client.post(path, json=batch([-1], loss=[1.0])), 422, "steps")
        refused(api.client.post(path, json=batch([2**63], loss=[1.0])), 422, "steps")
        refused(api.client.post(path, json=batch([True], loss=[1.0])), 422, "steps")
        refused(api.client.post(path, json=batch([1.5], loss=[1.0])), 422, "steps")
        refused(api.client.post(path, json={"steps": [1], "values": {}}), 422, "values")
        refused(api.client.post(path, json=[1, 2, 3]), 422)
        refused(api.raw("POST", path, "{not json"), 400, "not valid JSON")
        refused(api.raw("POST", path, b"\xff\xfe\x00garbage"), (400, 422))
        refused(api.raw("POST", path, ""), (400, 422))


# --------------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------------

NASTY_TEXT = ["\x00", "a\x00b", "\x1b[31mred", "\x7f", "line\nbreak", "tab\t"]


def test_control_characters_and_lone_surrogates_are_refused(api: Api) -> None:
    run = f"/api/v1/runs/{uuid.uuid4()}"
    rules = f"/api/v1/projects/{api.project}/rules/non_finite"
    webhooks = f"/api/v1/projects/{api.project}/webhooks"
    with nothing_changes(api):
        for bad in [*NASTY_TEXT, "\ud800", "a\udfffb"]:
            enc = json.dumps(bad)  # ASCII-only JSON: "\u0000", "\ud800"
            refused(api.raw("PUT", run, f'{{"project": "{api.project}", "name": {enc}}}'), 422,
                    "name")
            refused(api.raw("PUT", run, f'{{"project": {enc}}}'), 422, "project")
            refused(api.raw("POST", f"/api/v1/runs/{api.run_id}/metrics",
                            f'{{"steps": [1], "values": {{{json.dumps("k" + bad)}: [1]}}}}'),
                    422)
            refused(api.raw("POST", webhooks,
                            f'{{"url": "http://127.0.0.1:9/x", "name": {enc}}}'), 422, "name")
            refused(api.raw("PUT", rules, f'{{"params": {{"keys": [{enc}]}}}}'), 422, "keys")
            query = quote(bad, errors="surrogatepass")
            refused(api.raw("GET", f"/api/v1/runs?project={query}"), 422, "project")
            refused(api.raw("GET", f"/api/v1/alerts?project={query}"), 422, "project")
        for bad in ["\x00", "a\x00b", "\ud800", "a\udfffb"]:  # what no database can store
            enc = json.dumps(bad)
            for config in (f'{{"x": {enc}}}', f'{{{enc}: 1}}', f'{{"x": {{"y": [{enc}]}}}}',
                           f'{{"x": {{{enc}: 1}}}}'):
                # (pydantic itself refuses a lone surrogate in a key: another message)
                refused(api.raw("PUT", run, run_body(api, config)), 422, "config")
                refused(api.raw("PATCH", f"/api/v1/runs/{api.run_id}", f'{{"config": {config}}}'),
                        422, "config")
        refused(api.raw("GET", "/api/v1/runs/%00"), 422, "run_id")
        refused(api.raw("GET", f"/api/v1/runs/{api.run_id}/metrics?keys=%00"), 422, "keys")
        refused(api.raw("GET", f"/api/v1/runs/{api.run_id}/metrics?keys=l%C3%B6ss"), 422, "keys")
        resp = api.raw("GET", "/?project=a%00b")  # the dashboard page
        assert 400 <= resp.status_code < 500, resp.status_code


def test_unicode_is_stored_and_returned_exactly(api: Api) -> None:
    run_id = str(uuid.uuid4())
    name = "训练 run — ünïcödé 🚀 \u202eRTL\u202c ﷽"
    config = {"模型": "变压器", "emoji": "🔥" * 50, "nested": {"ключ": ["значение", "𝔘"]}}
    api.put_run(run_id, {"project": api.project, "name": name, "config": config})
    got = api.client.get(f"/api/v1/runs/{run_id}").json()
    assert got["name"] == name and got["config"] == config
    assert [r for r in api.client.get("/api/v1/runs", params={"project": api.project})
            .json()["runs"] if r["id"] == run_id][0]["name"] == name


def test_sql_metacharacters_are_data(api: Api) -> None:
    """Every string a client can send, through every operation: stored verbatim where it is
    valid, refused with a 4xx where it is not, and never interpreted."""
    for payload in SQL_PAYLOADS:
        run_id = str(uuid.uuid4())
        config = {payload: payload, "nested": {"k": [payload]}}
        api.put_run(run_id, {"project": api.project, "name": payload, "config": config})
        got = api.client.get(f"/api/v1/runs/{run_id}").json()
        assert got["name"] == payload and got["config"] == config
        patched = api.client.patch(f"/api/v1/runs/{run_id}", json={"name": payload + payload})
        assert patched.status_code == 200 and patched.json()["name"] == payload * 2
        listed = api.client.get("/api/v1/runs", params={"project": payload})
        assert listed.status_code in (200, 422), listed.text
        if listed.status_code == 200:  # "_" is a valid project name, and matches only itself
            assert listed.json()["runs"] == []
        hook = api.client.post(f"/api/v1/projects/{api.project}/webhooks",
                               json={"url": f"http://127.0.0.1:9/{quote(payload)}",
                                     "name": payload, "secret": (payload * 16)[:200]})
        assert hook.status_code == 201, hook.text
        assert hook.json()["name"] == payload
    assert api.client.get(f"/api/v1/runs/{api.run_id}/metrics").json()["series"][0][
        "total_points"] == 2


def test_sql_metacharacters_in_every_parameter_of_every_operation(api: Api) -> None:
    """Generic over the OpenAPI schema, so endpoints added later are covered: each string
    path or query parameter, and each string field of each JSON body, gets each payload."""
    schema = create_app(Settings(database_url=api.database_url, worker_enabled=False)).openapi()
    checked = 0
    with nothing_changes(api):
        for path, operations in schema["paths"].items():
            for method, op in operations.items():
                if method.upper() in ("PUT", "POST", "PATCH", "DELETE") and not _safe_write(
                    path
                ):
                    continue  # writes are covered field by field below and above
                params = [p for p in op.get("parameters", []) if p["in"] in ("path", "query")]
                for param in params:
                    for payload in SWEEP_PAYLOADS:
                        url = _fill(path, api, {param["name"]: payload} if param["in"] == "path"
                                    else {})
                        query = {param["name"]: payload} if param["in"] == "query" else {}
                        started = time.monotonic()
                        resp = api.client.request(method.upper(), url, params=query,
                                                  json=_body(op))
                        assert resp.status_code < 500, (method, path, param["name"], resp.text)
                        assert time.monotonic() - started < 5, (method, path, payload)
                        checked += 1
    assert checked > 50
    # Refused writes: each string field of each body gets each payload where it is invalid.
    with nothing_changes(api):
        for payload in SQL_PAYLOADS:
            if not re.match(PROJECT_PATTERN, payload):  # "_" is a fine project name
                refused(api.client.put(f"/api/v1/runs/{uuid.uuid4()}",
                                       json={"project": payload}), 422, "project")
            if not re.match(KEY_PATTERN, payload):  # "_" is a fine metric name
                refused(api.client.put(f"/api/v1/runs/{uuid.uuid4()}", json={
                    "project": api.project, "config": {"fit_key": payload}}), 422, "fit_key")
                refused(api.client.post(f"/api/v1/runs/{api.run_id}/metrics",
                                        json=batch([1], **{payload: [1.0]})), 422)
                refused(api.client.put(f"/api/v1/projects/{api.project}/rules/non_finite",
                                       json={"params": {"keys": [payload]}}), 422, "keys")
            refused(api.client.patch(f"/api/v1/runs/{api.run_id}", json={"status": payload}),
                    422, "status")
            refused(api.client.put(f"/api/v1/projects/{api.project}/rules/non_finite",
                                   json={"severity": payload}), 422, "severity")
            refused(api.client.post(f"/api/v1/alerts/{2**31 - 1}/silence",
                                    json={"until": payload}), 422, "until")
            refused(api.client.post(f"/api/v1/projects/{api.project}/webhooks",
                                    json={"url": payload}), 422, "url")


def _safe_write(path: str) -> bool:
    """Writes whose path parameters address nothing (ids that do not exist) are safe to fuzz."""
    return "{alert_id}" in path or "{webhook_id}" in path


def _fill(path: str, api: Api, overrides: dict[str, str]) -> str:
    values = {"run_id": api.run_id, "project": api.project, "rule": "non_finite",
              "alert_id": str(2**31 - 1), "webhook_id": str(2**31 - 1), **overrides}
    for name, value in values.items():
        path = path.replace("{" + name + "}", quote(value, safe=""))
    assert "{" not in path, f"no value for a path parameter of {path}: extend _fill"
    return path


def _body(op: dict[str, Any]) -> Any:
    if "requestBody" not in op:
        return None
    return {"until": None}  # the only bodies of _safe_write operations (silence; ack has none)


# --------------------------------------------------------------------------------------------
# Numbers
# --------------------------------------------------------------------------------------------


def test_nan_and_infinity_where_they_are_not_allowed(api: Api) -> None:
    run = f"/api/v1/runs/{uuid.uuid4()}"
    metrics = f"/api/v1/runs/{api.run_id}/metrics"
    forecast = f"/api/v1/runs/{api.run_id}/forecast"
    with nothing_changes(api):
        for lit in ("NaN", "Infinity", "-Infinity", "1e400"):
            refused(api.raw("PUT", run, run_body(api, f'{{"lr": {lit}}}')), 422, "lr")
            refused(api.raw("PUT", run, run_body(api, f'{{"opt": {{"betas": [0.9, {lit}]}}}}')),
                    422, "opt.betas[1]")
            refused(api.raw("PUT", run, run_body(api, f'{{"weight_decay": {lit}}}')), 422,
                    "weight_decay")
            refused(api.raw("POST", metrics, f'{{"steps": [{lit}], "values": {{"loss": [1]}}}}'),
                    422, "steps")
            refused(api.raw("POST", metrics, f'{{"steps": [3], "values": {{"loss": [1]}}, '
                                             f'"wall_time": [{lit}]}}'), 422, "wall_time")
            refused(api.raw("PUT", f"/api/v1/projects/{api.project}/rules/grad_norm_drift",
                            f'{{"params": {{"rise_factor": {lit}}}}}'), 422, "rise_factor")
            refused(api.raw("PUT", f"/api/v1/projects/{api.project}/rules/grad_norm_drift",
                            f'{{"for_steps": {lit}}}'), 422, "for_steps")
        for word in ("nan", "inf", "-inf", "Infinity", "NaN"):
            refused(api.raw("GET", f"{forecast}/target?loss={word}"), 422, "loss")
            refused(api.raw("GET", f"{forecast}?horizon={word}"), 422, "horizon")
            refused(api.raw("GET", f"{forecast}?confidence={word}"), 422, "confidence")
            refused(api.raw("GET", f"{metrics}?max_points={word}"), 422, "max_points")
            refused(api.raw("GET", f"{metrics}?start={word}"), 422, "start")
        for value in ("true", '"1.5"'):  # strict numbers: a boolean or a string is not one
            refused(api.raw("POST", metrics, f'{{"steps": [3], "values": {{"loss": [1]}}, '
                                             f'"wall_time": [{value}]}}'), 422, "wall_time")
            refused(api.raw("PUT", run, run_body(api, f'{{"weight_decay": {value}}}')), 422,
                    "weight_decay")
            refused(api.raw("PUT", f"/api/v1/projects/{api.project}/rules/grad_norm_drift",
                            f'{{"for_steps": {value}}}'), 422, "for_steps")
        refused(api.raw("PUT", f"/api/v1/projects/{api.project}/rules/grad_norm_drift",
                        '{"enabled": 0}'), 422, "enabled")
        for value in ('"nan"', '"inf"', '"+Infinity"', '"1.0"', "true", "[1]", "{}"):
            refused(api.raw("POST", metrics, f'{{"steps": [3], "values": {{"loss": [{value}]}}}}'),
                    422, "values.loss", "item 0")
        refused(api.raw("POST", f"/api/v1/alerts/{2**31 - 1}/silence", '{"until": "NaN"}'),
                422, "until")
    # Where they are allowed, they are stored faithfully (metric values).
    ok = api.raw("POST", metrics, '{"steps": [10, 11, 12], "values": {"x": [NaN, "Infinity", '
                                  '-Infinity]}}')
    assert ok.status_code == 200 and ok.json() == {"accepted": 3, "duplicates": 0}, ok.text
    x = api.client.get(metrics, params={"keys": "x"}).json()["series"][0]
    assert x["values"] == ["NaN", "Infinity", "-Infinity"]
