"""``curvecast rank``: the same ranking from the database and from a real server, as a table
and as the API's JSON; errors say what to fix."""

from __future__ import annotations

import json
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
