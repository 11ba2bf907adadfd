"""ScheduleFree+: learning-rate-free AdamC with Schedule-Free averaging and a Polyak step size.

Usage::

    from curvecast.sfplus import ScheduleFreePlus

    opt = ScheduleFreePlus(model.parameters(), warmup_steps=100, weight_decay=10.0)
    loss = model(batch); loss.backward(); opt.step(loss=loss); opt.zero_grad()
    with opt.averaged(model):
        evaluate(model)

See :class:`ScheduleFreePlus` for the algorithm and :mod:`curvecast.sfplus.reference` for the slow,
literal transcription of the paper's Algorithm 1 that the tests check it against.

``STATS_KEYS`` and ``NORM_STATS_KEYS`` name the keys of ``ScheduleFreePlus.stats()`` and the
extra ones of ``stats(norms=True)``; they are :mod:`curvecast.contract`'s ``OPTIMIZER_STATS`` and
``NORM_STATS``, the names every consumer of the telemetry reads.
"""

from curvecast.contract import NORM_STATS as NORM_STATS_KEYS
from curvecast.contract import OPTIMIZER_STATS as STATS_KEYS
from curvecast.sfplus.optimizer import ScheduleFreePlus

__all__ = ["NORM_STATS_KEYS", "STATS_KEYS", "ScheduleFreePlus"]
