"""`curvecast demo` end to end: the service, a real (tiny) training run with ScheduleFreePlus and
the client hook, the live progress line and the summary."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests._servers import REPO, free_port


def test_demo_trains_streams_and_summarises(tmp_path: Path) -> None:
    port = free_port()
    db = tmp_path / "demo.db"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "curvecast.service.cli",
            "demo",
            "--steps",
            "30",
            "--size",
            "tiny",
            "--port",
            str(port),
            "--database-url",
            f"sqlite:///{db}",
            "--exit-when-done",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(REPO),
            "HOME": str(tmp_path),
            "CURVECAST_SPOOL_DIR": str(tmp_path / "spool"),
        },
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    match = re.search(rf"http://127\.0\.0\.1:{port}/runs/([0-9a-f-]{{36}})", out)
    assert match, out
    assert "step    30/30" in out and "final eval loss" in out
    with sqlite3.connect(db) as conn:
        status, last_step = conn.execute(
            "SELECT status, last_step FROM runs WHERE id = ?", (match.group(1).replace("-", ""),)
        ).fetchone()
        keys = {k for (k,) in conn.execute("SELECT key FROM series")}
    assert status == "finished" and last_step == 30
    assert {"loss", "eval_loss"} <= keys and any(k.endswith("eta") for k in keys)
    assert (tmp_path / "curvecast-demo-train.log").exists()
