"""Webhook secrets at rest, on both backends: stored sealed (never the secret itself), opened
only to sign a delivery that a real receiver verifies; a secret an older version stored in clear
still signs and ``curvecast migrate`` seals it; without a key nothing is stored in clear and a
secret sealed under another key is never sent unsigned."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from curvecast.service.alerting.webhook import verify
from curvecast.service.cli import _seal_plaintext_secrets
from curvecast.service.config import Settings
from curvecast.service.db import session_scope
from curvecast.service.secrets import PREFIX, SecretBox, SecretUnavailable, box_for
from curvecast.service.store._common import utcnow
from curvecast.service.worker.alerts import apply_evaluation
from curvecast.service.worker.webhooks import deliver_round
from tests._servers import thread_server
from tests.alerting.conftest import Receiver
from tests.alerting.test_store import _claim, _firing, _run

SECRET = "a-webhook-secret-of-some-length"
KEY = "k" * 40


def _url(factory: sessionmaker[Session]) -> str:
    return factory.kw["bind"].url.render_as_string(hide_password=False)


def _settings(factory: sessionmaker[Session], **kw: object) -> Settings:
    return Settings(database_url=_url(factory), webhook_allow_private=True,
                    webhook_backoff_base_s=0.01, **kw)  # type: ignore[arg-type]


def _stored(factory: sessionmaker[Session], webhook_id: int) -> str:
    with session_scope(factory) as s:
        return str(s.execute(text("SELECT secret FROM webhooks WHERE id = :i"),
                             {"i": webhook_id}).scalar_one())


def _hook_and_firing_alert(factory: sessionmaker[Session], project: str, url: str,
                           stored_secret: str) -> int:
    """A webhook (its secret column as given), and an alert firing for it (an outbox row)."""
    with session_scope(factory) as s:
        project_id = s.execute(text("SELECT id FROM projects WHERE name = :p"),
                               {"p": project}).scalar()
        if project_id is None:
            s.execute(text("INSERT INTO projects (name, created_at) VALUES (:p, :t)"),
                      {"p": project, "t": utcnow()})
            project_id = s.execute(text("SELECT id FROM projects WHERE name = :p"),
                                   {"p": project}).scalar()
        s.execute(text("INSERT INTO webhooks (project_id, name, url, secret, enabled, created_at)"
                       " VALUES (:p, 'w', :u, :s, :e, :t)"),
                  {"p": project_id, "u": url, "s": stored_secret, "e": True, "t": utcnow()})
        hook = int(s.execute(text("SELECT max(id) FROM webhooks")).scalar_one())
    job = _claim(factory, _run(factory, project))
    assert job is not None
    with session_scope(factory) as s:
        apply_evaluation(s, job=job, transitions=[_firing()], state={}, evaluated_step=9,
                         n_points=10, next_check_at=None, now=utcnow(), public_url="http://x")
    return hook


def _deliver(factory: sessionmaker[Session], settings: Settings) -> None:
    while deliver_round(factory, settings):
        pass


@pytest.fixture(scope="module")
def keyed_server(factory: sessionmaker[Session]) -> Iterator[str]:
    with thread_server(_settings(factory, secret_key=KEY, worker_enabled=False)) as url:
        yield url


def test_a_secret_is_stored_sealed_never_in_clear(
    factory: sessionmaker[Session], keyed_server: str, project: str
) -> None:
    resp = httpx.post(f"{keyed_server}/api/v1/projects/{project}/webhooks",
                      json={"url": "https://hooks.example.com/x", "secret": SECRET})
    assert resp.status_code == 201, resp.text
    stored = _stored(factory, resp.json()["id"])
    assert stored.startswith(PREFIX) and SECRET not in stored
    assert SecretBox(KEY).open(stored) == SECRET
    assert "secret" not in resp.json()


def test_a_sealed_secret_signs_what_a_real_receiver_verifies(
    factory: sessionmaker[Session], project: str, receiver: Receiver
) -> None:
    sealed = SecretBox(KEY).seal(SECRET)
    _hook_and_firing_alert(factory, project, f"{receiver.url}/sealed", sealed)
    _deliver(factory, _settings(factory, secret_key=KEY))
    [request] = receiver.by_path("/sealed")
    assert verify(SECRET, request.headers, request.body, now=time.time())


def test_a_clear_text_secret_of_an_older_version_signs_and_migrate_seals_it(
    factory: sessionmaker[Session], project: str, receiver: Receiver
) -> None:
    hook = _hook_and_firing_alert(factory, project, f"{receiver.url}/legacy", SECRET)
    _deliver(factory, _settings(factory, secret_key=KEY))
    [request] = receiver.by_path("/legacy")
    assert verify(SECRET, request.headers, request.body, now=time.time())
    assert _seal_plaintext_secrets(_settings(factory, secret_key=KEY)) >= 1
    stored = _stored(factory, hook)
    assert stored.startswith(PREFIX) and SecretBox(KEY).open(stored) == SECRET


def test_a_secret_sealed_under_another_key_is_never_sent_unsigned(
    factory: sessionmaker[Session], project: str, receiver: Receiver
) -> None:
    _hook_and_firing_alert(factory, project, f"{receiver.url}/wrong-key",
                           SecretBox("another-key-" * 4).seal(SECRET))
    deliver_round(factory, _settings(factory, secret_key=KEY))
    assert receiver.by_path("/wrong-key") == []
    with session_scope(factory) as s:
        error = s.execute(text("SELECT last_error FROM alert_deliveries ORDER BY created_at "
                               "DESC LIMIT 1")).scalar()
    assert "does not open with this CURVECAST_SECRET_KEY" in str(error)


def test_without_a_key(tmp_path: Path) -> None:
    # PostgreSQL (no key file is possible for a shared database): sealing is refused.
    box = box_for(Settings(database_url="postgresql://x@127.0.0.1/none", secret_key=None))
    with pytest.raises(SecretUnavailable, match="CURVECAST_SECRET_KEY"):
        box.seal(SECRET)
    # Embedded SQLite: a key is made once beside the database, private to its owner.
    db = tmp_path / "c.db"
    first = box_for(Settings(database_url=f"sqlite:///{db}", secret_key=None))
    key_file = Path(f"{db}.key")
    assert key_file.stat().st_mode & 0o777 == 0o600
    again = box_for(Settings(database_url=f"sqlite:///{db}", secret_key=None))
    assert again.open(first.seal(SECRET)) == SECRET


def test_the_api_refuses_a_secret_without_a_key_on_postgres(pg_url: str, project: str) -> None:
    settings = Settings(database_url=pg_url, secret_key=None, worker_enabled=False)
    with thread_server(settings) as url:
        resp = httpx.post(f"{url}/api/v1/projects/{project}-{uuid.uuid4().hex[:6]}/webhooks",
                          json={"url": "https://hooks.example.com/x", "secret": SECRET})
        assert resp.status_code == 422
        assert "CURVECAST_SECRET_KEY" in resp.json()["message"]
        plain = httpx.post(f"{url}/api/v1/projects/{project}/webhooks",
                           json={"url": "https://hooks.example.com/x"})
        assert plain.status_code == 201  # no secret, nothing to seal
