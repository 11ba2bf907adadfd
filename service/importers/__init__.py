"""Reading runs other trackers recorded: TensorBoard event directories, MLflow tracking stores
and W&B history exports, as columnar batches.

This package only reads. Each source module turns what it reads into :class:`SourceRun`
descriptions (identity, name, config, final status) and, per run, a stream of
:class:`Checkpoint` items: a few :class:`Chunk` columns (one metric key, its steps, values and
wall times) and how far the source was read once they are stored. Nothing here holds more
than one checkpoint's points (``batch_points``), whatever the run's size, except where a
source's own client library hands over a whole series at once (MLflow: one metric's history).

``curvecast import`` (:mod:`curvecast.service.import_cli`) writes them through the store;
``curvecast forecast`` (:mod:`curvecast.service.forecast.files`) reads the same sources into
curves, with no server. How names become metric keys is the contract's
:func:`curvecast.contract.key_for_name`; docs/imports.md describes each source.
"""

from curvecast.service.importers.batches import (
    Checkpoint,
    Chunk,
    ImportInputError,
    KeyMap,
    SourceRun,
)

__all__ = ["Checkpoint", "Chunk", "ImportInputError", "KeyMap", "SourceRun"]
