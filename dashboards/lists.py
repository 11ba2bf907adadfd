"""The alerts page's and the projects page's rows (pure): the REST API's shapes in, display
strings out (the templates escape every string)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from curvecast.dashboards import fmt

#: Alert states, in the order the alerts page lists them.
ALERT_STATES = ("firing", "pending", "resolved")
#: The silences the alerts page offers, in hours (the REST API takes any ``until``).
SILENCE_HOURS = (1, 24)


def _moment(value: object) -> datetime | None:
    """An API timestamp (ISO text or datetime) as an aware datetime."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return None


def alert_rows(alerts: Sequence[Mapping[str, Any]], run_names: Mapping[str, str],
               now: datetime) -> list[dict[str, Any]]:
    """Rows of the alerts page, firing first, then pending, then resolved (each newest
    first, as the REST API lists them).

    Args:
        alerts: ``AlertOut`` items (``GET /api/v1/alerts``) as JSON.
        run_names: run names by run id (a run without a name shows its short id).
        now: the current time (whether a silence still holds; "3 min ago").

    Returns:
        Per alert: ``id``, ``state``, ``rule``, ``severity``, ``step`` (REST's ``step``, the
        same number the API reports), ``summary``, ``run_id``, ``run_name``, ``project``,
        ``started`` and ``started_ago`` (readable, not the raw timestamp), ``acknowledged``
        ("" when not), ``silenced_until`` ("" when no silence holds) and ``open`` (not
        resolved: acknowledging and silencing apply).
    """
    order = {state: i for i, state in enumerate(ALERT_STATES)}
    rows = []
    for alert in sorted(alerts, key=lambda a: order.get(str(a.get("state")), len(order))):
        run_id = str(alert.get("run_id") or "")
        silenced = _moment(alert.get("silenced_until"))
        rows.append({
            "id": alert.get("id"),
            "state": str(alert.get("state") or ""),
            "rule": str(alert.get("rule") or ""),
            "severity": str(alert.get("severity") or ""),
            "step": fmt.step(alert.get("step")),
            "summary": str(alert.get("summary") or ""),
            "run_id": run_id,
            "run_name": run_names.get(run_id) or run_id[:8],
            "project": str(alert.get("project") or ""),
            "started": fmt.when(alert.get("started_at")),
            "started_ago": fmt.ago(alert.get("started_at"), now),
            "acknowledged": fmt.when(alert["acknowledged_at"])
            if alert.get("acknowledged_at") else "",
            "silenced_until": fmt.when(silenced) if silenced is not None and silenced > now
            else "",
            "open": alert.get("state") != "resolved",
        })
    return rows


def alert_counts(alerts: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """How many of ``alerts`` are in each state (every state named, 0 where none)."""
    counts = dict.fromkeys(ALERT_STATES, 0)
    for alert in alerts:
        state = str(alert.get("state"))
        counts[state] = counts.get(state, 0) + 1
    return counts


def project_rows(projects: Sequence[Mapping[str, Any]], now: datetime) -> list[dict[str, Any]]:
    """Rows of the projects page.

    Args:
        projects: per project ``{"name", "runs_by_status": {status: n}, "last_update",
            "firing_alerts"}``.
        now: the current time ("3 min ago").
    """
    rows = []
    for project in projects:
        by_status: Mapping[str, int] = project.get("runs_by_status") or {}
        # Running first, then the rest by count: what a person scans for.
        parts = sorted(by_status.items(), key=lambda kv: (kv[0] != "running", -kv[1], kv[0]))
        rows.append({
            "name": str(project["name"]),
            "runs": sum(by_status.values()),
            "running": by_status.get("running", 0),
            "statuses": ", ".join(f"{n} {status}" for status, n in parts) or "no runs yet",
            "firing": int(project.get("firing_alerts") or 0),
            "updated": fmt.ago(project.get("last_update"), now)
            if project.get("last_update") else "—",
            "updated_at": fmt.when(project.get("last_update"))
            if project.get("last_update") else "",
        })
    return rows
