"""Turning logged records into columnar request bodies, and the bounded in-memory outbox.

``Monitor.log`` (and ``watch()``'s hook) append ``(step, wall_time, {key: value}, key map)``
records to a deque and return. The batcher thread drains that deque, turns the records into
columns (by shape: a loop logs the same keys every step, so one ``zip`` per shape, not a loop
over every value), reads tensors (CPU tensors one ``float()`` at a time; on an accelerator one
stacked device-to-host copy per device and dtype per batch), and encodes columnar batches in
the service's format::

    {"steps": [...], "wall_time": [...], "values": {"loss": [...], "opt/eta": [...]}}

Records of the same step are merged into one row (the first value of a (key, step) wins, as on
the server). Columns travel as base64 strings of their little-endian bytes
(:data:`~curvecast.contract.BASE64_COLUMNS`: int64 steps, float64 wall times and values; a
column with missing entries stays a JSON array with ``null``): formatting each float as decimal
text (``json.dumps``'s shortest round-trip ``repr``) used to be most of the batcher's CPU, and
``struct.pack`` of a column is one C loop. Encoded bodies are kept as bytes, about 11 bytes per
point, ready both to send and to append to the spool verbatim. :func:`plain_body` turns a body
back into plain JSON arrays, for a service too old to read base64 columns.
"""

from __future__ import annotations

import binascii
import functools
import json
import logging
import math
import operator
import struct
import sys
import threading
from array import array
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, compress, repeat
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
        self._skip = tuple(skip)
        self._names: dict[str, str | None] = dict.fromkeys(self._skip)

    def name(self, key: str) -> str | None:
        """The metric name of ``key``, or None when it is skipped or invalid (logged once)."""
        names = self._names
        if key in names:
            return names[key]
        full = names[key] = self._name(key)
        return full

    def skipped(self, metrics: Iterable[Mapping[str, Any]]) -> int:
        """How many of the keys in ``metrics`` (a list of dicts) are skipped (not points)."""
        return sum(sum(map(operator.contains, metrics, repeat(key))) for key in self._skip)

    def apply(self, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """``metrics`` with prefixed names; invalid names are dropped (and logged once)."""
        out = {}
        for key, value in metrics.items():
            full = self.name(key)
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
#: The dict is never changed once it is in a record (the batcher reads it in another thread).
Record = tuple[int, float, Mapping[str, Any], KeyMap | None]

#: A batch's columns: metric name -> one value (or None) per row.
Columns = dict[str, Sequence[Any]]

_STEP = operator.itemgetter(0)
_WALL = operator.itemgetter(1)
_METRICS = operator.itemgetter(2)
_KEYMAP = operator.itemgetter(3)
_VALUES = operator.methodcaller("values")
_DTYPE = operator.attrgetter("dtype")
_NDIM = operator.attrgetter("ndim")
_NOTHING_TO_CONVERT = frozenset({float, type(None)})
_NUMBERS = frozenset({float, int})


def logged_points(records: Sequence[Record]) -> int:
    """The points ``records`` hold, as the caller logged them (counted when the batcher takes
    them, so that neither ``log()`` nor the optimizer hook pays for counting; C loops)."""
    points = sum(map(len, map(_METRICS, records)))
    keymaps = set(map(_KEYMAP, records))
    keymaps.discard(None)
    for keymap in keymaps:
        mapped = list(compress(map(_METRICS, records),
                               map(operator.is_, map(_KEYMAP, records), repeat(keymap))))
        points -= keymap.skipped(mapped)
    return points


@dataclass(frozen=True, slots=True)
class Batch:
    """An encoded request body and the number of points it carries."""

    body: bytes
    points: int


def encode_records(
    records: Iterable[Record], *, max_points: int = 50_000, max_keys: int = 1_000
) -> tuple[list[Batch], int]:
    """Encode records into columnar batches of at most ``max_points`` points and ``max_keys`` keys.

    Records of the same step share a row; where a key is given twice at the same step, the first
    value wins (as on the server). A row's wall time is that of a record of its step (they are
    logged within the same training step).

    Returns:
        The batches, and how many values could not be read (a tensor whose device failed); those
        are dropped and logged rather than failing the whole batch.
    """
    if not isinstance(records, list):
        records = list(records)
    batches: list[Batch] = []
    unreadable = 0
    for chunk in _chunks(records, max_points):
        steps, walls, columns = _columns(chunk)
        unreadable += _finish_columns(columns)
        batches.extend(_encode(steps, walls, columns, max_keys))
    return batches, unreadable


def _chunks(records: list[Record], max_points: int) -> list[list[Record]]:
    """``records`` cut after each record that brings its run to ``max_points`` values."""
    sizes = list(map(len, map(_METRICS, records)))
    if sum(sizes) < max_points:
        return [records] if records else []
    out, start, total = [], 0, 0
    for i, size in enumerate(sizes):
        total += size
        if total >= max_points:
            out.append(records[start : i + 1])
            start, total = i + 1, 0
    if start < len(records):
        out.append(records[start:])
    return out


def _columns(records: list[Record]) -> tuple[list[int], list[float], Columns]:
    """Rows (one per step) and columns of ``records``.

    Records are grouped by shape (key map and key order): a training loop logs the same keys
    every step, so a batch holds a few shapes, and each shape's columns come out of one
    ``zip`` instead of a loop over every value. A step twice in one shape, or a name at the same
    step in two shapes, sends the batch through :func:`_columns_by_row` (first value wins, in
    record order).
    """
    groups: dict[tuple[Any, ...], list[Record]] = {}
    for record in records:
        shape = (record[3], *record[2])
        try:
            groups[shape].append(record)
        except KeyError:
            groups[shape] = [record]
    plan: list[tuple[list[str | None], list[int], list[Record]]] = []
    steps_of: dict[str, set[int]] = {}  # the steps each name already has values at
    for (keymap, *keys), group in groups.items():
        names: list[str | None] = [keymap.name(k) for k in keys] if keymap is not None else keys
        steps = list(map(_STEP, group))
        here = set(steps)
        if len(here) < len(steps):
            return _columns_by_row(records)  # a step twice in one shape
        for name in names:
            if name is not None:
                taken = steps_of.get(name)
                if taken is None:
                    steps_of[name] = here
                elif taken.isdisjoint(here):
                    steps_of[name] = taken | here
                else:
                    return _columns_by_row(records)  # a name twice at one step
        plan.append((names, steps, group))
    if len(plan) == 1:
        row_steps, walls = plan[0][1], list(map(_WALL, plan[0][2]))
    else:
        # In step order: the service stores a batch with increasing steps without sorting it.
        row_steps = sorted(set(chain.from_iterable(steps for _, steps, _ in plan)))
        wall_of: dict[int, float] = {}
        for _, steps, group in reversed(plan):  # the first shape of a step gives its wall time
            wall_of.update(zip(steps, map(_WALL, group), strict=True))
        walls = list(map(wall_of.__getitem__, row_steps))
    n_rows = len(row_steps)
    row_of: dict[int, int] | None = None
    columns: Columns = {}
    for names, steps, group in plan:
        values = zip(*map(_VALUES, map(_METRICS, group)), strict=True)
        if steps == row_steps:  # the usual case: this shape was logged at every step
            for name, column in zip(names, values, strict=True):
                if name is not None:
                    columns[name] = column
            continue
        if row_of is None:
            row_of = dict(zip(row_steps, range(n_rows), strict=True))
        rows = list(map(row_of.__getitem__, steps))
        for name, column in zip(names, values, strict=True):
            if name is not None:
                full = columns.get(name)
                if full is None:
                    full = columns[name] = [None] * n_rows
                assert isinstance(full, list)  # shapes sharing a name cover some rows each
                deque(map(full.__setitem__, rows, column), maxlen=0)
    return row_steps, walls, columns


def _columns_by_row(records: list[Record]) -> tuple[list[int], list[float], Columns]:
    """:func:`_columns` one value at a time: the first value of a (key, step) wins."""
    steps: list[int] = []
    walls: list[float] = []
    columns: dict[str, list[Any]] = {}
    rows: dict[int, int] = {}
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
            # else: same key and step twice: the first value wins, as on the server
    for column in columns.values():
        if len(column) < len(steps):
            column.extend([None] * (len(steps) - len(column)))
    return steps, walls, dict(columns)


def _finish_columns(columns: Columns) -> int:
    """Turn every value into a float (or None), in place. Returns the number of unreadable
    tensor values (set to None)."""
    tensors: list[tuple[list[Any], int, Any]] = []
    tensor_columns: list[list[Any]] = []
    unreadable = 0
    for name, values in columns.items():
        kinds = set(map(type, values))
        if kinds <= _NOTHING_TO_CONVERT:
            continue  # the usual column: floats only, checked without a Python loop
        if kinds <= _NUMBERS:  # ints (a token count): converted in one C loop
            try:
                columns[name] = array("d", values)
                continue
            except OverflowError:  # an int beyond float range: +-inf, value by value below
                pass
        column = columns[name] = list(values)
        if len(kinds) == 1 and hasattr(column[0], "device") and hasattr(column[0], "reshape"):
            tensor_columns.append(column)  # e.g. a loss logged as a tensor at every step
            continue
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
    if tensor_columns:
        tensors.extend(_read_tensor_columns(tensor_columns))
    return unreadable + (_read_tensors(tensors) if tensors else 0)


def _read_tensor_columns(columns: list[list[Any]]) -> list[tuple[list[Any], int, Any]]:
    """Read columns of 0-d tensors: on the CPU value by value, elsewhere one stacked copy per
    dtype (so one sync per device and dtype, as :func:`_read_tensors`), without a Python loop
    over the values. Returns the values left for :func:`_read_tensors` (columns of mixed
    dtypes, devices or shapes)."""
    import torch  # a tensor was logged, so torch is already imported

    by_dtype: dict[Any, list[list[Any]]] = {}
    rest: list[tuple[list[Any], int, Any]] = []
    for column in columns:
        if column[0].is_cpu:
            # A CPU tensor is read without a device sync, and float() of 0-d CPU tensors (one
            # C loop) is cheaper than stacking them and listing the stack; it is exact
            # (a float64 read). The list is replaced only once every value was read.
            try:
                column[:] = map(float, column)
                continue
            except (TypeError, ValueError, RuntimeError):
                pass  # e.g. a tensor of several values: the general path below
        dtypes = set(map(_DTYPE, column))
        if len(dtypes) == 1 and set(map(_NDIM, column)) == {0}:
            by_dtype.setdefault(dtypes.pop(), []).append(column)
        else:
            rest.extend((column, i, t) for i, t in enumerate(column))
    for dtype, group in by_dtype.items():
        try:
            with torch.no_grad():
                values = torch.stack(list(chain.from_iterable(group))).tolist()
        except Exception:  # on several devices, or a device failed: value by value
            rest.extend((column, i, t) for column in group for i, t in enumerate(column))
            continue
        if not dtype.is_floating_point:
            values = list(map(_int_to_float, values))
        start = 0
        for column in group:
            column[:] = values[start : start + len(column)]
            start += len(column)
    return rest


def _int_to_float(value: int) -> float:
    try:
        return float(value)
    except OverflowError:
        return float("inf") if value > 0 else float("-inf")


def _read_tensors(items: list[tuple[list[Any], int, Any]]) -> int:
    """Read 0-d tensors with one stacked copy per device and dtype (one sync per device, not
    per value; no conversion, so every value is read exactly)."""
    import torch  # a tensor was logged, so torch is already imported

    by_kind: dict[tuple[Any, Any], list[tuple[list[Any], int, Any]]] = {}
    for item in items:
        tensor = item[2]
        by_kind.setdefault((tensor.device, tensor.dtype), []).append(item)
    unreadable = 0
    for (device, _), group in by_kind.items():
        values: list[Any]
        try:
            with torch.no_grad():
                values = torch.stack(
                    [t if t.ndim == 0 else t.reshape(()) for _, _, t in group]
                ).tolist()
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
            column[i] = value if type(value) is not int else _int_to_float(value)
    return unreadable


def _encode(steps: list[int], walls: list[float], columns: Columns, max_keys: int) -> list[Batch]:
    # The body is written as bytes, not through one json.dumps: it is almost all base64 text,
    # which the encoder would scan character by character for escapes (about a sixth of the
    # batcher's CPU). Names (cached) and sparse columns still go through json.dumps.
    keys = list(columns)
    out = []
    head = b"".join((b'{"steps":"', _b64_packed("q", steps), b'","wall_time":"',
                     _b64_packed("d", walls), b'","values":{'))
    for start in range(0, len(keys), max_keys):
        fields: list[bytes] = []
        points = 0
        for key in keys[start : start + max_keys]:
            column = columns[key]
            try:
                text = b'"' + _b64_packed("d", column) + b'"'
                points += len(column)
            except struct.error:  # a None: the key is missing at some rows (a JSON array)
                # allow_nan: a sparse column's NaN/Infinity travel as the bare literals
                # Python emits.
                text = json.dumps(list(column), separators=(",", ":")).encode()
                points += len(column) - list(column).count(None)
            fields.append(_json_name(key) + b":" + text)
        if not points:
            continue
        out.append(Batch(head + b",".join(fields) + b"}}", points))
    return out


@functools.lru_cache(maxsize=4096)
def _json_name(key: str) -> bytes:
    """A metric name as a JSON string (cached: a run sends the same few names every batch)."""
    return json.dumps(key).encode()


def _b64_packed(typecode: str, column: Sequence[Any]) -> bytes:
    """A column's :data:`~curvecast.contract.BASE64_COLUMNS` text: its values as little-endian
    ``typecode`` (``"d"``: float64, ``"q"``: int64) bytes, in base64.

    ``struct.pack`` of the values as arguments, not ``array(typecode, column)``: an array takes
    an iterable item by item through its generic setter, at more CPU for a column of floats
    (BENCHMARKS.md, "encode_paired").

    Raises:
        struct.error: a value is not a number (e.g. None, where a key is missing at a row).
    """
    return binascii.b2a_base64(struct.pack(f"<{len(column)}{typecode}", *column), newline=False)


def _unb64(text: str, typecode: str) -> array[Any]:
    """The column a :func:`_b64_packed` string holds."""
    column = array(typecode, binascii.a2b_base64(text))
    if sys.byteorder == "big":  # pragma: no cover
        column.byteswap()
    return column


def _plain(data: dict[str, Any]) -> dict[str, Any]:
    """A decoded body with every base64 column as a JSON array (NaN wall time: null)."""
    out = dict(data)
    if isinstance(data.get("steps"), str):
        out["steps"] = _unb64(data["steps"], "q").tolist()
    if isinstance(data.get("wall_time"), str):
        out["wall_time"] = [
            None if math.isnan(w) else w for w in _unb64(data["wall_time"], "d").tolist()
        ]
    values = data.get("values")
    if isinstance(values, dict):
        out["values"] = {
            k: _unb64(v, "d").tolist() if isinstance(v, str) else v for k, v in values.items()
        }
    return out


def plain_body(body: bytes) -> bytes:
    """``body`` with plain JSON arrays instead of base64 columns (for an older service); a
    body without them (or not a batch at all) is returned as it is."""
    try:
        data = json.loads(body)
    except ValueError:
        return body
    if not isinstance(data, dict):
        return body
    try:
        plain = _plain(data)
    except ValueError:  # not base64 of 8-byte items (binascii.Error is one): the service says so
        return body
    return body if plain == data else json.dumps(plain, separators=(",", ":")).encode()


def split_batch(batch: Batch) -> list[Batch]:
    """Split a batch the server found too large (413) into two halves by rows."""
    data = _plain(json.loads(batch.body))
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
    points = 0
    for column in values.values():
        if isinstance(column, list):
            points += len(column) - column.count(None)
        elif isinstance(column, str):  # base64 float64: every entry is a point
            try:
                points += len(binascii.a2b_base64(column)) // 8
            except binascii.Error:
                pass  # the server refuses the line; it carries no points that count
    return points


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
