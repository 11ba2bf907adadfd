"""The compare page's P(best): each compared run's chance of ending best at the step the page
compares at, from the decision core (:func:`curvecast.service.forecast.chances.rank`, the
leaderboard's and ``GET .../ranking``'s answer), read from the runs' latest stored fits."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy.orm import Session

from curvecast.service.errors import ServiceError
from curvecast.service.forecast.chances import RunInput, rank
from curvecast.service.schemas import Principal
from curvecast.service.store import decisions as decision_store


def chances_best(session: Session, principal: Principal, run_ids: Sequence[uuid.UUID],
                 step: int | None, key: str | None = None
                 ) -> dict[str, tuple[float | None, str]]:
    """``{run id: (P(best), why none)}`` at ``step`` (None: no step to compare at, every
    chance unknown). A run the page cannot read a fit of (no such series) gets None with the
    reason, as a run the forecast cannot judge does."""
    inputs: list[RunInput] = []
    out: dict[str, tuple[float | None, str]] = {}
    for run_id in run_ids:
        try:
            inputs.append(decision_store.run_input(session, run_id=run_id,
                                                   allowed_project=principal.project, key=key))
        except ServiceError as exc:
            out[str(run_id)] = (None, str(exc))
    if step is None:
        return {**out, **{str(r.run_id): (None, "no step to compare at") for r in inputs}}
    for ranked in rank(inputs, step):
        out[str(ranked.run.run_id)] = (ranked.p_best, ranked.reason)
    return out
