"""Webhook URLs that are credentials (a Slack incoming webhook, Discord, ``?token=``, a generated
path segment), on both backends through a real server with auth on: shown whole only to the
admin who registers one, masked in every read (a read token got them whole); never in clear in
the database (its files searched: the SQLite file and its journal; every PostgreSQL table's
rows); delivered to the whole URL; an older version's clear URLs are masked by the migration
and sealed by ``curvecast migrate``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import inspect, text
from sqlalchemy.orm import Session, sessionmaker

from curvecast.service.alerting.webhook_urls import bears_secret, masked_url
from curvecast.service.cli import _seal_plaintext_secrets
from curvecast.service.config import Settings
from curvecast.service.db import make_engine, session_scope
from curvecast.service.migrate import downgrade, upgrade
from curvecast.service.secrets import PREFIX, SecretBox
from curvecast.service.store._common import utcnow
from curvecast.service.worker.alerts import apply_evaluation
from curvecast.service.worker.webhooks import deliver_round
from tests._servers import thread_server
from tests.alerting.conftest import Receiver
from tests.alerting.test_store import _claim, _firing, _run
from tests.conftest import create_pg_database, drop_pg_database
from tests.support import create_token

KEY = "u" * 40

MASKED = {
    "https://hooks.slack.com/services/T0123ABCD/B0456EFGH/abcdefghijklmnopqrstuvwx":
        "https://hooks.slack.com/services/T0123ABCD/B0456EFGH/***",
    "https://hooks.slack.com/services/T01/B02/short":
        "https://hooks.slack.com/services/T01/B02/***",
    "https://discord.com/api/webhooks/123456789012345678/Abc-def_ghi":
        "https://discord.com/api/webhooks/123456789012345678/***",
    "https://example.com/hook?token=s3cr3t&channel=ops&x=":
        "https://example.com/hook?token=***&channel=***&x=",
    "https://chat.googleapis.com/v1/spaces/AAAA1234/messages?key=AIza&token=xyz":
        "https://chat.googleapis.com/v1/spaces/AAAA1234/messages?key=***&token=***",
    "https://n8n.example.com/webhook/0f8fad5b-d9cb-469f-a165-70867728950e":
        "https://n8n.example.com/webhook/***",
    "https://mm.example.com/hooks/xwqzy8u9a3bcdgh4kq1r2tsnpe": "https://mm.example.com/hooks/***",
}
#: Nothing to hide: words, numeric ids, a port.
PLAIN = ["https://alerts.example.com/curvecast", "http://8.8.8.8:9000/hooks/ml-team",
         "https://example.com/api/v2/notify/12345678901234567890", "https://hooks.slack.com/"]


@pytest.mark.parametrize("url", list(MASKED))
def test_tokens_in_urls_are_masked(url: str) -> None:
    assert masked_url(url) == MASKED[url]
    assert bears_secret(url)


@pytest.mark.parametrize("url", PLAIN)
def test_urls_without_a_token_are_shown_as_they_are(url: str) -> None:
    assert masked_url(url) == url and not bears_secret(url)


def _url(factory: sessionmaker[Session]) -> str:
    return factory.kw["bind"].url.render_as_string(hide_password=False)


@pytest.fixture(scope="module")
def authed(factory: sessionmaker[Session]) -> Iterator[str]:
    settings = Settings(database_url=_url(factory), secret_key=KEY, auth_enabled=True,
                        worker_enabled=False, webhook_allow_private=True)
    with thread_server(settings) as url:
        yield url


def _database_text(factory: sessionmaker[Session]) -> bytes:
    """Everything the database holds, as bytes: the SQLite file and its journal files (free
    pages included), or every row of every PostgreSQL table as text."""
    engine = factory.kw["bind"]
    if engine.dialect.name == "sqlite":
        with engine.connect() as conn:  # whatever is committed, in the files
            conn.exec_driver_sql("PRAGMA wal_checkpoint(FULL)")
        db = Path(engine.url.database)
        return b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*"))
    with session_scope(factory) as s:
        tables = inspect(s.connection()).get_table_names()
        return "".join(str(s.execute(text(f'SELECT string_agg(t::text, \'|\') FROM "{t}" t')
                                     ).scalar()) for t in tables).encode()


def test_a_slack_url_is_shown_whole_once_masked_in_reads_and_sealed_at_rest(
    factory: sessionmaker[Session], authed: str, project: str,
) -> None:
    db = _url(factory)
    admin = {"authorization": f"Bearer {create_token(db, project, 'admin')}"}
    read = {"authorization": f"Bearer {create_token(db, project, 'read')}"}
    token = uuid.uuid4().hex + "Zz9"
    slack = f"https://hooks.slack.com/services/T0123ABCD/B0456EFGH/{token}"
    hooks = f"{authed}/api/v1/projects/{project}/webhooks"
    created = httpx.post(hooks, json={"url": slack}, headers=admin)
    assert created.status_code == 201, created.text
    assert created.json()["url"] == slack and created.json()["url_masked"] is True
    shown = "https://hooks.slack.com/services/T0123ABCD/B0456EFGH/***"
    for who in (read, admin):
        [listed] = httpx.get(hooks, headers=who).json()["webhooks"]
        assert listed["url"] == shown and listed["url_masked"] is True
        assert listed["name"] == shown  # the default name is the URL: masked too
        assert token not in httpx.get(hooks, headers=who).text
    # Not in the database in any form (it was in clear in webhooks.url and .name).
    everything = _database_text(factory)
    assert token.encode() not in everything
    assert b"T0123ABCD/B0456EFGH/***" in everything  # the search does see the table
    with session_scope(factory) as s:
        sealed = s.execute(text("SELECT url_sealed FROM webhooks WHERE id = :i"),
                           {"i": created.json()["id"]}).scalar_one()
    assert sealed.startswith(PREFIX) and SecretBox(KEY).open(sealed) == slack
    # A URL without a token is shown as it is, and stored as it is.
    plain = httpx.post(hooks, json={"url": "https://alerts.example.com/cc", "enabled": False},
                       headers=admin).json()
    assert plain["url"] == "https://alerts.example.com/cc" and plain["url_masked"] is False


def _fire(factory: sessionmaker[Session], project: str) -> None:
    job = _claim(factory, _run(factory, project))
    assert job is not None
    with session_scope(factory) as s:
        apply_evaluation(s, job=job, transitions=[_firing()], state={}, evaluated_step=9,
                         n_points=10, next_check_at=None, now=utcnow(), public_url="http://x")


def test_a_delivery_goes_to_the_whole_url(factory: sessionmaker[Session], authed: str,
                                          project: str, receiver: Receiver) -> None:
    db = _url(factory)
    admin = {"authorization": f"Bearer {create_token(db, project, 'admin')}"}
    path = f"/hooks/{uuid.uuid4()}"
    resp = httpx.post(f"{authed}/api/v1/projects/{project}/webhooks",
                      json={"url": receiver.url + path}, headers=admin)
    assert resp.status_code == 201 and resp.json()["url_masked"] is True
    _fire(factory, project)
    settings = Settings(database_url=db, secret_key=KEY, webhook_allow_private=True)
    while deliver_round(factory, settings):
        pass
    assert len(receiver.by_path(path)) == 1


def test_without_a_key_a_token_bearing_url_is_refused_on_postgres(pg_url: str,
                                                                  project: str) -> None:
    settings = Settings(database_url=pg_url, secret_key=None, worker_enabled=False)
    with thread_server(settings) as url:
        hooks = f"{url}/api/v1/projects/{project}/webhooks"
        resp = httpx.post(hooks, json={"url": "https://hooks.slack.com/services/T1/B2/tok3n"})
        assert resp.status_code == 422
        message = resp.json()["message"]
        assert "CURVECAST_SECRET_KEY" in message and "tok3n" not in message
        assert "https://hooks.slack.com/services/T1/B2/***" in message
        assert httpx.post(hooks, json={"url": "https://alerts.example.com/x"}).status_code == 201


@pytest.fixture(params=["sqlite", "postgres"])
def empty_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'legacy.db'}"
        return
    url = create_pg_database()
    try:
        yield url
    finally:
        drop_pg_database(url)


def test_an_older_versions_url_is_masked_by_the_migration_and_sealed_by_migrate(
    empty_database: str,
) -> None:
    url = empty_database
    upgrade(url, "0009")
    slack = "https://hooks.slack.com/services/T9/B9/legacytoken0123456789"
    engine = make_engine(Settings(database_url=url))
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO projects (name, created_at) VALUES ('old', :t)"),
                         {"t": utcnow()})
            conn.execute(text(
                "INSERT INTO webhooks (project_id, name, url, enabled, created_at) VALUES"
                " ((SELECT id FROM projects), :n, :u, :e, :t),"
                " ((SELECT id FROM projects), 'mine', 'https://a.example.com/x', :e, :t)"),
                {"n": slack, "u": slack, "e": True, "t": utcnow()})

        def rows() -> list[tuple[str, str, str | None, bool]]:
            with engine.connect() as conn:
                return [tuple(r) for r in conn.execute(text(  # type: ignore[misc]
                    "SELECT name, url, url_sealed, enabled FROM webhooks ORDER BY id"))]

        upgrade(url)
        shown = "https://hooks.slack.com/services/T9/B9/***"
        assert rows() == [(shown, shown, slack, True),
                          ("mine", "https://a.example.com/x", None, True)]
        # A downgrade before sealing gives the URL back.
        downgrade(url, "0009")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT url FROM webhooks ORDER BY id")).scalars().all(
            ) == [slack, "https://a.example.com/x"]
        upgrade(url)
        # `curvecast migrate` seals it.
        assert _seal_plaintext_secrets(Settings(database_url=url, secret_key=KEY)) == 1
        [(_, _, sealed, _), _] = rows()
        assert sealed is not None and sealed.startswith(PREFIX)
        assert SecretBox(KEY).open(sealed) == slack
        # Sealed, it cannot come back in a downgrade (no key there): disabled, still masked.
        downgrade(url, "0009")
        with engine.connect() as conn:
            assert [tuple(r) for r in conn.execute(text(
                "SELECT url, enabled FROM webhooks ORDER BY id"))] == [
                (shown, False), ("https://a.example.com/x", True)]
    finally:
        engine.dispose()
