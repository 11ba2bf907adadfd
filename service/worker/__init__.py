"""The background worker: the work ingest must never wait for.

``loop`` runs each task on its own daemon thread in every service process, so that one task's
failure or slowness never stalls the others; each task is a module: ``refit`` (forecasts),
``alerts`` (rule evaluation), ``webhooks`` (outbox delivery), ``liveness`` (marking runs
whose client is gone ``lost``) and ``retention`` (deleting runs that ended long ago, when
``CURVECAST_RETENTION_DAYS`` is set). Every task is safe to run in several processes at once
against one database: each claims its work with leases and row locks, or writes with one
conditional statement.
"""

from curvecast.service.worker.alerts import evaluate_alerts
from curvecast.service.worker.liveness import LivenessTask, mark_silent_runs
from curvecast.service.worker.loop import Task, Worker
from curvecast.service.worker.refit import refit_due_runs
from curvecast.service.worker.retention import RetentionTask, delete_expired_runs
from curvecast.service.worker.webhooks import deliver_webhooks

__all__ = [
    "LivenessTask",
    "RetentionTask",
    "Task",
    "Worker",
    "delete_expired_runs",
    "deliver_webhooks",
    "evaluate_alerts",
    "mark_silent_runs",
    "refit_due_runs",
]
