"""`curvecast demo` end to end: the service, a real (tiny) training run with ScheduleFreePlus and
the client hook, the live progress line and the summary; and demos that find their port taken."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests._servers import REPO, free_port, start_server_process


def _demo_cmd(*args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "curvecast.service.cli",
        "demo",
        "--size",
        "tiny",
        "--exit-when-done",
        *args,
    ]


def _env(home: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "HOME": str(home),
        "CURVECAST_SPOOL_DIR": str(home / "spool"),
    }


def _runs(db: Path) -> dict[str, tuple[str, int]]:
    """run id (hex) -> (status, last step) of every run stored in the SQLite file ``db``."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT id, status, last_step FROM runs").fetchall()
    return {run_id: (status, last_step) for run_id, status, last_step in rows}


def test_demo_trains_streams_and_summarises(tmp_path: Path) -> None:
    port = free_port()
    db = tmp_path / "demo.db"
    proc = subprocess.run(
        _demo_cmd("--steps", "30", "--port", str(port), "--database-url", f"sqlite:///{db}"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(tmp_path),
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    match = re.search(rf"http://127\.0\.0\.1:{port}/runs/([0-9a-f-]{{36}})", out)
    assert match, out
    assert "step    30/30" in out and "final eval_loss reached" in out
    # The row's training loss is the loss reached, named as the run page's card names it.
    assert re.search(r"\| train loss reached \d+\.\d+", out), out
    with sqlite3.connect(db) as conn:
        status, last_step = conn.execute(
            "SELECT status, last_step FROM runs WHERE id = ?", (match.group(1).replace("-", ""),)
        ).fetchone()
        keys = {k for (k,) in conn.execute("SELECT key FROM series")}
    assert status == "finished" and last_step == 30
    assert {"loss", "eval_loss"} <= keys and any(k.endswith("eta") for k in keys)
    # The demo's output goes to its own directory (git-ignored), not loose into the cwd.
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".log"] == []
    # The training log says how far training got (it was 0 bytes after a whole run).
    log = (tmp_path / "curvecast-demo" / f"train-{match.group(1)[:8]}.log").read_text()
    assert f"run {match.group(1)}: 30 steps" in log and "step 30/30 loss " in log, log
    assert "finished: " in log, log


def test_two_demos_next_to_a_foreign_server_each_use_their_own(tmp_path: Path) -> None:
    """The reported bug: a second demo on a busy port found the other server's /healthz and
    streamed its run into that server's database. Here a foreign curvecast server holds the
    port both demos ask for; each demo must move to a port of its own, say so, and store its
    run in its own database, the foreign one receiving nothing."""
    foreign_db = tmp_path / "foreign.db"
    foreign = start_server_process(f"sqlite:///{foreign_db}", tmp_path)
    demos: list[tuple[Path, subprocess.Popen[str]]] = []
    try:
        shared = tmp_path / "demo"
        for name in ("a", "b"):
            home = tmp_path / name
            home.mkdir()
            # Both ask for the same directory (its default database, curvecast.db, too): a
            # demo still running holds it, so the other takes demo-2.
            cmd = _demo_cmd("--steps", "12", "--port", str(foreign.port), "--dir", str(shared))
            demos.append(
                (
                    home,
                    subprocess.Popen(
                        cmd,
                        cwd=home,
                        env=_env(home),
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                    ),
                )
            )
        outputs = [proc.communicate(timeout=300)[0] for _, proc in demos]
        assert _runs(foreign_db) == {}, foreign.log()
    finally:
        for _, proc in demos:
            if proc.poll() is None:
                proc.kill()
        foreign.stop()
    ports, run_ids, dirs = [], [], []
    for (_home, proc), out in zip(demos, outputs, strict=True):
        assert proc.returncode == 0, out
        assert f"port {foreign.port} is in use" in out, out
        match = re.search(r"serving at http://127\.0\.0\.1:(\d+) ", out)
        assert match, out
        ports.append(int(match.group(1)))
        run = re.search(rf"127\.0\.0\.1:{match.group(1)}/runs/([0-9a-f-]{{36}})", out)
        assert run, out
        run_ids.append(run.group(1).replace("-", ""))
        assert "step    12/12" in out, out
        db = re.search(r"database: sqlite:///(\S+)\)", out)
        assert db, out
        dirs.append(Path(db.group(1)).parent)
    assert foreign.port not in ports and ports[0] != ports[1]
    # Unless the first was done before the second began, each had a directory of its own.
    assert sorted(dirs) == [shared, shared.with_name("demo-2")] or dirs == [shared, shared]
    for directory, run_id in zip(dirs, run_ids, strict=True):
        runs = _runs(directory / "curvecast.db")
        assert runs[run_id] == ("finished", 12)
        if dirs[0] != dirs[1]:
            assert runs == {run_id: ("finished", 12)}


def test_progress_line_names_the_target_state_not_a_question_mark() -> None:
    """The ETA part's words, from answers shaped by the service's own schema: a finished run
    that did not reach the target says so (the service gives it no ETA), and the interval is
    said plainly: it read "ETA to 1.35: 13s (0s to after the run's end)"."""
    from datetime import UTC, datetime

    from curvecast.service.demo_progress import target_text
    from curvecast.service.schemas.forecast import EtaOut, TargetAnswer, TargetOut

    def answer(target: TargetOut | None, eta: EtaOut | None = None) -> dict[str, object]:
        return TargetAnswer(status="ok", key="eval_loss", target=target, eta=eta).model_dump(
            mode="json"
        )

    ahead = TargetOut(loss=1.5, step=900, lo=800, hi=1000, reachable=True)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    eta = EtaOut(steps_per_second=10.0, seconds=75.0, at=now)
    # The ETA with its interval: the target's steps 800-1000 at 10 steps/s around step 900.
    assert target_text(1.5, answer(ahead, eta), finished=False) == (
        "ETA to 1.5: about 1m15s, between 1m05s and 1m25s"
    )
    open_ended = TargetOut(loss=1.5, step=900, lo=800, hi=None, reachable=True)
    assert target_text(1.5, answer(open_ended, eta), finished=False) == (
        "ETA to 1.5: about 1m15s, 1m05s at the earliest, maybe never"
    )
    # A run that ends at step 950: the pessimistic end (step 1000, or never) is past it, so
    # no time the run will not last; a target the fit puts past the end gets no ETA at all.
    for target in (ahead, open_ended):
        assert target_text(1.5, answer(target, eta), finished=False, last_step=950) == (
            "ETA to 1.5: about 1m15s, 1m05s at the earliest, maybe not before the run ends"
        )
    assert target_text(1.5, answer(ahead, eta), finished=False, last_step=1000) == (
        "ETA to 1.5: about 1m15s, between 1m05s and 1m25s"
    )
    # The reported row: an early end already here, a late end past the run's.
    soon = TargetOut(loss=1.35, step=1930, lo=1700, hi=2400, reachable=True)
    assert target_text(1.35, answer(soon, EtaOut(steps_per_second=10.0, seconds=13.0, at=now)),
                       finished=False, last_step=2000) == (
        "ETA to 1.35: about 13s, anywhere from now to after the run ends"
    )
    # Past the planned end the service marks the target and gives no ETA.
    past = ahead.model_copy(update={"past_planned_end": True, "reason": "after the run's ..."})
    assert target_text(1.5, answer(past), finished=False, last_step=850) == (
        "1.5 only after the run's end by the fit (step 900)"
    )
    due = EtaOut(steps_per_second=10.0, seconds=0.0, at=now)  # the fit is there, the data not
    assert target_text(1.5, answer(ahead, due), finished=False) == "1.5 due now by the fit"
    assert target_text(1.5, answer(ahead), finished=True) == (
        "1.5 not reached by the end of the run"
    )
    passed = TargetOut(loss=1.5, step=412, lo=None, hi=None, reachable=True, reached=True)
    assert target_text(1.5, answer(passed), finished=True) == "1.5 reached at step 412"
    below = TargetOut(loss=0.1, step=None, lo=None, hi=None, reachable=False,
                      reason="below f*'s interval")
    assert target_text(0.1, answer(below), finished=False) == (
        "0.1 unreachable (below f*'s interval)"
    )


class _Screen:
    """The part of a terminal the progress rows use: characters written at the cursor, lines
    that wrap at the width, carriage return, newline, cursor up (ESC [1A) and clear line
    (ESC [2K). What a person sees is ``lines``."""

    def __init__(self, width: int) -> None:
        self.width, self.lines, self.row, self.col = width, [""], 0, 0

    def write(self, text: str) -> None:
        i = 0
        while i < len(text):
            if text.startswith("\x1b[1A", i):
                self.row, i = max(0, self.row - 1), i + 4
                continue
            if text.startswith("\x1b[2K", i):
                self.lines[self.row], i = "", i + 4
                continue
            ch, i = text[i], i + 1
            if ch == "\r":
                self.col = 0
            elif ch == "\n":
                self._down()
            else:
                if self.col == self.width:  # auto-wrap: the next character starts a new line
                    self._down()
                line = self.lines[self.row].ljust(self.col)
                self.lines[self.row] = line[: self.col] + ch + line[self.col + 1:]
                self.col += 1

    def _down(self) -> None:
        self.row, self.col = self.row + 1, 0
        if self.row == len(self.lines):
            self.lines.append("")

    def flush(self) -> None:
        pass


def test_progress_rows_are_redrawn_in_place_on_a_narrow_terminal() -> None:
    """The reported bug: the progress line was 160 characters long; on a narrower terminal it
    wrapped, and every redraw left its first screen line behind (a new cut-off line every
    second). The rows are cut to the width, and a redraw replaces the two rows in place."""
    from curvecast.service.demo_terminal import Rows

    screen = _Screen(width=60)
    rows = Rows(screen, width=lambda: 60)
    progress = "step {:>5}/2000 [####....] 1m29s elapsed, ~15s left | train loss 1.214 | eval 1.39"
    forecast = "→ final eval_loss 1.336 [1.303, 1.383] | f* 1.051 | ETA to 1.35: 7s"
    for step in (100, 200, 300):
        rows.draw([progress.format(step), forecast])
    assert len(screen.lines) == 2, screen.lines
    assert screen.lines[0].startswith("step   300/2000") and screen.lines[0].endswith("…")
    assert all(len(line) < 60 for line in screen.lines)
    assert screen.lines[1].startswith("→ final eval_loss 1.336")
    rows.draw(["step  2000/2000 done", "→ final eval_loss 1.359 reached"], final=True)
    print_after = "final eval loss (at the averaged weights x): 1.359"
    screen.write(print_after + "\n")
    assert screen.lines[:3] == ["step  2000/2000 done", "→ final eval_loss 1.359 reached",
                                print_after]


def test_log_messages_print_above_the_progress_rows() -> None:
    """A warning of the service's worker, written straight to the terminal mid-run, landed
    inside the two rows and was half overwritten by the next redraw, which then left a stale
    row behind. Messages go through the rows: printed whole above them, the rows redrawn below
    and kept in place by later draws. The last draw is not cut: its end is the answer."""
    import logging

    from curvecast.service.demo_terminal import AboveRows, Rows

    screen = _Screen(width=60)
    rows = Rows(screen, width=lambda: 60)
    log = logging.getLogger("curvecast.test_demo_rows")
    log.propagate = False
    log.addHandler(AboveRows(rows))
    try:
        rows.draw(["step   100/2000", "→ final eval_loss 1.5 [1.2, 1.9]"])
        log.info("not shown: below WARNING")
        log.warning("refit of run 1 failed: a message long enough to wrap past sixty columns "
                    "of this terminal")
        rows.draw(["step   200/2000", "→ final eval_loss 1.4 [1.2, 1.7]"])
    finally:
        log.handlers.clear()
    message = ("WARNING: refit of run 1 failed: a message long enough to wrap past sixty "
               "columns of this terminal")
    assert "".join(screen.lines[:2]) == message
    assert screen.lines[2:] == ["step   200/2000", "→ final eval_loss 1.4 [1.2, 1.7]"]
    # The last draw, uncut: its first row wraps onto the second row drawn before, which must
    # not show through (seen at 90 columns: "24final eval_loss 2.324 reached; fit 2.234 …").
    done = "step  2000/2000 [################] 1m29s elapsed, ~0s left | eval_loss 1.359"
    end = "→ final eval_loss 1.359 reached; fit 1.351 [1.329, 1.383] | 1.35 not reached by the end"
    rows.draw([done, end], final=True)
    assert "".join(screen.lines[2:4]) == done
    assert "".join(screen.lines[4:]).rstrip() == end


def test_forecast_part_names_the_loss_reached_once_the_run_got_there() -> None:
    """At the end of a run the line showed "→ final eval_loss 1.353" beside the summary's
    "final eval loss 1.359": the fit's value called final. Once the fitted series has a point
    at the horizon, that is the final loss and the fit is named as the fit."""
    from curvecast.service.demo_progress import forecast_text

    forecast = {"status": "ok", "prediction": {"value": 1.353, "lo": 1.333, "hi": 1.381},
                "f_star": {"value": 1.111, "lo": 1.03, "hi": 1.2}}
    assert forecast_text(forecast, "eval_loss", None) == (
        "→ final eval_loss 1.353 [1.333, 1.381] | f* 1.111"
    )
    assert forecast_text(forecast, "eval_loss", 1.359) == (
        "→ final eval_loss 1.359 reached; fit 1.353 [1.333, 1.381] | f* 1.111"
    )
    early = {**forecast, "status": "too_early", "f_star": {"value": None, "hi": 2.41}}
    assert forecast_text(early, "eval_loss", None) == (
        "→ final eval_loss 1.353 [1.333, 1.381] (too_early) | f* ≤ 2.410"
    )
