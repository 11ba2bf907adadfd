"""Two live processes on one ``run_id`` share its spool directory without losing points: a
segment is replayed and unlinked only once its writer closed it or died, never while
another process still appends to it; and the second monitor is told loudly that it shares."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from curvecast.client._batcher import encode_records, plain_body
from curvecast.client._spool import Spool, is_locked
from curvecast.client.sync import sync_run
from curvecast.service.config import Settings
from tests import REPO
from tests.client._helpers import point_counts, thread_server_on, wait_for_points
from tests.support import free_port

# One "training process": logs its own key to the shared run while the service is down until
# some points are spooled, says so, waits for the parent's go (the service is up then), keeps
# logging until its own sender is back online and then some more, finishes, reports.
WRITER = r"""
import json, sys, time
from curvecast.client import Monitor
from curvecast.client._api import Backoff
url, run_id, key, delay = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
mon = Monitor(url=url, project="shared-run", run_id=run_id, flush_interval=0.02,
              backoff=Backoff(base=delay, cap=delay), handle_sigterm=False)
step = 0
def log_until(done):
    global step
    while not done():
        mon.log(step, **{key: float(step)})
        step += 1
        time.sleep(0.002)  # paces the workload like a training step; not a synchronisation
log_until(lambda: mon.stats()["points_spooled"] >= 50)
print("spooled", flush=True)
sys.stdin.readline()  # the parent brought the service up
log_until(lambda: mon.stats()["points_sent"] > 0)
end = step + 200
log_until(lambda: step >= end)
ok = mon.finish(timeout=60)
print(json.dumps({"ok": ok, "logged": step, **mon.stats()}), flush=True)
"""


def body(step: int) -> bytes:
    return encode_records([(step, 0.0, {"loss": float(step)}, None)])[0][0].body


def test_a_segment_another_writer_holds_is_not_claimed(tmp_path: Path) -> None:
    # flock conflicts between two open files even in one process: two Spools stand for two
    # processes here.
    run = str(uuid.uuid4())
    writer, replayer = Spool(tmp_path, run), Spool(tmp_path, run)
    assert writer.append(body(1))
    assert replayer.has_data()
    assert replayer.claim_segment(lambda *a: None) is None  # the writer still appends to it
    assert not replayer.has_data()  # no busy loop on a segment someone else owns
    assert not replayer.cleanup() and (writer.path).exists()
    assert writer.append(body(2))
    writer.close()  # closed (or its process died): now anyone may replay it
    reader = replayer.claim_segment(lambda *a: None)
    assert reader is not None
    lines = []
    while (item := reader.next()) is not None:
        lines.append(json.loads(plain_body(item[0]))["steps"])
    reader.close()
    assert lines == [[1], [2]]


def test_two_processes_with_one_run_id_lose_no_point(sqlite_url: str, spool_dir: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    run_id = str(uuid.uuid4())
    env = {**os.environ, "CURVECAST_SPOOL_DIR": str(spool_dir), "PYTHONPATH": str(REPO)}
    # "fast" is back online within 0.2 s of the service coming up and replays the spool;
    # "slow" stays offline for 1.5-3 s more and keeps appending to its active segment.
    procs = {
        key: subprocess.Popen(
            [sys.executable, "-c", WRITER, url, run_id, key, delay], env=env, cwd=REPO,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for key, delay in (("fast", "0.05"), ("slow", "3"))
    }
    try:
        for proc in procs.values():
            assert proc.stdout is not None and proc.stdout.readline().strip() == "spooled"
        assert is_locked(spool_dir / run_id)
        with thread_server_on(Settings(database_url=sqlite_url, worker_enabled=False), port):
            for proc in procs.values():
                assert proc.stdin is not None
                proc.stdin.write("up\n")
                proc.stdin.flush()
            results = {}
            for key, proc in procs.items():
                out, err = proc.communicate(timeout=120)
                assert proc.returncode == 0, err
                results[key] = (json.loads(out.strip().splitlines()[-1]), err)
            expected = {key: stats["logged"] for key, (stats, _) in results.items()}
            wait_for_points(url, run_id, expected)
            assert point_counts(url, run_id) == expected
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for stats, _ in results.values():
        assert stats["ok"] and stats["points_dropped"] == 0 and stats["points_spooled"] >= 50
    assert not (spool_dir / run_id).exists()
    # Whichever spooled second was told, loudly, that it shares the run with a live process.
    warnings = [err for _, err in results.values() if "also being logged by another live" in err]
    assert len(warnings) == 1, [err for _, err in results.values()]


def test_sync_leaves_a_segment_a_live_writer_appends_to(
    sqlite_server: str, spool_dir: Path
) -> None:
    run = str(uuid.uuid4())
    writer = Spool(spool_dir, run, meta=lambda: {"run_id": run, "project": "shared-run"})
    assert writer.append(body(1))
    result = sync_run(writer.path, url=sqlite_server, stream=io.StringIO())
    assert not result.ok and result.busy == 1 and "still being written" in result.message
    assert writer.append(body(2))  # still its own: nothing was unlinked under it
    writer.close()
    result = sync_run(writer.path, url=sqlite_server, stream=io.StringIO())
    assert result.ok and result.points == 2, result.message
    assert point_counts(sqlite_server, run) == {"loss": 2} and not writer.path.exists()
