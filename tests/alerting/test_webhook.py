"""Webhook payloads (Alertmanager v4 + Slack text), HMAC signatures and URL validation."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from curvecast.service.alerting.webhook import (
    AlertView,
    build_payload,
    encode_body,
    fingerprint,
    signature_headers,
    verify,
)
from curvecast.service.schemas.alerts import validate_webhook_url

VIEW = AlertView(
    run_id="0b7e0d7c-5f6c-4a0e-9d43-9a2f5a0c1e11", run_name="charlm", project="p",
    rule="grad_norm_drift", severity="warning", status="firing",
    summary="gradient norm has risen x2.50", description="...",
    started_at=datetime(2026, 11, 21, 12, 0, tzinfo=UTC), ended_at=None, step=1200, value=2.5,
)


def test_payload_has_the_alertmanager_shape() -> None:
    body = build_payload(VIEW, public_url="https://cc.example/", receiver="ops", delivery_id="d1")
    assert body["version"] == "4" and body["status"] == "firing" and body["receiver"] == "ops"
    (alert,) = body["alerts"]
    assert alert["labels"]["alertname"] == "grad_norm_drift"
    assert alert["labels"]["run_id"] == VIEW.run_id and alert["labels"]["severity"] == "warning"
    assert alert["startsAt"] == "2026-11-21T12:00:00Z"
    assert alert["endsAt"] == "0001-01-01T00:00:00Z"
    link = f"https://cc.example/runs/{VIEW.run_id}"
    assert alert["generatorURL"] == link and alert["annotations"]["dashboard"] == link
    assert alert["fingerprint"] == fingerprint(alert["labels"]) and len(alert["fingerprint"]) == 16
    assert link in body["text"] and "FIRING" in body["text"]
    assert body["deliveryId"] == "d1"
    json.loads(encode_body(body))  # strict JSON


def test_resolved_payload_carries_the_end_time() -> None:
    ended = datetime(2026, 11, 21, 13, 0, tzinfo=UTC)
    view = AlertView(**{**VIEW.__dict__, "status": "resolved", "ended_at": ended})
    body = build_payload(view, public_url="http://x", receiver="r", delivery_id="d")
    assert body["status"] == "resolved" and body["alerts"][0]["endsAt"] == "2026-11-21T13:00:00Z"
    # Same labels, same fingerprint: receivers match the resolution to the firing alert.
    firing = build_payload(VIEW, public_url="http://x", receiver="r", delivery_id="e")
    assert body["alerts"][0]["fingerprint"] == firing["alerts"][0]["fingerprint"]


def test_signature_verifies_and_rejects_tampering_and_replays() -> None:
    body = b'{"a":1}'
    headers = signature_headers("s3cret-s3cret-s3cret", "d-1", 1_000_000, body)
    assert headers["X-Curvecast-Signature"].startswith("sha256=")
    assert verify("s3cret-s3cret-s3cret", headers, body, now=1_000_010)
    assert not verify("s3cret-s3cret-s3cret", headers, body + b" ", now=1_000_010)
    assert not verify("other-secret-other", headers, body, now=1_000_010)
    assert not verify("s3cret-s3cret-s3cret", headers, body, now=1_000_000 + 3600)
    forged = {**headers, "X-Curvecast-Delivery": "d-2"}
    assert not verify("s3cret-s3cret-s3cret", forged, body, now=1_000_010)
    lower = {k.lower(): v for k, v in headers.items()}
    assert verify("s3cret-s3cret-s3cret", lower, body, now=1_000_010)


def test_unsigned_without_a_secret() -> None:
    headers = signature_headers(None, "d", 1, b"{}")
    assert "X-Curvecast-Signature" not in headers and headers["X-Curvecast-Delivery"] == "d"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://example.com/x", "http:// or https://"),
        ("file:///etc/passwd", "http:// or https://"),
        ("example.com/hook", "http:// or https://"),
        ("http:///nohost", "must name a host"),
        ("https://user:pw@example.com/", "credentials"),
        ("https://example.com/a b", "spaces"),
        ("https://example.com:99999/", "valid URL"),
        ("https://example.com/#frag", "fragment"),
    ],
)
def test_invalid_urls_are_refused_with_a_reason(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_webhook_url(url)


def test_valid_urls_pass() -> None:
    for url in ("http://127.0.0.1:9000/hook", "https://hooks.slack.com/services/T/B/X?x=1"):
        assert validate_webhook_url(f"  {url} ") == url
