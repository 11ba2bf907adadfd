"""``curvecast rank``: the same ranking from the database and from a real server, as a table
and as the API's JSON; errors say what to fix."""

from __future__ import annotations

import json
import pathlib
import uuid
from collections.abc import Iterator

import pytest

from curvecast.service.app import create_app
from curvecast.service.cli import main
from curvecast.service.config import Settings
from tests.service.test_decisions_api import TOTAL, World, build
from tests.support import serve_app


@pytest.fixture(scope="module")
def world(database_url: str) -> Iterator[tuple[World, str]]:
    settings = Settings(database_url=database_url, worker_enabled=False,
                        refit_min_interval_s=0)
    app = create_app(settings)
    with serve_app(app) as url:
        yield build(url, settings, app.state.sessionmaker,
                    f"rank-cli-{uuid.uuid4().hex[:8]}"), database_url


def rank(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["rank", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_table_from_the_database(world: tuple[World, str],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    w, database_url = world
    code, out, _ = rank(capsys, w.project, "--database-url", database_url)
    assert code == 0
    lines = out.splitlines()
    assert f"compared at step {TOTAL:,} (the largest planned total_steps)" in lines[0]
    assert lines[2].split() == ["#", "run", "status", "P(best)", "loss", "at", "horizon",
                                "why", "/", "note"]
    first = lines[3].split()
    assert first[:4] == ["1", "good", "<b>", "running"] and first[4] == ">99.9%"
    assert "(observed)" in next(line for line in lines if " done " in line)
    crashed = next(line for line in lines if " crashed " in line)
    assert crashed.lstrip().startswith("-") and "the run crashed" in crashed


def test_the_same_answer_from_the_service(world: tuple[World, str],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    w, database_url = world
    args = (w.project, "--horizon", "12000", "--json")
    code, served, _ = rank(capsys, *args, "--url", w.url)
    assert code == 0
    code, direct, _ = rank(capsys, *args, "--database-url", database_url)
    assert code == 0 and json.loads(served) == json.loads(direct)
    assert json.loads(served)["horizon"] == 12_000


def test_errors_say_what_to_fix(world: tuple[World, str],
                                capsys: pytest.CaptureFixture[str]) -> None:
    w, database_url = world
    code, _, err = rank(capsys, "no-such-project", "--url", w.url)
    assert code == 2 and "404" in err and "project 'no-such-project' not found" in err
    code, _, err = rank(capsys, "no-such-project", "--database-url", database_url)
    assert code == 2 and "project 'no-such-project' not found" in err
    code, _, err = rank(capsys, w.project, "--horizon", "0", "--database-url", database_url)
    assert code == 2 and "--horizon" in err
    # A ranking's options without a project would be ignored by the listing: refused instead.
    code, out, err = rank(capsys, "--horizon", "100", "--database-url", database_url)
    assert code == 2 and not out and "--horizon needs a project to rank: name it" in err


def test_a_database_without_the_schema_says_to_migrate(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    for project in ((), ("some-project",)):
        code, _, err = rank(capsys, *project, "--database-url", str(tmp_path / "new.db"))
        assert code == 2 and "run `curvecast migrate`" in err and "Traceback" not in err


def test_without_a_project_it_lists_the_projects(world: tuple[World, str],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # The database holds other tests' projects too: the world's is among them, counted, and
    # the service and the database list the same projects.
    w, database_url = world
    code, out, _ = rank(capsys, "--database-url", database_url)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:5] == ["project", "runs", "by", "status", "alerts"]
    ours = next(line.split() for line in lines if line.split()[:1] == [w.project])
    runs = int(ours[1])
    assert runs >= 3 and "crashed" in " ".join(ours)
    assert lines[-1] == "rank one with: curvecast rank PROJECT"
    code, served, _ = rank(capsys, "--json", "--url", w.url)
    assert code == 0
    listed = {p["name"]: p for p in json.loads(served)["projects"]}
    assert listed[w.project]["runs"] == runs
    code, direct, _ = rank(capsys, "--json", "--database-url", database_url)
    assert code == 0 and {p["name"] for p in json.loads(direct)["projects"]} == set(listed)


def test_an_empty_database_says_how_runs_get_a_project(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    database = tmp_path / "empty.db"
    assert main(["migrate", "--database-url", str(database)]) == 0
    capsys.readouterr()
    code, out, _ = rank(capsys, "--database-url", str(database))
    assert code == 0 and out.startswith("no projects yet") and "Monitor(project=" in out
