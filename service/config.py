"""Service settings: the one place configuration is read (environment prefix ``CURVECAST_``)."""

from __future__ import annotations

import ipaddress
from functools import cached_property
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_SQLITE_FILE = "curvecast.db"


def normalise_database_url(url: str) -> str:
    """Map user-friendly database URLs to the SQLAlchemy drivers curvecast ships with.

    ``postgres://`` and ``postgresql://`` use psycopg 3; a bare file path means SQLite.
    """
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url[len("postgresql://") :]
    if "://" not in url:
        return f"sqlite:///{Path(url).expanduser().resolve()}"
    return url


def is_loopback_host(host: str) -> bool:
    """Whether a bind address only accepts connections from this machine."""
    if host in {"localhost", "localhost.localdomain"}:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Settings(BaseSettings):
    """All service settings. Each field is read from ``CURVECAST_<FIELD>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="CURVECAST_", extra="ignore")

    database_url: str = Field(
        default=f"sqlite:///{DEFAULT_SQLITE_FILE}",
        description="SQLAlchemy URL; default is a SQLite file in the working directory.",
    )
    auth_enabled: bool = Field(
        default=False,
        description="Require bearer tokens. May be off only while serving on a loopback address.",
    )
    public_url: str = Field(
        default="http://127.0.0.1:8000",
        description="Base URL people use to reach the service (links in alert notifications).",
    )
    allowed_hosts: str = Field(
        default="",
        description="Comma-separated host names (no port) requests may be addressed to, besides "
        "the loopback names and public_url's host; '*' allows any (behind a proxy that checks).",
    )
    max_body_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    max_header_bytes: int = Field(
        default=32 * 1024, ge=1024,
        description="Most bytes of a request line and its headers together; a larger head is "
        "answered 431 and its connection closed, before any other check (service/http_guard).",
    )
    max_header_fields: int = Field(
        default=100, ge=10, description="Most header lines of one request (more: 431)."
    )
    header_timeout_s: float = Field(
        default=10.0, gt=0,
        description="A connection whose request head is not complete this long after it opened "
        "(or after its previous response) is closed (slowloris).",
    )
    max_connections: int = Field(
        default=1000, ge=1,
        description="Most connections open at once per serve process; one more closes the one "
        "that has waited longest for a request head, or is answered 503 when every connection "
        "is busy. Keep it below the process's open-file limit.",
    )
    max_points_per_request: int = Field(default=100_000, gt=0)
    max_keys_per_request: int = Field(default=1_000, gt=0)
    max_keys_per_run: int = Field(
        default=10_000, gt=0,
        description="Most distinct metric keys one run may have; a batch that would add more "
        "is refused whole (422 too_many_keys). Every listing, export and page of a run costs "
        "something per key.",
    )
    db_connect_timeout_s: int = Field(default=3, gt=0)
    db_ping_after_idle_s: float = Field(
        default=1.0,
        ge=0,
        description="A pooled PostgreSQL connection idle for longer than this is checked with a "
        "round trip before a request uses it (0: always, as SQLAlchemy's pool_pre_ping).",
    )
    retry_after_s: int = Field(default=5, gt=0, description="Retry-After sent with 503 answers.")
    auto_migrate_sqlite: bool = Field(
        default=True, description="Upgrade an embedded SQLite database at start-up."
    )
    worker_enabled: bool = Field(default=True, description="Run the background worker.")
    worker_interval_s: float = Field(default=1.0, gt=0, description="Worker poll interval.")
    worker_wake_gap_s: float = Field(
        default=0.5, ge=0,
        description="New points wake the refit and alert tasks early, but each at most once "
        "per this many seconds (capped at worker_interval_s): under load every ingest request "
        "notifies, and each early round is a claim that mostly finds nothing due.",
    )
    refit_growth: float = Field(
        default=0.05, ge=0, description="Refit a run once it has this fraction more points."
    )
    refit_max_age_s: float = Field(
        default=30.0, gt=0, description="...or once its last fit is this old and it has new points."
    )
    refit_min_interval_s: float = Field(
        default=5.0, ge=0,
        description="A run is refitted at most this often, however fast it grows: a refit "
        "reads and fits the whole series, so a run logging hundreds of steps a second would "
        "otherwise be refitted every round (BENCHMARKS.md, load).",
    )
    retention_days: float | None = Field(
        default=None,
        gt=0,
        description="Delete runs that ended (finished, failed, crashed, lost) more than this many "
        "days ago, with all their points, fits and alerts (the worker, in small batches). "
        "Unset: keep everything.",
    )
    max_read_points: int = Field(
        default=200_000,
        ge=1_000,
        description="Most raw points one GET .../metrics without max_points may return (all "
        "series together); larger reads answer 422 read_too_large (downsample with max_points, "
        "narrow start/end, or export metrics.csv, which streams).",
    )
    refit_lease_s: float = Field(
        default=30.0,
        gt=0,
        description="How long a worker holds a run while refitting it; a run whose worker died "
        "mid-fit is refitted by another once this has passed (a refit takes milliseconds: "
        "BENCHMARKS.md, forecast_latency).",
    )

    @field_validator("database_url")
    @classmethod
    def _normalise_url(cls, value: str) -> str:
        return normalise_database_url(value)

    @cached_property
    def allowed_host_names(self) -> frozenset[str]:
        """The names (lower case, no port) a request's ``Host`` may carry, besides loopback."""
        names = {n.strip().lower() for n in self.allowed_hosts.split(",") if n.strip()}
        public = urlsplit(self.public_url).hostname
        return frozenset(names | ({public.lower()} if public else set()))

    def host_allowed(self, host_header: str) -> bool:
        """Whether a request's ``Host`` header names this service: a loopback name or address,
        public_url's host, or one of ``allowed_hosts``. Any other name may be an attacker's
        that resolves here (DNS rebinding)."""
        if "*" in self.allowed_host_names:
            return True
        if any(c in host_header for c in "@/\\?#"):  # a name and a port, nothing else
            return False
        try:
            host = urlsplit(f"//{host_header.strip()}").hostname
        except ValueError:  # e.g. an unclosed "[" bracket
            return False
        if not host:
            return False
        return is_loopback_host(host) or host in self.allowed_host_names

    @cached_property
    def is_sqlite(self) -> bool:
        """Whether the configured database is the embedded SQLite default."""
        return self.database_url.startswith("sqlite")

    # --- alerts (service.alerting) ------------------------------------------------------------
    stalled_after_s: float = Field(
        default=900.0, gt=0, description="A running run silent this long raises 'stalled'."
    )
    client_gone_after_s: float = Field(
        default=240.0, gt=0,
        description="A running run whose client sent no points and made no request (it sends "
        "a heartbeat every minute) for this long is marked 'lost', within a minute (checked "
        "every min(60 s, this / 4)); it is running again once its client is heard from "
        "(worker/liveness).",
    )
    alert_eval_lease_s: float = Field(
        default=60.0, gt=0, description="How long a worker holds a run while evaluating it."
    )
    alert_eval_min_interval_s: float = Field(
        default=5.0, ge=0,
        description="A run with new points is evaluated at most this often: each round has a "
        "fixed cost (its claim, its state, its open alerts) that a fast run would otherwise pay "
        "every second; the rules judge every new step either way, and their windows span "
        "tens to thousands of steps. Capped at a quarter of stalled_after_s.",
    )
    secret_key: SecretStr | None = Field(
        default=None,
        description="Key that seals webhook secrets at rest (32+ random characters, the same "
        "on every replica). Unset with SQLite: generated into <database>.key; unset with "
        "PostgreSQL: webhooks with a secret are refused.",
    )
    webhook_allow_private: bool = Field(
        default=False,
        description="Let webhooks reach loopback, private, link-local and other non-global "
        "addresses (a receiver on this machine or network). Off: only global addresses, "
        "checked on the address actually connected to.",
    )
    webhook_timeout_s: float = Field(
        default=5.0, gt=0,
        description="Total deadline of one webhook delivery attempt (connect, send, answer's "
        "status and headers), not a per-read timeout.",
    )
    webhook_backoff_base_s: float = Field(
        default=2.0, gt=0, description="First retry delay of a failed delivery (doubles)."
    )
    webhook_backoff_max_s: float = Field(
        default=600.0, gt=0, description="Longest delay between delivery attempts."
    )
    webhook_give_up_after_s: float = Field(
        default=86_400.0, gt=0, description="Mark a delivery failed once it is this old."
    )
