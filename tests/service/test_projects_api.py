"""The projects endpoints through the real app on both backends: which projects exist, with
their runs counted by status, and a project token that sees only its own."""

from __future__ import annotations

import uuid
from datetime import datetime

import httpx

from curvecast.service.app import create_app
from curvecast.service.config import Settings
from tests.support import create_token, serve_app


def _runs(url: str, project: str, statuses: list[str], headers: dict[str, str] | None = None
          ) -> None:
    with httpx.Client(base_url=url, headers=headers or {}, timeout=30) as client:
        for i, status in enumerate(statuses):
            run_id = uuid.uuid4()
            client.put(f"/api/v1/runs/{run_id}", json={"project": project, "name": f"r{i}"}
                       ).raise_for_status()
            if status != "running":
                client.patch(f"/api/v1/runs/{run_id}", json={"status": status}
                             ).raise_for_status()


def test_projects_are_listed_by_name_with_their_runs_by_status(database_url: str) -> None:
    tag = uuid.uuid4().hex[:8]
    lm, vision = f"lm-{tag}", f"vision-{tag}"
    settings = Settings(database_url=database_url, worker_enabled=False)
    with serve_app(create_app(settings)) as url:
        _runs(url, vision, ["running"])
        _runs(url, lm, ["running", "running", "finished", "crashed"])
        listed = httpx.get(f"{url}/api/v1/projects")
        assert listed.status_code == 200, listed.text
        mine = [p for p in listed.json()["projects"] if p["name"] in (lm, vision)]
        assert [p["name"] for p in mine] == [lm, vision]
        names = [p["name"] for p in listed.json()["projects"]]
        assert names == sorted(names)
        assert mine[0]["runs"] == 4 and mine[0]["firing_alerts"] == 0
        assert mine[0]["runs_by_status"] == {"running": 2, "finished": 1, "crashed": 1}
        assert mine[1]["runs_by_status"] == {"running": 1}
        assert datetime.fromisoformat(mine[0]["last_update"]).tzinfo is not None

        one = httpx.get(f"{url}/api/v1/projects/{lm}")
        assert one.status_code == 200 and one.json() == mine[0]
        missing = httpx.get(f"{url}/api/v1/projects/nope-{tag}")
        assert missing.status_code == 404
        assert missing.json()["message"] == f"project 'nope-{tag}' not found"
        bad = httpx.get(f"{url}/api/v1/projects/has space")
        assert bad.status_code == 422 and "project" in bad.json()["message"]


def test_a_project_token_sees_only_its_project(database_url: str) -> None:
    tag = uuid.uuid4().hex[:8]
    ours, theirs = f"ours-{tag}", f"theirs-{tag}"
    read = create_token(database_url, ours, "read")
    settings = Settings(database_url=database_url, worker_enabled=False, auth_enabled=True)
    with serve_app(create_app(settings)) as url:
        for project in (ours, theirs):
            ingest = create_token(database_url, project, "ingest")
            _runs(url, project, ["running"], {"Authorization": f"Bearer {ingest}"})
        assert httpx.get(f"{url}/api/v1/projects").status_code == 401
        auth = {"Authorization": f"Bearer {read}"}
        listed = httpx.get(f"{url}/api/v1/projects", headers=auth).json()["projects"]
        assert [p["name"] for p in listed] == [ours]
        refused = httpx.get(f"{url}/api/v1/projects/{theirs}", headers=auth)
        assert refused.status_code == 404 and theirs in refused.json()["message"]
        assert httpx.get(f"{url}/api/v1/projects/{ours}", headers=auth).json()["runs"] == 1
