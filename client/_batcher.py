"""Turning logged records into columnar request bodies, and the bounded in-memory outbox.

``Monitor.log`` appends ``(step, wall_time, {key: value})`` records to a deque and returns. The
batcher thread drains that deque, reads tensors (one stacked device-to-host copy per device per
batch, in the background thread), and encodes columnar batches in the service's format::

    {"steps": [...], "wall_time": [...], "values": {"loss": [...], "opt/eta": [...]}}

Records of the same step are merged into one row (the first value of a (key, step) wins, as on
the server). Encoded bodies are kept as bytes: about 20 bytes per point, ready both to send and
to append to the spool verbatim.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("curvecast.client")



class KeyMap:
    """Names for a dict of raw statistics (an optimizer's ``stats()``), applied in the batcher
    thread so the training thread only appends the dict it got.

    Args:
        prefix: prepended to every key.
        skip: keys not to log.
    """

    def __init__(self, prefix: str, skip: Iterable[str] = ()) -> None:
        self.prefix = prefix
        self._names: dict[str, str | None] = dict.fromkeys(skip)

    def apply(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """``metrics`` with prefixed names; invalid names are dropped (and logged once)."""
        out = {}
        names = self._names
        for key, value in metrics.items():
            if key in names:
                full = names[key]
            else:
                full = names[key] = self._name(key)
            if full is not None:
                out[full] = value
        return out

    def _name(self, key: str) -> str | None:
        from curvecast.client._validate import check_key

        try:
            return check_key(self.prefix + key)
        except (TypeError, ValueError) as exc:
            log.error("curvecast: not logging optimizer statistic %r: %s", key, exc)
            return None


#: ``(step, wall_time, {key: value}, key map or None)``; values are float, int or 0-d tensors.
Record = tuple[int, float, dict[str, Any], KeyMap | None]


@dataclass(frozen=True, slots=True)
class Batch:
    """An encoded request body and the number of points it carries."""

    body: bytes
    points: int


def encode_records(
    records: Iterable[Record], *, max_points: int = 50_000, max_keys: int = 1_000
) -> tuple[list[Batch], int]:
    """Encode records into columnar batches of at most ``max_points`` points and ``max_keys`` keys.

    Returns:
        The batches, and how many values could not be read (a tensor whose device failed); those
        are dropped and logged rather than failing the whole batch.
    """
    batches: list[Batch] = []
    unreadable = 0
    steps: list[int] = []
    walls: list[float] = []
    columns: dict[str, list[Any]] = {}
    rows: dict[int, int] = {}
    points = 0

    def flush() -> None:
        nonlocal steps, walls, columns, rows, points, unreadable
        if points:
            unreadable += _finish_columns(columns, len(steps))
            batches.extend(_encode(steps, walls, columns, max_keys))
        steps, walls, columns, rows, points = [], [], {}, {}, 0

    for step, wall, metrics, keymap in records:
        if keymap is not None:
            metrics = keymap.apply(metrics)
        row = rows.get(step)
        if row is None:
            row = rows[step] = len(steps)
            steps.append(step)
            walls.append(wall)
        for key, value in metrics.items():
            column = columns.get(key)
            if column is None:
                column = columns[key] = []
            filled = len(column)
            if filled <= row:
                if filled < row:
                    column.extend([None] * (row - filled))
                column.append(value)
            elif column[row] is None:
                column[row] = value
            else:
                continue  # same key and step twice: the first value wins, as on the server
            points += 1
        if points >= max_points:
            flush()
    flush()
    return batches, unreadable


def _finish_columns(columns: dict[str, list[Any]], n_rows: int) -> int:
    """Pad columns to ``n_rows`` and turn every value into a float (or None). Returns the number
    of unreadable tensor values (set to None)."""
    tensors: list[tuple[list[Any], int, Any]] = []
    unreadable = 0
    for column in columns.values():
        if len(column) < n_rows:
            column.extend([None] * (n_rows - len(column)))
        for i, value in enumerate(column):
            kind = type(value)
            if kind is float or value is None:
                continue
            if kind is int:
                column[i] = _int_to_float(value)
            elif hasattr(value, "device") and hasattr(value, "reshape"):
                tensors.append((column, i, value))
            else:  # only from optimizer stats, which skip the log() checks
                try:
                    column[i] = float(value)
                except (TypeError, ValueError, OverflowError):
                    column[i] = None
                    unreadable += 1
    return unreadable + (_read_tensors(tensors) if tensors else 0)


def _int_to_float(value: int) -> float:
    try:
        return float(value)
    except OverflowError:
        return float("inf") if value > 0 else float("-inf")


def _read_tensors(items: list[tuple[list[Any], int, Any]]) -> int:
    """Read 0-d tensors with one stacked copy per device (one sync per device, not per value)."""
    import torch  # a tensor was logged, so torch is already imported

    by_device: dict[Any, list[tuple[list[Any], int, Any]]] = {}
    for item in items:
        by_device.setdefault(item[2].device, []).append(item)
    unreadable = 0
    for device, group in by_device.items():
        dtype = torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64
        try:
            with torch.no_grad():
                values = torch.stack([t.reshape(()).to(dtype) for _, _, t in group]).tolist()
        except Exception:
            values = []
            for _, _, tensor in group:
                try:
                    values.append(float(tensor.item()))
                except Exception:
                    values.append(None)
            bad = values.count(None)
            if bad:
                log.exception("curvecast: could not read %d tensor value(s) on %s", bad, device)
                unreadable += bad
        for (column, i, _), value in zip(group, values, strict=True):
            column[i] = value
    return unreadable


def _encode(
    steps: list[int], walls: list[float], columns: dict[str, list[Any]], max_keys: int
) -> list[Batch]:
    keys = list(columns)
    out = []
    for start in range(0, len(keys), max_keys):
        part = {k: columns[k] for k in keys[start : start + max_keys]}
        points = sum(len(c) - c.count(None) for c in part.values())
        if not points:
            continue
        # allow_nan: the service accepts the bare NaN/Infinity literals Python emits.
        body = json.dumps(
            {"steps": steps, "wall_time": walls, "values": part}, separators=(",", ":")
        ).encode()
        out.append(Batch(body, points))
    return out


def split_batch(batch: Batch) -> list[Batch]:
    """Split a batch the server found too large (413) into two halves by rows."""
    data = json.loads(batch.body)
    steps = data["steps"]
    if len(steps) < 2:
        return [batch]
    half = len(steps) // 2
    out = []
    for lo, hi in ((0, half), (half, len(steps))):
        values = {k: v[lo:hi] for k, v in data["values"].items()}
        values = {k: v for k, v in values.items() if any(x is not None for x in v)}
        if not values:
            continue
        part: dict[str, Any] = {"steps": steps[lo:hi], "values": values}
        if data.get("wall_time") is not None:
            part["wall_time"] = data["wall_time"][lo:hi]
        points = sum(len(c) - c.count(None) for c in values.values())
        out.append(Batch(json.dumps(part, separators=(",", ":")).encode(), points))
    return out


def count_points(body: Any) -> int:
    """Points in a decoded batch body (non-null values)."""
    values = body.get("values") if isinstance(body, dict) else None
    if not isinstance(values, dict):
        return 0
    return sum(len(c) - c.count(None) for c in values.values() if isinstance(c, list))


class Outbox:
    """Encoded batches waiting to be sent, bounded in bytes.

    The batcher thread :meth:`offer`\\ s batches; when the outbox is full or the service is known
    to be unreachable (``online`` is False) the offer is refused and the batch goes to the disk
    spool instead, so memory stays bounded and nothing is dropped. The sender thread sends the
    oldest batch and :meth:`ack`\\ s it only once the server stored it, so a batch in flight is
    still here if the process has to spool everything at exit.

    Args:
        max_bytes: the most encoded bytes held (one batch larger than this is still accepted
            when the outbox is empty, so progress is always possible).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.online = True
        self._queue: deque[Batch] = deque()
        self._bytes = 0
        self._lock = threading.Lock()

    def offer(self, batch: Batch) -> bool:
        """Queue ``batch`` unless offline or full; returns whether it was queued."""
        with self._lock:
            if not self.online or (self._queue and self._bytes + len(batch.body) > self.max_bytes):
                return False
            self._queue.append(batch)
            self._bytes += len(batch.body)
            return True

    def peek(self) -> Batch | None:
        """The oldest batch, left in place until :meth:`ack`."""
        with self._lock:
            return self._queue[0] if self._queue else None

    def ack(self, batch: Batch) -> None:
        """Remove ``batch`` if it is still the oldest (it may have been spooled meanwhile)."""
        with self._lock:
            if self._queue and self._queue[0] is batch:
                self._queue.popleft()
                self._bytes -= len(batch.body)

    def replace_head(self, batch: Batch, parts: Sequence[Batch]) -> None:
        """Replace the oldest batch by ``parts`` (after a 413)."""
        with self._lock:
            if self._queue and self._queue[0] is batch:
                self._queue.popleft()
                self._bytes -= len(batch.body)
                for part in reversed(parts):
                    self._queue.appendleft(part)
                    self._bytes += len(part.body)

    def take_all(self) -> list[Batch]:
        """Remove and return every queued batch (to spool them)."""
        with self._lock:
            out = list(self._queue)
            self._queue.clear()
            self._bytes = 0
            return out

    @property
    def nbytes(self) -> int:
        """Encoded bytes queued."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._queue)
