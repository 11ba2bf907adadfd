"""TensorBoard event directories: one run per directory holding event files, a series per
scalar tag.

The tensorboard package finds the runs (``io_wrapper.GetLogdirSubdirectories``, the rule
TensorBoard itself uses: a directory with a file whose name contains ``tfevents``), names the
event files, and parses every record (its ``Event`` protocol buffer; a tensor through
``tensor_util.make_ndarray``). The records are framed and checksummed by :mod:`.tfrecord`.

Scalars are what TensorBoard's scalar dashboard shows: a value's ``simple_value`` (what
``torch.utils.tensorboard`` writes by default, and TensorFlow 1), or a one-element numeric
tensor of the ``scalars`` plugin (``new_style=True``, TensorFlow 2's ``tf.summary.scalar``,
which describes a tag's plugin in its first value only: a tensor tag whose plugin was not seen
is taken when it holds one number). Histograms, images, text and the rest are not read.

A step logged twice keeps its first value, as the service keeps the first value of a
(run, key, step); TensorBoard's "purge orphaned data" after a restart is not applied (the
points a restarted run logs again at earlier steps are not imported over the first ones).
Files are read in name order (their names start with a timestamp), each from where the last
import of the run stopped (``source.files``: the offset after the last record stored).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensorboard.backend.event_processing import io_wrapper
from tensorboard.compat.proto import event_pb2
from tensorboard.util import tensor_util

from curvecast.service.importers.batches import (
    Checkpoint,
    ColumnBuffer,
    ImportInputError,
    KeyMap,
    SourceRun,
)
from curvecast.service.importers.tfrecord import DamagedRecord, read_records

__all__ = ["TensorBoardRun", "find_runs", "read_curves"]

#: The plugin of TensorBoard's scalar dashboard.
SCALARS_PLUGIN = "scalars"
KIND = "tensorboard"


@dataclass
class TensorBoardRun:
    """A run directory and its event files (name order).

    Attributes:
        run: the run as imported (identity: the directory's absolute path).
        directory: the directory.
        files: its event files, in the order they are read.
        warnings: what reading left out (a damaged file's rest), for the import's report.
    """

    run: SourceRun
    directory: Path
    files: list[Path]
    warnings: list[str] = field(default_factory=list)

    def bytes_to_read(self, offsets: Mapping[str, int]) -> int:
        """Bytes left to read, from ``offsets`` (a previous import's positions) on."""
        total = 0
        for path in self.files:
            size = path.stat().st_size
            start = offsets.get(path.name, 0)
            total += size - (start if 0 <= start <= size else 0)
        return total

    def checkpoints(self, keymap: KeyMap, batch_points: int,
                    offsets: Mapping[str, int] | None = None) -> Iterator[Checkpoint]:
        """The run's scalars, a checkpoint every ``batch_points`` points and at each file's end.

        ``offsets``: where a previous import stopped in each file (by file name); a file now
        shorter than its offset was replaced and is read from its start.
        """
        positions = {name: int(n) for name, n in (offsets or {}).items()}
        buffer = ColumnBuffer()
        plugins: dict[str, str] = {}
        for path in self.files:
            start = positions.get(path.name, 0)
            size = path.stat().st_size
            if not 0 <= start <= size:
                start = 0
            read_to = start
            for offset in self._read(path, start, buffer, keymap, plugins, batch_points):
                positions[path.name] = offset
                yield buffer.take(position={"files": dict(positions)},
                                  progress=offset - read_to)
                read_to = offset

    def _read(self, path: Path, start: int, buffer: ColumnBuffer, keymap: KeyMap,
              plugins: dict[str, str], batch_points: int) -> Iterator[int]:
        """Append the file's scalars to ``buffer`` from byte ``start``; yield the offset read up
        to whenever the buffer holds ``batch_points`` points, and at the end of the file."""
        parse = event_pb2.Event.FromString
        keys: dict[str, str | None] = {}
        columns: dict[str, Any] = {}
        offset = start
        n = buffer.n_points
        try:
            for records, ends in read_records(path, start):
                for index, record in enumerate(records):
                    event = parse(record)
                    values = event.summary.value
                    if not values:
                        continue
                    step, wall = event.step, event.wall_time
                    for value in values:
                        tag = value.tag
                        key = keys.get(tag, "")
                        if key == "":
                            key = keys[tag] = keymap.key(tag)
                        if key is None:
                            continue
                        x = value.simple_value
                        # 0.0 is also what an unset simple_value reads as: only then ask which
                        # kind of value this is (most values are simple and not 0).
                        if x == 0.0 and not value.HasField("simple_value"):
                            tensor_x = _tensor_scalar(value, tag, plugins)
                            if tensor_x is None:
                                continue
                            x = tensor_x
                        cols = columns.get(key)
                        if cols is None:
                            cols = columns[key] = buffer.column(key)
                        cols[0].append(step)
                        cols[1].append(x)
                        cols[2].append(wall)
                        n += 1
                    if n >= batch_points:
                        buffer.n_points = n
                        yield ends[index]
                        columns.clear()
                        n = 0
                offset = ends[-1]
        except DamagedRecord as exc:
            self.warnings.append(f"{exc}: the rest of the file is not imported")
        except OSError as exc:
            raise ImportInputError(f"{path}: cannot read ({exc.strerror or exc})") from None
        buffer.n_points = n
        yield offset


def _tensor_scalar(value: Any, tag: str, plugins: dict[str, str]) -> float | None:
    """A tensor value's number when it is a scalar summary, else None."""
    if value.HasField("metadata") and value.metadata.plugin_data.plugin_name:
        plugins[tag] = value.metadata.plugin_data.plugin_name
    plugin = plugins.get(tag)
    if (plugin is not None and plugin != SCALARS_PLUGIN) or not value.HasField("tensor"):
        return None
    try:
        array = tensor_util.make_ndarray(value.tensor)
    except (TypeError, ValueError):
        return None
    if array.size != 1 or array.dtype.kind not in "fiub":
        return None
    return float(array.reshape(-1)[0])


def _event_files(directory: Path) -> list[Path]:
    return sorted((p for p in directory.iterdir()
                   if p.is_file() and io_wrapper.IsTensorFlowEventsFile(str(p))),
                  key=lambda p: p.name)


def find_runs(path: str | os.PathLike[str]) -> list[TensorBoardRun]:
    """The runs under a log directory (each directory holding event files, the directory
    itself included), or the run of one event file's directory, by relative path.

    Raises:
        ImportInputError: no such path, or no event file under it.
    """
    root = Path(path).expanduser()
    if not root.exists():
        raise ImportInputError(f"{root}: no such file or directory")
    root = root.resolve()
    if root.is_file():
        if not io_wrapper.IsTensorFlowEventsFile(str(root)):
            raise ImportInputError(f"{root}: not a TensorBoard event file (its name has no "
                                   "'tfevents')")
        directories = [root.parent]
        root = root.parent
    else:
        directories = sorted(Path(d) for d in io_wrapper.GetLogdirSubdirectories(str(root)))
    runs = []
    for directory in directories:
        files = _event_files(directory)
        if not files:
            continue
        relative = directory.relative_to(root).as_posix()
        name = root.name if relative == "." else relative
        runs.append(TensorBoardRun(
            run=SourceRun(kind=KIND, identity=str(directory), name=name[:200] or "tensorboard",
                          status_reason="imported from TensorBoard",
                          source={"kind": KIND, "path": str(directory)}),
            directory=directory, files=files))
    if not runs:
        raise ImportInputError(f"{root}: no TensorBoard event files (files named "
                               "'*tfevents*') in it or below it")
    return runs


def read_curves(path: str | os.PathLike[str]) -> dict[str, tuple[list[float], list[float]]]:
    """Every scalar series of ONE run's event files, by key, whole (for ``curvecast
    forecast``, which fits a series at once).

    Raises:
        ImportInputError: the path holds no run, or several (naming them).
    """
    runs = find_runs(path)
    if len(runs) > 1:
        names = ", ".join(run.run.name for run in runs[:10])
        raise ImportInputError(f"{path}: holds {len(runs)} TensorBoard runs ({names}"
                               f"{', ...' if len(runs) > 10 else ''}): name one of them")
    curves: dict[str, tuple[list[float], list[float]]] = {}
    for checkpoint in runs[0].checkpoints(KeyMap(), batch_points=1 << 62):
        for chunk in checkpoint.chunks:
            steps, values = curves.setdefault(chunk.key, ([], []))
            steps.extend(chunk.steps.astype(float).tolist())
            values.extend(chunk.values.tolist())
    return curves
