"""The spool on its own: append-only segments, size cap, locking, cleanup, sync-side reading."""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path

from curvecast.client._batcher import encode_records, plain_body
from curvecast.client._sender import Counters, spool_batch
from curvecast.client._spool import (
    META,
    SegmentReader,
    Spool,
    default_spool_dir,
    find_run_dirs,
    is_locked,
    read_meta,
)


def body(step: int) -> bytes:
    return encode_records([(step, 0.0, {"loss": float(step)}, None)])[0][0].body


def test_segments_rotate_and_replay_in_order(tmp_path: Path) -> None:
    run = str(uuid.uuid4())
    spool = Spool(tmp_path, run, segment_bytes=200, meta=lambda: {"run_id": run, "project": "p"})
    for step in range(10):
        assert spool.append(body(step))
    segments = spool.closed_segments()
    assert len(segments) > 1
    steps = []
    for segment in segments:
        reader = SegmentReader(segment, lambda *a: None)
        while (item := reader.next()) is not None:
            steps.append(json.loads(plain_body(item[0]))["steps"][0])
            assert item[1] == 1
        reader.close()
    assert steps == list(range(10))
    assert read_meta(spool.path) == {"run_id": run, "project": "p"}
    assert is_locked(spool.path)
    for segment in segments:
        spool.remove_segment(segment)
    assert spool.nbytes == 0 and spool.cleanup() and not spool.path.exists()
    assert not is_locked(tmp_path)


def test_cap_refuses_appends_and_says_points_are_lost(tmp_path: Path, caplog) -> None:
    spool = Spool(tmp_path, str(uuid.uuid4()), max_bytes=300)
    counters = Counters()
    batches = [encode_records([(s, 0.0, {"loss": 1.0}, None)])[0][0] for s in range(10)]
    with caplog.at_level(logging.WARNING, "curvecast.client"):
        results = [spool_batch(spool, b, counters) for b in batches]
    assert results[0] and not results[-1]
    assert counters.points_spooled + counters.points_dropped == 10 and counters.points_dropped
    assert caplog.text.count("POINTS ARE BEING LOST") == 1
    assert "spool size cap (300 bytes) is reached" in caplog.text
    assert sum(p.stat().st_size for p in spool.path.glob("*.jsonl")) <= 300


def test_a_new_process_never_appends_to_an_old_segment(tmp_path: Path) -> None:
    run = str(uuid.uuid4())
    first = Spool(tmp_path, run)
    first.append(body(1))
    first.close()
    second = Spool(tmp_path, run)
    assert second.has_data()  # found on disk: a resumed run replays it
    second.append(body(2))
    assert len(second.closed_segments()) == 2


def test_find_run_dirs_and_default_dir(tmp_path: Path, monkeypatch) -> None:
    for _ in range(2):
        Spool(tmp_path, str(uuid.uuid4()), meta=lambda: {"project": "p"}).append(body(1))
    (tmp_path / "unrelated").mkdir()
    dirs = find_run_dirs(tmp_path)
    assert len(dirs) == 2 and all((d / META).exists() for d in dirs)
    assert find_run_dirs(dirs[0]) == [dirs[0]]
    monkeypatch.setenv("CURVECAST_SPOOL_DIR", str(tmp_path / "x"))
    assert default_spool_dir() == tmp_path / "x"
    monkeypatch.delenv("CURVECAST_SPOOL_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_spool_dir() == tmp_path / "cache" / "curvecast" / "spool"
