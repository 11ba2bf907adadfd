"""TensorBoard event directories: written by torch.utils.tensorboard, read by the importer,
compared point by point with what TensorBoard's own EventAccumulator reads from the same files,
and imported into both databases (again, resumed, appended to)."""

from __future__ import annotations

import math
import shutil
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
from tensorboard.util import tensor_util
from torch.utils.tensorboard import SummaryWriter

from curvecast.contract import key_for_name
from curvecast.service.config import Settings
from curvecast.service.db import make_engine, make_sessionmaker, session_scope
from curvecast.service.importers import ImportInputError, KeyMap
from curvecast.service.importers.events import find_runs, read_curves
from curvecast.service.store import alerts as alert_store
from curvecast.service.store._common import utcnow
from tests.imports.conftest import Points, run_import, stored

WALL0 = 1_700_000_000.0


def write_run(logdir: Path, steps: range, *, seed: int = 0) -> None:
    """A run as torch writes it: legacy simple values, new-style tensors (float and double), a
    tag that is not a metric key as it is, a histogram (not a scalar)."""
    rng = np.random.default_rng(seed)
    with SummaryWriter(str(logdir)) as writer:
        for step in steps:
            wall = WALL0 + step * 0.5
            writer.add_scalar("train/loss", 3.0 / math.sqrt(step + 1) + 1 + rng.normal(0, 0.01),
                              step, walltime=wall)
            if step % 10 == 0:
                writer.add_scalar("eval/loss", 2.5 / math.sqrt(step + 1) + 1, step,
                                  walltime=wall, new_style=True)
                writer.add_scalar("opt/lr", 0.1 / (1 + step), step, walltime=wall,
                                  new_style=True, double_precision=True)
                writer.add_scalar("accuracy (top 1)", step / 1000, step, walltime=wall)
            if step % 50 == 0:
                writer.add_histogram("weights", rng.normal(size=100), step, walltime=wall)


def tensorboard_reads(logdir: Path) -> Points:
    """Every scalar TensorBoard's EventAccumulator reads (all of them: no sampling), by key."""
    acc = EventAccumulator(str(logdir), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    out: Points = {}
    for tag in acc.Tags()["tensors"]:
        if acc.SummaryMetadata(tag).plugin_data.plugin_name != "scalars":
            continue
        key = key_for_name(tag)
        assert key is not None
        out[key] = sorted((e.step, float(tensor_util.make_ndarray(e.tensor_proto)), e.wall_time)
                          for e in acc.Tensors(tag))
    return out


def read_all(logdir: Path, batch_points: int = 50_000) -> Points:
    out: Points = {}
    (run,) = find_runs(logdir)
    for checkpoint in run.checkpoints(KeyMap(), batch_points):
        assert checkpoint.n_points <= batch_points
        for chunk in checkpoint.chunks:
            assert chunk.wall_times is not None
            out.setdefault(chunk.key, []).extend(zip(chunk.steps.tolist(), chunk.values.tolist(),
                                                     chunk.wall_times.tolist(), strict=True))
    return {key: sorted(points) for key, points in out.items()}


def test_the_reader_reads_what_tensorboard_reads(tmp_path: Path) -> None:
    logdir = tmp_path / "runs" / "exp1"
    write_run(logdir, range(300))
    expected = tensorboard_reads(logdir)
    assert set(expected) == {"train/loss", "eval/loss", "opt/lr", "accuracy_top_1"}
    assert len(expected["train/loss"]) == 300 and len(expected["eval/loss"]) == 30
    # Small checkpoints: the same points, never more than a batch in memory.
    assert read_all(logdir, batch_points=7) == expected
    assert read_all(logdir) == expected
    curves = read_curves(logdir)
    assert curves["eval/loss"][0] == [float(s) for s, _, _ in expected["eval/loss"]]


def test_import_round_trip_then_again_then_more(database_url: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    logdir = tmp_path / "runs"
    write_run(logdir / "exp1", range(200))
    write_run(logdir / "exp2", range(50), seed=1)
    assert run_import("tensorboard", str(logdir), "--database-url", database_url,
                      "--project", "tb", "--batch-points", "64") == 0
    runs = {r.run.name: r for r in find_runs(logdir)}
    assert set(runs) == {"exp1", "exp2"}
    for name, tb in runs.items():
        run, points = stored(database_url, tb.run.run_id)
        assert points == tensorboard_reads(logdir / name), name
        assert (run.name, run.project, run.status) == (name, "tb", "finished")
        assert run.status_reason == "imported from TensorBoard"
        assert run.source["kind"] == "tensorboard"
        assert run.source["path"] == str((logdir / name).resolve())
        assert run.source["files"] == {p.name: p.stat().st_size for p in tb.files}
    out = capsys.readouterr().out
    assert "loss: eval/loss" in out and "imported 2 of 2 run(s)" in out

    # Again: the same runs, nothing stored twice, nothing read again.
    before = stored(database_url, runs["exp1"].run.run_id)
    assert run_import("tensorboard", str(logdir), "--database-url", database_url,
                      "--project", "tb") == 0
    assert "nothing new since the last import" in capsys.readouterr().out
    assert stored(database_url, runs["exp1"].run.run_id)[1] == before[1]
    assert stored(database_url, runs["exp1"].run.run_id)[0].n_points == before[0].n_points

    # The run goes on (a new event file, as a restarted writer makes): only its points are new.
    write_run(logdir / "exp1", range(200, 260))
    assert run_import("tensorboard", str(logdir / "exp1"), "--database-url", database_url,
                      "--project", "tb") == 0
    assert "15,000" not in capsys.readouterr().out
    run, points = stored(database_url, runs["exp1"].run.run_id)
    assert points == tensorboard_reads(logdir / "exp1")
    assert run.n_points == sum(len(p) for p in points.values())


def test_an_interrupted_file_is_continued_where_it_stopped(database_url: str,
                                                           tmp_path: Path) -> None:
    source = tmp_path / "source"
    write_run(source, range(120))
    (event_file,) = source.iterdir()
    whole = event_file.read_bytes()
    logdir = tmp_path / "live"
    logdir.mkdir()
    partial = logdir / event_file.name
    # A writer in the middle of a record: the import stops at the last whole one.
    partial.write_bytes(whole[: len(whole) * 2 // 3 + 5])
    assert run_import("tensorboard", str(logdir), "--database-url", database_url) == 0
    (tb,) = find_runs(logdir)
    run, points = stored(database_url, tb.run.run_id)
    first = run.n_points
    assert 0 < first < sum(len(p) for p in tensorboard_reads(source).values())
    assert run.source["files"][partial.name] < partial.stat().st_size
    partial.write_bytes(whole)
    assert run_import("tensorboard", str(logdir), "--database-url", database_url) == 0
    run, points = stored(database_url, tb.run.run_id)
    assert points == tensorboard_reads(source)
    assert run.n_points == sum(len(p) for p in points.values())


def test_a_damaged_record_keeps_what_comes_before(database_url: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    logdir = tmp_path / "run"
    write_run(logdir, range(100))
    (event_file,) = logdir.iterdir()
    raw = bytearray(event_file.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    event_file.write_bytes(bytes(raw))
    assert run_import("tensorboard", str(logdir), "--database-url", database_url) == 0
    assert "damaged record at byte" in capsys.readouterr().err
    (tb,) = find_runs(logdir)
    run, points = stored(database_url, tb.run.run_id)
    assert 0 < run.n_points < 100
    assert points["train/loss"][0][0] == 0


def test_imported_history_is_not_judged_by_the_alert_rules(database_url: str,
                                                           tmp_path: Path) -> None:
    write_run(tmp_path / "quiet", range(100))
    write_run(tmp_path / "judged", range(100))
    # An import that stops part way (two tags that map to one key, met after some batches
    # were stored): what it stored is history as well.
    with SummaryWriter(str(tmp_path / "stopped")) as writer:
        for step in range(100):
            writer.add_scalar("train_loss", 1.0, step)
        writer.add_scalar("train loss", 1.0, 100)
    assert run_import("tensorboard", str(tmp_path / "quiet"), "--database-url",
                      database_url) == 0
    assert run_import("tensorboard", str(tmp_path / "judged"), "--database-url", database_url,
                      "--alerts") == 0
    assert run_import("tensorboard", str(tmp_path / "stopped"), "--database-url", database_url,
                      "--batch-points", "10") == 2
    quiet, judged, stopped = (find_runs(tmp_path / name)[0].run.run_id
                              for name in ("quiet", "judged", "stopped"))
    assert stored(database_url, stopped)[0].n_points >= 10
    engine = make_engine(Settings(database_url=database_url))
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            # Later than any hold of an import would last.
            jobs = alert_store.claim_eval_jobs(session, now=utcnow() + timedelta(minutes=11),
                                               lease=timedelta(seconds=60), limit=10)
    finally:
        engine.dispose()
    assert [job.run_id for job in jobs] == [judged]


def test_tags_key_and_names_that_collide(database_url: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    logdir = tmp_path / "run"
    write_run(logdir, range(40))
    assert run_import("tensorboard", str(logdir), "--database-url", database_url,
                      "--tags", "train/*", "--key", "train/loss") == 0
    (tb,) = find_runs(logdir)
    run, points = stored(database_url, tb.run.run_id)
    assert set(points) == {"train/loss"}
    assert run.config["fit_key"] == "train/loss"
    assert "loss: train/loss" in capsys.readouterr().out

    clash = tmp_path / "clash"
    with SummaryWriter(str(clash)) as writer:
        writer.add_scalar("train loss", 1.0, 0)
        writer.add_scalar("train_loss", 2.0, 0)
    assert run_import("tensorboard", str(clash), "--database-url", database_url) == 2
    err = capsys.readouterr().err
    assert "'train loss' and 'train_loss' both map to the key 'train_loss'" in err


def test_a_path_without_event_files_says_so(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert run_import("tensorboard", str(tmp_path / "empty"), "--database-url",
                      f"sqlite:///{tmp_path / 'x.db'}") == 2
    assert "no TensorBoard event files" in capsys.readouterr().err
    with pytest.raises(ImportInputError, match="holds 2 TensorBoard runs"):
        write_run(tmp_path / "two" / "a", range(3))
        write_run(tmp_path / "two" / "b", range(3))
        read_curves(tmp_path / "two")
    shutil.rmtree(tmp_path / "two")
