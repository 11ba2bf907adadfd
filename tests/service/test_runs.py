"""Runs API on both backends, through a real uvicorn server."""

from __future__ import annotations

import uuid

import httpx


def put_run(
    server: str, project: str, run_id: uuid.UUID | None = None, **body: object
) -> httpx.Response:
    run_id = run_id or uuid.uuid4()
    return httpx.put(f"{server}/api/v1/runs/{run_id}", json={"project": project, **body})


def test_put_creates_then_gets_unchanged(server: str, project: str) -> None:
    run_id = uuid.uuid4()
    first = put_run(server, project, run_id, name="gpt", config={"total_steps": 1000, "lr": 1.0})
    assert first.status_code == 201
    again = put_run(server, project, run_id, name="renamed", config={"total_steps": 5})
    assert again.status_code == 200
    assert again.json()["name"] == "gpt"
    assert again.json()["config"] == {"total_steps": 1000, "lr": 1.0}
    assert again.json()["status"] == "running"


def test_put_same_id_in_other_project_conflicts(server: str, project: str) -> None:
    run_id = uuid.uuid4()
    assert put_run(server, project, run_id).status_code == 201
    other = put_run(server, project + "-other", run_id)
    assert other.status_code == 409
    assert other.json()["error_code"] == "conflict"


def test_patch_status_and_merge_config(server: str, project: str) -> None:
    run_id = uuid.uuid4()
    put_run(server, project, run_id, config={"total_steps": 100, "lr": 0.5})
    resp = httpx.patch(
        f"{server}/api/v1/runs/{run_id}", json={"status": "finished", "config": {"c_warmup": 20}}
    )
    assert resp.status_code == 200
    body = resp.json()
    assert body["status"] == "finished"
    assert body["ended_at"] is not None
    assert body["config"] == {"total_steps": 100, "lr": 0.5, "c_warmup": 20}
    bad = httpx.patch(f"{server}/api/v1/runs/{run_id}", json={"status": "exploded"})
    assert bad.status_code == 422
    assert "status" in bad.json()["message"]


def test_unknown_run_is_404_with_error_body(server: str) -> None:
    resp = httpx.get(f"{server}/api/v1/runs/{uuid.uuid4()}")
    assert resp.status_code == 404
    assert resp.json()["error_code"] == "run_not_found"
    assert httpx.get(f"{server}/api/v1/runs/not-a-uuid").status_code == 422


def test_config_validation_names_the_field(server: str, project: str) -> None:
    resp = put_run(server, project, config={"total_steps": -5})
    assert resp.status_code == 422
    assert "config.total_steps" in resp.json()["message"]
    bad_name = put_run(server, "bad project!")
    assert bad_name.status_code == 422 and "project" in bad_name.json()["message"]
    # A pattern's message says what the name may hold, not the regular expression.
    listed = httpx.get(f"{server}/api/v1/runs", params={"project": "my project"})
    assert listed.status_code == 422 and listed.json()["message"] == (
        "project: 'my project' is not valid: a project name is 1-100 characters from "
        "A-Z a-z 0-9 _ . -")
    newline = put_run(server, project, name="lm\nv2")
    assert newline.status_code == 422 and newline.json()["message"] == (
        "name: 'lm\\nv2' is not valid: control characters (a newline, a tab, ...) are not "
        "allowed here")


def test_list_paginates_and_filters(server: str, project: str) -> None:
    ids = [uuid.uuid4() for _ in range(7)]
    for run_id in ids:
        put_run(server, project, run_id)
    httpx.patch(f"{server}/api/v1/runs/{ids[0]}", json={"status": "failed"})
    seen: list[str] = []
    token = None
    pages = 0
    while True:
        params = {"project": project, "limit": 3, **({"page_token": token} if token else {})}
        page = httpx.get(f"{server}/api/v1/runs", params=params).json()
        seen += [r["id"] for r in page["runs"]]
        pages += 1
        token = page["next_page_token"]
        if not token:
            break
    assert pages == 3
    assert sorted(seen) == sorted(str(i) for i in ids)
    assert len(set(seen)) == 7
    failed = httpx.get(f"{server}/api/v1/runs", params={"project": project, "status": "failed"})
    assert [r["id"] for r in failed.json()["runs"]] == [str(ids[0])]
    garbage = httpx.get(f"{server}/api/v1/runs", params={"page_token": "%%%"})
    assert garbage.status_code == 422
