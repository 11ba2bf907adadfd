"""What the store answers to ``curvecast import`` (:mod:`curvecast.service.store.imports`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ImportStart:
    """A run opened for import.

    Attributes:
        run_id: the run (the same for the same source run on every import).
        created: whether this import created it.
        n_points: points it held before this import.
        source: its recorded source as it was before this import (where the last import of
            it stopped reading: ``source["files"]`` for TensorBoard); empty for a new run.
        alert_hold: the lease token that keeps the alert worker off the run while its history
            is imported (None: alerts evaluate the imported points).
    """

    run_id: uuid.UUID
    created: bool
    n_points: int
    source: dict[str, Any] = field(default_factory=dict)
    alert_hold: uuid.UUID | None = None
