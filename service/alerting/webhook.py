"""Webhook payloads (Alertmanager's webhook format, version 4, plus a Slack-compatible ``text``)
and HMAC-SHA256 signatures. Pure: no network, no clock (callers pass the time).

Signature scheme (docs/alerts.md shows a receiver)::

    X-Curvecast-Delivery:  <delivery id, a UUID; the same on every retry: de-duplicate on it>
    X-Curvecast-Timestamp: <unix seconds of this attempt>
    X-Curvecast-Signature: sha256=<hex HMAC-SHA256(secret, f"{delivery}.{timestamp}." + body)>

A receiver recomputes the HMAC over the raw body, compares in constant time, rejects timestamps
older than a few minutes (replays) and ignores delivery ids it has already processed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "DELIVERY_HEADER",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "AlertView",
    "build_payload",
    "fingerprint",
    "sign",
    "signature_headers",
    "slack_escape",
    "verify",
]

DELIVERY_HEADER = "X-Curvecast-Delivery"
TIMESTAMP_HEADER = "X-Curvecast-Timestamp"
SIGNATURE_HEADER = "X-Curvecast-Signature"
#: Alertmanager's "no end time" value for firing alerts.
ZERO_TIME = "0001-01-01T00:00:00Z"
#: Receivers should reject signatures older than this (seconds).
DEFAULT_TOLERANCE_S = 300


@dataclass(frozen=True)
class AlertView:
    """What a notification says about one alert."""

    run_id: str
    run_name: str
    project: str
    rule: str
    severity: str
    status: str  # "firing" | "resolved"
    summary: str
    description: str
    started_at: datetime
    ended_at: datetime | None
    step: int | None
    value: float | None


def _iso(t: datetime | None) -> str:
    if t is None:
        return ZERO_TIME
    t = t if t.tzinfo is not None else t.replace(tzinfo=UTC)
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def fingerprint(labels: Mapping[str, str]) -> str:
    """A stable id of an alert's identity (its labels), as Alertmanager reports it: 16 hex
    digits of a SHA-256 over the sorted labels."""
    raw = "\x00".join(f"{k}\x01{labels[k]}" for k in sorted(labels))
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def dashboard_url(public_url: str, run_id: str) -> str:
    """The run's dashboard page."""
    return f"{public_url.rstrip('/')}/runs/{run_id}"


def build_payload(
    alert: AlertView, *, public_url: str, receiver: str, delivery_id: str
) -> dict[str, Any]:
    """The webhook body for one alert transition.

    Shaped like Alertmanager's webhook payload (version 4), with one alert per notification,
    plus ``text`` for Slack-compatible receivers (incoming webhooks render it) and
    ``deliveryId``.
    """
    labels = {
        "alertname": alert.rule,
        "rule": alert.rule,
        "severity": alert.severity,
        "project": alert.project,
        "run_id": alert.run_id,
        "run_name": alert.run_name,
    }
    link = dashboard_url(public_url, alert.run_id)
    annotations = {
        "summary": alert.summary,
        "description": alert.description,
        "dashboard": link,
    }
    if alert.step is not None:
        annotations["step"] = str(alert.step)
    if alert.value is not None and math.isfinite(alert.value):
        annotations["value"] = f"{alert.value:.6g}"
    body_alert = {
        "status": alert.status,
        "labels": labels,
        "annotations": annotations,
        "startsAt": _iso(alert.started_at),
        "endsAt": _iso(alert.ended_at) if alert.status == "resolved" else ZERO_TIME,
        "generatorURL": link,
        "fingerprint": fingerprint(labels),
    }
    return {
        "version": "4",
        "groupKey": f'{{}}:{{alertname="{alert.rule}", run_id="{alert.run_id}"}}',
        "truncatedAlerts": 0,
        "status": alert.status,
        "receiver": receiver,
        "groupLabels": {"alertname": alert.rule, "run_id": alert.run_id},
        "commonLabels": labels,
        "commonAnnotations": annotations,
        "externalURL": public_url.rstrip("/"),
        "alerts": [body_alert],
        "deliveryId": delivery_id,
        "text": slack_text(alert, link),
    }


def slack_escape(text: str) -> str:
    """Escape ``&``, ``<`` and ``>`` as Slack's message formatting asks (``&amp;``, ``&lt;``,
    ``&gt;``): the only three characters that make control sequences, so an escaped string
    renders as the literal text and cannot open a link (``<https://...|label>``) or a mention
    (``<!channel>``, ``<@U123>``)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_text(alert: AlertView, link: str) -> str:
    """One Slack ``mrkdwn`` message: status, severity, run, summary, link.

    Every string an ingest token controls (the run's name, the project, the summary, which
    names metric keys) is escaped with :func:`slack_escape`; a run named
    ``<https://evil.example|Re-authenticate> <!channel>`` was a phishing link and an
    ``@channel`` ping.
    """
    icon = {"critical": ":red_circle:", "warning": ":warning:"}.get(alert.severity, ":info:")
    if alert.status == "resolved":
        icon = ":white_check_mark:"
    step = f" at step {alert.step}" if alert.step is not None else ""
    esc = slack_escape
    return (
        f"{icon} [{alert.status.upper()}] {esc(alert.severity)} `{esc(alert.rule)}` on run "
        f"<{esc(link)}|{esc(alert.run_name)}> ({esc(alert.project)}){step}: "
        f"{esc(alert.summary)}"
    )


def encode_body(payload: Mapping[str, Any]) -> bytes:
    """The exact bytes that are stored, signed and sent (compact, key order kept)."""
    return json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()


def sign(secret: str, delivery_id: str, timestamp: int, body: bytes) -> str:
    """``sha256=<hex>``: HMAC-SHA256 over ``f"{delivery_id}.{timestamp}."`` and the body."""
    mac = hmac.new(secret.encode(), f"{delivery_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def signature_headers(
    secret: str | None, delivery_id: str, timestamp: int, body: bytes
) -> dict[str, str]:
    """Headers of one attempt: always the delivery id and timestamp; the signature when a
    secret is set."""
    headers = {
        "Content-Type": "application/json",
        DELIVERY_HEADER: delivery_id,
        TIMESTAMP_HEADER: str(timestamp),
        "User-Agent": "curvecast-webhook/1",
    }
    if secret:
        headers[SIGNATURE_HEADER] = sign(secret, delivery_id, timestamp, body)
    return headers


def verify(
    secret: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> bool:
    """Check a received webhook: a valid signature over this body, made within
    ``tolerance_s`` of ``now``. What a receiver runs (header names are case-insensitive)."""
    lower = {k.lower(): v for k, v in headers.items()}
    delivery = lower.get(DELIVERY_HEADER.lower())
    stamp = lower.get(TIMESTAMP_HEADER.lower())
    given = lower.get(SIGNATURE_HEADER.lower())
    if not delivery or not stamp or not given:
        return False
    try:
        ts = int(stamp)
    except ValueError:
        return False
    if abs(now - ts) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, delivery, ts, body), given)
