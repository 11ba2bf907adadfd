"""curvecast: watch and forecast neural-network training runs.

The one import most users need::

    from curvecast import Monitor, ScheduleFreePlus

Code that logs with TensorBoard's ``SummaryWriter`` switches with its import line:
``from curvecast import SummaryWriter`` (:mod:`curvecast.client.summary_writer`).

The package is a namespace over the repository's top-level folders: ``curvecast.client`` (the
training-loop hook, standard library only), ``curvecast.sfplus`` (the optimizer, needs torch),
``curvecast.service`` and ``curvecast.dashboards`` (the server, needs the ``[server]`` extra),
``curvecast.migrations`` (its schema) and :mod:`curvecast.contract` (the facts every part agrees
on). Every public name is imported on first use: importing the contract or the service's app
does not load the client, and a client-only install never imports torch.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from curvecast.client import Monitor
    from curvecast.client.summary_writer import SummaryWriter
    from curvecast.sfplus import ScheduleFreePlus

__version__ = "0.2.0"
__all__ = ["Monitor", "ScheduleFreePlus", "SummaryWriter", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy: the client is only loaded by whoever asks for the hook, torch by whoever asks for
    # the optimizer.
    if name == "Monitor":
        from curvecast.client import Monitor

        return Monitor
    if name == "ScheduleFreePlus":
        if importlib.util.find_spec("torch") is None:
            raise ModuleNotFoundError(
                "curvecast.ScheduleFreePlus needs torch: pip install 'curvecast[torch]'",
                name="torch",
            )
        from curvecast.sfplus import ScheduleFreePlus

        return ScheduleFreePlus
    if name == "SummaryWriter":
        from curvecast.client.summary_writer import SummaryWriter

        return SummaryWriter
    raise AttributeError(f"module 'curvecast' has no attribute {name!r}")
