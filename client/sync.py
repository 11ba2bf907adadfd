"""``curvecast sync [DIR]``: upload the points training runs left in their spools.

The public entry point of the command: ``curvecast.service.cli`` registers it into the
``curvecast`` command with :func:`add_sync_parser`; it also runs without the server extras as
``python -m curvecast.client sync [DIR]`` (:func:`main`), and :func:`sync_run` uploads one run
directory from Python. Standard library only.

For each run directory: create the run (idempotent ``PUT``, from ``run.json``), send every
spooled line (corrupted lines are skipped and reported), delete each segment once all of it was
acknowledged, then merge the config and set the final status the run ended with. A run still
being written by a live process (its lock is held) is skipped, and so is any segment a live
process still appends to (its writer holds a lock on it; see ``_spool``). Re-running is always
safe: ingest is idempotent, so a line sent twice is stored once.

Where the token goes: only to a URL the user named (``--url``, else ``$CURVECAST_URL``), never
to one read from ``run.json`` alone, because a spool copied from elsewhere could name any host
(:func:`resolve_target`). Without a token, the run's own URL is used as before.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from curvecast.client._api import Api, Backoff, Outcome, Result
from curvecast.client._batcher import Batch, split_batch
from curvecast.client._monitor import DEFAULT_URL
from curvecast.client._spool import (
    REJECTED_SUFFIX,
    SegmentReader,
    Spool,
    default_spool_dir,
    find_run_dirs,
    is_locked,
    iter_segment_paths,
    read_meta,
)
from curvecast.client._transport import HTTPTransport, Transport
from curvecast.client._validate import check_run_id

__all__ = ["SyncResult", "add_sync_parser", "main", "resolve_target", "run_sync", "sync_run"]

#: Exit status when a run's URL conflicts with the one the user named (nothing is sent).
EXIT_URL_CONFLICT = 2


def resolve_target(
    url: str | None, meta: dict[str, Any], token: str | None, env_url: str | None = None
) -> tuple[str, str | None]:
    """Where to upload a run: ``(url, None)``, or ``("", why not)`` when the token could reach a
    URL the user did not name.

    Args:
        url: ``--url`` (explicit: always used).
        meta: the run's ``run.json``; its ``url`` is where the run was logging to.
        token: the bearer token, if any.
        env_url: ``$CURVECAST_URL`` (default: read from the environment).
    """
    if url:
        return url, None
    env_url = env_url if env_url is not None else os.environ.get("CURVECAST_URL") or None
    run_url = meta.get("url") if isinstance(meta.get("url"), str) else None
    if env_url:
        if run_url and run_url.rstrip("/") != env_url.rstrip("/"):
            return "", (
                f"run.json names {run_url} but CURVECAST_URL is {env_url}; "
                "pass --url to say where its points (and the token) go"
            )
        return env_url, None
    if run_url:
        if token:
            return "", (
                f"run.json names {run_url}, and the token is only sent to a URL you name: "
                f"pass --url {run_url} (or set CURVECAST_URL) if that is the service you mean"
            )
        return run_url, None
    return DEFAULT_URL, None


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


class _Progress:
    """How far one run's upload is: a redrawn bar on a terminal; otherwise a line when the run
    starts, one every ``every`` seconds while it goes on (a log shows a long sync is moving), and
    a summary line at the end.

    The fraction is of the spooled bytes (known up front from the segment sizes, where the point
    total would take a second pass over the files); the points are counted as they are sent.
    """

    def __init__(self, stream: TextIO, total_bytes: int, label: str, every: float = 5.0) -> None:
        self.stream = stream
        self.total_bytes = total_bytes
        self.total = max(1, total_bytes)
        self.label = label
        self.points = 0
        self.every = every
        self.tty = stream.isatty()
        self._last_draw = time.monotonic()

    def start(self, target: str) -> None:
        """Say what is about to be uploaded, and where."""
        if not self.tty:
            self.stream.write(
                f"{self.label}: uploading {_size(self.total_bytes)} of spooled points to {target}\n"
            )
            self.stream.flush()

    def update(self, done_bytes: int, points: int) -> None:
        """Record progress; redraws at most 10 times a second (every ``every`` s off a tty)."""
        self.points += points
        now = time.monotonic()
        frac = min(1.0, done_bytes / self.total)
        if self.tty and (now - self._last_draw > 0.1 or done_bytes >= self.total):
            self._last_draw = now
            bar = "#" * int(frac * 30)
            self.stream.write(f"\r{self.label} [{bar:<30}] {frac:4.0%}  {self.points:,} points")
            self.stream.flush()
        elif not self.tty and now - self._last_draw >= self.every and done_bytes < self.total:
            self._last_draw = now
            self.stream.write(
                f"{self.label}: {frac:.0%} of {_size(self.total_bytes)}, "
                f"{self.points:,} points uploaded so far\n"
            )
            self.stream.flush()

    def close(self, message: str) -> None:
        """End the line with ``message``."""
        if self.tty:
            self.stream.write("\r\033[K")
        self.stream.write(f"{self.label}: {message}\n")
        self.stream.flush()


@dataclass
class SyncResult:
    """What syncing one run directory did."""

    run_dir: Path
    ok: bool
    points: int = 0
    corrupt: list[str] = field(default_factory=list)
    rejected: int = 0
    #: Segments left alone because a live process still appends to them.
    busy: int = 0
    message: str = ""


def _with_retries(
    call: Callable[[], Result],
    *,
    attempts: int,
    backoff: Backoff,
    sleep: Callable[[float], None],
) -> Result:
    result = call()
    for attempt in range(1, attempts):
        if result.outcome is not Outcome.RETRY:
            break
        sleep(backoff.delay(attempt, result.retry_after))
        result = call()
    return result


def sync_run(
    run_dir: Path,
    *,
    url: str | None = None,
    token: str | None = None,
    timeout: float = 30.0,
    attempts: int = 5,
    transport: Transport | None = None,
    stream: TextIO = sys.stderr,
    sleep: Callable[[float], None] = time.sleep,
    backoff: Backoff | None = None,
    label: str | None = None,
) -> SyncResult:
    """Upload one run directory's spool; see the module docstring.

    Args:
        run_dir: ``<spool root>/<run_id>``.
        url: service URL (default: ``$CURVECAST_URL``, else the one the run was logging to
            from ``run.json`` if no token is given; see :func:`resolve_target`).
        token: bearer token.
        timeout: seconds per request.
        attempts: tries per request while the service answers "retry later".
        transport: injected transport (tests).
        stream: where progress goes.
        sleep: how to wait between attempts (tests inject a fake).
        backoff: retry delays.
        label: how progress lines name the run (default ``run <first 8 of its id>``).
    """
    meta = read_meta(run_dir) or {}
    try:
        run_id = check_run_id(meta.get("run_id") or run_dir.name)
    except ValueError:
        return SyncResult(run_dir, False, message="not a run directory (no run id)")
    target, refusal = resolve_target(url, meta, token)
    if refusal is not None:
        stream.write(f"{label or f'run {run_id[:8]}'}: not uploaded: {refusal}\n")
        return SyncResult(run_dir, False, message=refusal)
    job = _RunSync(
        run_dir,
        run_id,
        meta,
        Api(transport or HTTPTransport(target), token=token, timeout=timeout),
        target,
        stream,
        lambda call: _with_retries(
            call, attempts=attempts, backoff=backoff or Backoff(base=1.0, cap=10.0), sleep=sleep
        ),
        label or f"run {run_id[:8]}",
    )
    try:
        return job.run()
    finally:
        job.spool.close()


class _RunSync:
    """Uploading one run directory."""

    def __init__(
        self,
        run_dir: Path,
        run_id: str,
        meta: dict[str, Any],
        api: Api,
        target: str,
        stream: TextIO,
        retried: Callable[[Callable[[], Result]], Result],
        label: str,
    ) -> None:
        self.run_dir = run_dir
        self.run_id = run_id
        self.meta = meta
        self.api = api
        self.target = target
        self.retried = retried
        self.spool = Spool(run_dir.parent, run_dir.name, role="curvecast sync")
        self.out = SyncResult(run_dir, True)
        self.segments = list(iter_segment_paths(run_dir))
        total = sum(_file_size(p) for p in self.segments)
        self.progress = _Progress(stream, total, label)

    def create(self) -> Result | None:
        if "project" not in self.meta:
            return None  # no run.json: the run must exist already
        payload = {k: self.meta[k] for k in ("project", "name", "config") if self.meta.get(k)}
        return self.retried(lambda: self.api.put_run(self.run_id, payload))

    def fail(self, result: Result, what: str) -> SyncResult:
        self.out.ok = False
        self.out.message = f"{what} failed: {result.message}; kept {self.run_dir}, sync again later"
        self.progress.close(self.out.message)
        return self.out

    def corrupt(self, path: Path, line_no: int, reason: str) -> None:
        self.out.corrupt.append(f"{path.name}:{line_no}: {reason}")

    def post(self, batch: Batch) -> Result:
        result = self.retried(lambda: self.api.post_metrics(self.run_id, batch.body, replay=True))
        if result.outcome is Outcome.TOO_LARGE:
            parts = split_batch(batch)
            if len(parts) > 1:
                for part in parts:
                    result = self.post(part)
                    if not result.ok:
                        return result
        return result

    def run(self) -> SyncResult:
        out, meta = self.out, self.meta
        self.progress.start(self.target)
        created = self.create()
        if created is not None and not created.ok:
            return self.fail(created, f"creating the run at {self.target}")
        done_bytes = 0
        for segment in self.segments:
            reader = SegmentReader.claim(segment, self.corrupt)
            if reader is None:  # a live process still appends to it (or it is gone)
                out.busy += segment.exists()
                continue
            try:
                while (item := reader.next()) is not None:
                    batch = Batch(*item)
                    result = self.post(batch)
                    if result.outcome is Outcome.RUN_MISSING and (again := self.create()):
                        if not again.ok:
                            return self.fail(again, "creating the run")
                        result = self.post(batch)
                    if result.outcome in (Outcome.REJECTED, Outcome.TOO_LARGE):
                        self.spool.reject(batch.body)
                        out.rejected += batch.points
                    elif not result.ok:
                        return self.fail(result, f"sending points to {self.target}")
                    else:
                        out.points += batch.points
                    self.progress.update(done_bytes + reader.position, batch.points)
            finally:
                reader.close()
            done_bytes += _file_size(segment)
            with contextlib.suppress(FileNotFoundError):  # another replayer removed it first
                segment.unlink()
        if out.busy:
            # Its writer is alive: it replays them itself and sets the run's status.
            out.ok = False
            out.message = (
                f"{out.points:,} points uploaded to {self.target}; {out.busy} segment(s) still "
                f"being written by a live process were left in {self.run_dir}"
            )
            self.progress.close(out.message)
            return out
        final = {k: meta[k] for k in ("config", "status", "status_reason") if meta.get(k)}
        if final:
            result = self.retried(lambda: self.api.patch_run(self.run_id, final))
            if not result.ok and result.outcome is not Outcome.REJECTED:
                return self.fail(result, "setting the run's status")
        self.spool.cleanup()
        parts = [f"{out.points:,} points uploaded to {self.target}"]
        if meta.get("status"):
            parts.append(f"status {meta['status']}")
        if out.corrupt:
            shown = "; ".join(out.corrupt[:3])
            parts.append(f"{len(out.corrupt)} corrupted lines skipped ({shown})")
        if out.rejected:
            parts.append(f"{out.rejected} points refused by the server, kept as *{REJECTED_SUFFIX}")
        out.message = ", ".join(parts)
        self.progress.close(out.message)
        return out


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def run_sync(args: argparse.Namespace) -> int:
    """Run ``curvecast sync`` with the arguments :func:`add_sync_parser` defines; returns the
    exit status (0: every run uploaded, 1: some were not, 2: a run's URL differs from the one
    named and no ``--url`` was given: nothing was sent)."""
    root = Path(args.dir).expanduser() if args.dir else default_spool_dir()
    token = args.token or os.environ.get("CURVECAST_TOKEN") or None
    run_dirs = find_run_dirs(root)
    if not run_dirs:
        print(f"curvecast sync: nothing to upload in {root}", file=sys.stderr)
        return 0
    # Checked for every run before anything is sent, so a refusal sends nothing at all.
    refusals = [
        f"curvecast sync: {run_dir}: {refusal}"
        for run_dir in run_dirs
        if (refusal := resolve_target(args.url, read_meta(run_dir) or {}, token)[1])
    ]
    if refusals:
        print("\n".join(refusals), file=sys.stderr)
        return EXIT_URL_CONFLICT
    print(f"curvecast sync: {len(run_dirs)} spooled run(s) in {root}", file=sys.stderr)
    failed = 0
    for number, run_dir in enumerate(run_dirs, start=1):
        if is_locked(run_dir):
            print(
                f"curvecast sync: skipping {run_dir}: a running process is still writing it "
                "(its monitor replays it itself)",
                file=sys.stderr,
            )
            failed += 1
            continue
        result = sync_run(
            run_dir,
            url=args.url,
            token=token,
            timeout=args.timeout,
            label=f"run {number}/{len(run_dirs)} {run_dir.name[:8]}",
        )
        failed += not result.ok
    if failed:
        print(f"curvecast sync: {failed} of {len(run_dirs)} runs not uploaded", file=sys.stderr)
        return 1
    return 0


def add_sync_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``sync`` on the ``curvecast`` command's subparsers."""
    parser = sub.add_parser(
        "sync",
        help="upload points that training runs left in their local spool",
        description="Upload spooled points (left when the service was unreachable) and mark "
        "each run with the status it ended with. Safe to re-run: ingest is idempotent.",
    )
    parser.add_argument(
        "dir",
        nargs="?",
        help="a spool root or one run's directory (default: $CURVECAST_SPOOL_DIR, else the "
        "user cache dir)",
    )
    parser.add_argument(
        "--url",
        help="service URL (default: $CURVECAST_URL; without a token, the URL each run was "
        "logging to, from run.json; a token is only sent to a URL named here or in "
        "$CURVECAST_URL)",
    )
    parser.add_argument("--token", help="bearer token (default: $CURVECAST_TOKEN)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    parser.set_defaults(func=run_sync)


def main(argv: list[str] | None = None) -> int:
    """``python -m curvecast.client sync ...`` (works with the standard-library-only install)."""
    parser = argparse.ArgumentParser(prog="python -m curvecast.client")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_sync_parser(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))
