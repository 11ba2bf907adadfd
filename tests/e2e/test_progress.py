"""Long-running commands say what they are doing and how far along they are: `curvecast
migrate` names each revision as it applies it, and the benches' shared phase lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench._report import phase
from curvecast.service.migrate import head_revision, pending_revisions
from tests._servers import REPO


def _migrate(db: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "curvecast.service.cli", "migrate", "--database-url", str(db)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_migrate_names_each_revision_as_it_applies_it(tmp_path: Path) -> None:
    db = tmp_path / "fresh.db"
    revisions = [s.revision for s in pending_revisions(f"sqlite:///{db}")]
    assert revisions[-1] == head_revision() and len(revisions) >= 2
    proc = _migrate(db)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    n = len(revisions)
    applying = [line for line in lines if " applying revision " in line]
    # Every revision, oldest first, numbered, each followed by its "applied" line.
    assert [line.split()[0] for line in applying] == [f"[{i}/{n}]" for i in range(1, n + 1)]
    assert [line.split()[3].rstrip(":") for line in applying] == revisions
    for i, rev in enumerate(revisions, start=1):
        start = lines.index(next(x for x in lines if x.startswith(f"[{i}/{n}] applying")))
        assert lines[start + 1].startswith(f"[{i}/{n}] revision {rev} applied in ")
    assert lines[-1].endswith("is at revision head")
    assert pending_revisions(f"sqlite:///{db}") == []
    again = _migrate(db)
    assert again.returncode == 0 and "nothing to apply" in again.stdout, again.stdout


def test_bench_phase_lines(capsys: pytest.CaptureFixture[str]) -> None:
    with phase("demo-bench", "ingesting 10 steps", 2, 3):
        print("inside", file=sys.stderr)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "[demo-bench 2/3] ingesting 10 steps ..."
    assert err[1] == "inside"
    assert err[2].startswith("[demo-bench 2/3] ingesting 10 steps: done in ")
