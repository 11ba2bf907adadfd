"""curvecast client: the training-loop hook that streams metrics to a curvecast service.

Standard library only (torch is imported lazily, only to read logged tensors)::

    from curvecast.client import Monitor

    mon = Monitor(url="http://127.0.0.1:8000", project="lm", run_name="gpt-120m",
                  total_steps=20_000)
    mon.watch(optimizer)              # ScheduleFree+ telemetry (or the LR) after every step
    for step in range(1, 20_001):
        loss = train_step()
        mon.log(step, loss=loss)      # appends to a buffer: no I/O, no device sync
    mon.finish()                      # also runs at interpreter exit

Points the service cannot take (down, restarting, unreachable) go to a local spool and are
replayed automatically; ``curvecast sync`` uploads what a finished process left behind.
Integrations: :mod:`curvecast.client.integrations.lightning`,
:mod:`curvecast.client.integrations.transformers`.
"""

from curvecast.client._monitor import Monitor
from curvecast.client._transport import HTTPTransport, Response, Transport, TransportError

__all__ = ["HTTPTransport", "Monitor", "Response", "Transport", "TransportError"]
