"""The local spool: points the service could not take yet, kept on disk until it can.

Layout (one directory per run under the spool root)::

    <root>/<run_id>/run.json                      project, name, config, url, final status
    <root>/<run_id>/<time_ns>-<pid>.jsonl         segments: one POST body per line
    <root>/<run_id>/<time_ns>-<pid>.rejected      bodies the server refused (kept for inspection)
    <root>/<run_id>/.lock                         held (flock) by the process writing the run

Segments are append-only. Each process writes its own new segments, so a line half-written by a
killed process is never continued by another writer: it stays one corrupted line, which replay
skips and reports. A segment is closed (rotated) before it is replayed and deleted only after
every line in it was acknowledged; replaying a line twice is harmless because ingest is
idempotent per (run, key, step).

Ownership between processes (two live monitors on one ``run_id``, or a monitor and ``curvecast
sync``): the writer holds an exclusive ``flock`` on its active segment from before the segment
has its ``.jsonl`` name (it is created under a hidden name, locked, then renamed) until it closes
it, and a replayer opens a segment only through :meth:`SegmentReader.claim`, which takes a shared
lock without waiting and skips the segment when that fails. So a segment is replayed and unlinked
only once its writer closed it or died (the kernel drops a dead process's locks), never while
another process is still appending to it. The process holding the run directory's ``.lock``
writes its pid and role into it, so a second live monitor on the same run is told loudly.

Durability (the fsync policy): every append is one ``write()`` of whole lines to a file opened
with ``O_APPEND``, so it is in the OS page cache when ``append`` returns and survives the process
being killed. ``fsync`` runs when a segment is closed, and otherwise at most once per
``fsync_interval`` (1 s) and at least that often while lines are unsynced (the batcher thread
calls :meth:`Spool.sync_if_due` on every tick), so an OS crash or power loss loses at most about
the last second spooled. ``run.json`` is replaced atomically (write, fsync, rename).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from curvecast.client._batcher import count_points

log = logging.getLogger("curvecast.client")

META = "run.json"
LOCK = ".lock"
SEGMENT_SUFFIX = ".jsonl"
REJECTED_SUFFIX = ".rejected"
SPOOL_ENV = "CURVECAST_SPOOL_DIR"

#: Called for each corrupted line: (segment path, line number, reason).
CorruptHandler = Callable[[Path, int, str], None]

try:  # POSIX advisory locks; elsewhere the lock is a no-op
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


def user_cache_dir() -> Path:
    """The per-user cache directory of curvecast (XDG on Linux, the platform's elsewhere)."""
    if sys.platform == "win32":  # pragma: no cover
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
        return base / "curvecast" / "Cache"
    if sys.platform == "darwin":  # pragma: no cover
        return Path.home() / "Library" / "Caches" / "curvecast"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "curvecast"


def default_spool_dir() -> Path:
    """``$CURVECAST_SPOOL_DIR``, else ``<user cache dir>/spool``."""
    env = os.environ.get(SPOOL_ENV)
    return Path(env).expanduser() if env else user_cache_dir() / "spool"


def read_line_body(line: bytes) -> tuple[bytes, int] | str:
    """Validate one spooled line: the body and its point count, or the reason it is corrupted."""
    line = line.rstrip(b"\r\n")
    if not line.strip():
        return "empty line"
    try:
        data = json.loads(line)
    except ValueError as exc:
        return f"not JSON ({exc})"
    if not (
        isinstance(data, dict)
        and isinstance(data.get("steps"), list | str)
        and isinstance(data.get("values"), dict)
        and all(isinstance(c, list | str) for c in data["values"].values())
    ):
        return "not a metrics batch (needs 'steps' and 'values')"
    return line, count_points(data)


class SegmentReader:
    """Reads a closed segment line by line, skipping (and reporting) corrupted lines."""

    def __init__(self, path: Path, on_corrupt: CorruptHandler) -> None:
        self.path = path
        self.line_no = 0
        self._on_corrupt = on_corrupt
        self._file = path.open("rb")

    @classmethod
    def claim(cls, path: Path, on_corrupt: CorruptHandler) -> SegmentReader | None:
        """Open a segment for replay unless a live process still writes it (or it is gone).

        The shared lock is held until :meth:`close`: the writer's exclusive lock on its active
        segment excludes it. Shared rather than exclusive because two replayers of one closed
        segment are harmless (ingest is idempotent) and a shared lock works on a read-only file
        everywhere (an exclusive one does not on NFS).
        """
        try:
            reader = cls(path, on_corrupt)
        except FileNotFoundError:  # replayed and removed by another process meanwhile
            return None
        if fcntl is not None:
            try:
                fcntl.flock(reader._file.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:  # its writer is alive and may still append to it
                reader.close()
                return None
            except OSError:  # a file system without flock: replay as before
                pass
        return reader

    def next(self) -> tuple[bytes, int] | None:
        """The next valid ``(body, points)``, or None at the end of the segment."""
        for line in self._file:
            self.line_no += 1
            parsed = read_line_body(line)
            if isinstance(parsed, str):
                self._on_corrupt(self.path, self.line_no, parsed)
                continue
            return parsed
        return None

    @property
    def position(self) -> int:
        """Bytes read so far."""
        return self._file.tell()

    def close(self) -> None:
        """Close the file."""
        self._file.close()


class Spool:
    """One run's spool directory (created lazily, on the first write).

    Thread-safe: the batcher thread appends while the sender thread replays.

    Args:
        root: the spool root (``spool_dir=`` / ``$CURVECAST_SPOOL_DIR`` / the user cache dir).
        run_id: the run.
        max_bytes: cap on the run's spooled bytes; appends beyond it are refused.
        role: who writes (``"monitor"``, ``"curvecast sync"``), recorded in the directory lock
            so that another process on the same run can say who it shares the run with.
        meta: called to get the run's metadata whenever ``run.json`` is (re)written.
        segment_bytes: a segment is closed and a new one started beyond this size.
        fsync_interval: the longest time between fsyncs while appending, seconds.
        clock: monotonic clock.
    """

    def __init__(
        self,
        root: Path,
        run_id: str,
        *,
        max_bytes: int = 1 << 30,
        meta: Callable[[], dict[str, Any]] | None = None,
        segment_bytes: int = 8 << 20,
        fsync_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        role: str = "monitor",
    ) -> None:
        self.root = Path(root)
        self.path = self.root / run_id
        self.max_bytes = max_bytes
        self.role = role
        self._shared_warned = False
        self._meta = meta
        self._segment_bytes = segment_bytes
        self._fsync_interval = fsync_interval
        self._clock = clock
        self._lock = threading.RLock()
        self._fd: int | None = None
        self._active: Path | None = None
        self._active_size = 0
        self._last_fsync = 0.0
        self._lock_fd: int | None = None
        self._opened = False
        self._size = 0
        self._pending: bool | None = None  # None: not looked at disk yet
        self._unsynced = False

    # -- writing ---------------------------------------------------------------------------

    def _open_dir(self) -> None:
        if self._opened:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        self._size = sum(p.stat().st_size for p in self._segment_paths())
        if self._meta is not None and not (self.path / META).exists():
            self.write_meta(self._meta())
        self._opened = True

    def _take_lock(self, warn: bool = True) -> bool:
        """Take the run directory's lock (and write who holds it); False if another live
        process has it (then, with ``warn``, say so if that is a monitor)."""
        if fcntl is None or self._lock_fd is not None:
            return True
        fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # another live process has it; appends stay safe (own segments)
            if warn:
                self.warn_if_shared()
            return False
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {self.role}\n".encode(), 0)
        self._lock_fd = fd
        return True

    def other_writer(self) -> str | None:
        """Who else holds this run's directory lock (``"pid role"``), or None."""
        if self._lock_fd is not None or not is_locked(self.path):
            return None
        try:
            return (self.path / LOCK).read_text().strip() or "another process"
        except OSError:
            return "another process"

    def warn_if_shared(self) -> None:
        """Say loudly, once, when another live monitor writes the same run (two processes with
        one ``run_id``: each keeps and replays only its own segments, but the run's points
        interleave and its status is whichever finishes last)."""
        holder = self.other_writer()
        if self._shared_warned or holder is None or holder.endswith("curvecast sync"):
            return
        self._shared_warned = True
        log.error(
            "curvecast: run %s is also being logged by another live process (pid %s) with "
            "the same run_id; both spool to %s. No point is lost, but give each process its "
            "own run_id unless they are meant to write one run together.",
            self.path.name,
            holder.split()[0],
            self.path,
        )

    def append(self, body: bytes) -> bool:
        """Append one batch body as a line. Returns False (and writes nothing) when the cap is
        reached."""
        line = body.rstrip(b"\n") + b"\n"
        with self._lock:
            self._open_dir()
            if self._size + len(line) > self.max_bytes:
                return False
            if self._fd is None or self._active_size >= self._segment_bytes:
                self._start_segment()
            assert self._fd is not None
            written = os.write(self._fd, line)
            while written < len(line):  # regular files write everything unless the disk is full
                written += os.write(self._fd, line[written:])
            self._pending = True
            self._active_size += len(line)
            self._size += len(line)
            self._unsynced = True
            self.sync_if_due()
            return True

    def sync_if_due(self) -> None:
        """Fsync the active segment if it has unsynced lines and the interval has passed
        (called after appends and by the batcher thread's periodic tick)."""
        with self._lock:
            now = self._clock()
            if self._unsynced and self._fd is not None:
                if now - self._last_fsync >= self._fsync_interval:
                    os.fsync(self._fd)
                    self._last_fsync = now
                    self._unsynced = False

    def _start_segment(self) -> None:
        self._close_segment()
        # Another process's cleanup may have removed the (then empty) directory.
        self.path.mkdir(parents=True, exist_ok=True)
        name = f"{time.time_ns():020d}-{os.getpid()}{SEGMENT_SUFFIX}"
        # Locked before it gets its segment name: a replayer that lists it can never find it
        # unlocked while this process may still append to it.
        hidden = self.path / f".{name}.new"
        fd = os.open(hidden, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            if fcntl is not None:
                with contextlib.suppress(BlockingIOError, OSError):
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(hidden, self.path / name)
        except BaseException:
            os.close(fd)
            raise
        self._active = self.path / name
        self._fd = fd
        self._active_size = 0

    def _close_segment(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.fsync(self._fd)
            os.close(self._fd)
        self._fd = None
        self._active = None
        self._unsynced = False

    def write_meta(self, meta: dict[str, Any]) -> None:
        """Atomically replace ``run.json``."""
        with self._lock:
            self.path.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.path / META, meta)

    def update_meta(self, **changes: Any) -> None:
        """Write ``run.json`` again with the current metadata plus ``changes``."""
        with self._lock:
            meta = self._meta() if self._meta is not None else read_meta(self.path) or {}
            meta.update(changes)
            self.write_meta(meta)

    def reject(self, body: bytes) -> Path:
        """Keep a body the server refused (4xx) in a ``.rejected`` file sync will not resend."""
        with self._lock:
            self._open_dir()
            path = self.path / f"{time.time_ns():020d}-{os.getpid()}{REJECTED_SUFFIX}"
            with path.open("ab") as f:
                f.write(body.rstrip(b"\n") + b"\n")
            return path

    # -- replaying -------------------------------------------------------------------------

    def _segment_paths(self) -> list[Path]:
        try:
            return sorted(p for p in self.path.iterdir() if p.name.endswith(SEGMENT_SUFFIX))
        except FileNotFoundError:
            return []

    def has_data(self) -> bool:
        """Whether segments may be waiting (cheap: a flag, the disk is looked at only once)."""
        with self._lock:
            if self._pending is None:
                self._pending = bool(self._segment_paths())
            return self._pending

    def closed_segments(self) -> list[Path]:
        """Segments that may be replayable, oldest first (closes the active one first); some
        may still be written by another process: open them with :meth:`claim_segment`."""
        with self._lock:
            if self._active is not None and self._active_size > 0:
                self._close_segment()
            paths = [p for p in self._segment_paths() if p != self._active]
            if not paths and self._active is None:
                self._pending = False
            return paths

    def claim_segment(self, on_corrupt: CorruptHandler) -> SegmentReader | None:
        """A reader on the oldest segment no live process writes (closing this process's
        active segment first), or None; with None, :meth:`has_data` is False until the next
        append, so segments other live writers hold cost no busy loop (they replay them)."""
        with self._lock:
            for path in self.closed_segments():
                reader = SegmentReader.claim(path, on_corrupt)
                if reader is not None:
                    return reader
            if self._active is None:
                self._pending = False
            return None

    def remove_segment(self, path: Path) -> None:
        """Delete a fully acknowledged segment."""
        with self._lock:
            try:
                size = path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                return
            self._size = max(0, self._size - size)

    def cleanup(self) -> bool:
        """Remove the run directory if no segment or rejected body is left and no other live
        process holds it; True if removed."""
        with self._lock:
            if self._segment_paths():
                return False
            self._close_segment()
            if not self.path.exists():
                self._opened = False
                return True
            if any(p.name.endswith(REJECTED_SUFFIX) for p in self.path.iterdir()):
                return False
            if not self._take_lock(warn=False):  # another live monitor owns it: its to remove
                return False
            for name in (META, LOCK):
                with contextlib.suppress(FileNotFoundError):
                    (self.path / name).unlink()
            self._release_lock()
            with contextlib.suppress(OSError):
                self.path.rmdir()
            self._opened = False
            return True

    @property
    def nbytes(self) -> int:
        """Bytes spooled and not yet acknowledged (as tracked by this process)."""
        return self._size

    def close(self) -> None:
        """Fsync and close the active segment and release the directory lock."""
        with self._lock:
            self._close_segment()
            self._release_lock()
            self._opened = False

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON to ``path`` via a temporary file, fsync and rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_meta(run_dir: Path) -> dict[str, Any] | None:
    """``run.json`` of a run directory, or None when missing or unreadable."""
    try:
        with (run_dir / META).open() as f:
            meta: Any = json.load(f)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def is_locked(run_dir: Path) -> bool:
    """Whether a live process holds the run directory's lock."""
    if fcntl is None:  # pragma: no cover
        return False
    try:
        fd = os.open(run_dir / LOCK, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing releases the lock we may have taken
    return False


def find_run_dirs(path: Path) -> list[Path]:
    """Run directories at ``path``: ``path`` itself if it is one, else its subdirectories."""
    if not path.is_dir():
        return []

    def is_run(p: Path) -> bool:
        return (p / META).exists() or any(q.name.endswith(SEGMENT_SUFFIX) for q in p.iterdir())

    if is_run(path):
        return [path]
    return sorted(p for p in path.iterdir() if p.is_dir() and is_run(p))


def iter_segment_paths(run_dir: Path) -> Iterator[Path]:
    """Segments of a run directory, oldest first."""
    yield from sorted(p for p in run_dir.iterdir() if p.name.endswith(SEGMENT_SUFFIX))
