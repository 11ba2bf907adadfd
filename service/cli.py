"""The ``curvecast`` command: serve, worker, migrate, token, forecast, rank, import, demo and
sync.

``sync`` is the client's (:mod:`curvecast.client.sync`) and needs only the standard library; every
other command needs the ``[server]`` extra. On a client-only install (a training machine) the
command still parses, and a server command says which packages are missing and how to install
them instead of failing with an ``ImportError``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from curvecast.client.sync import add_sync_parser

# Every import of the server's dependencies happens inside the command that needs it, so that
# `curvecast sync` works on a training machine with only the standard-library client installed.
if TYPE_CHECKING:
    from curvecast.service.config import Settings

#: Top-level modules of the ``[server]`` extra's packages (see pyproject.toml).
SERVER_MODULES = (
    "fastapi",
    "uvicorn",
    # uvicorn's C HTTP parser: the request-head limits are built on it (service/http_guard.py).
    "httptools",
    "sqlalchemy",
    "alembic",
    "psycopg",
    "pydantic",
    "pydantic_settings",
    "scipy",
    "numpy",
    "pandas",
    "plotly",
    "jinja2",
    "fastapi_offline",
    "cryptography",
    "prometheus_client",
    "filelock",
)
#: Packages of the ``[server]`` extra that uvicorn uses when they are there (its C event loop)
#: and does without when they are not (uvloop has no Windows build): not required.
SERVER_SPEEDUPS = ("uvloop",)
#: Commands that run without the ``[server]`` extra.
CLIENT_COMMANDS = frozenset({"sync"})


def missing_server_modules() -> list[str]:
    """The ``[server]`` extra's modules this interpreter cannot import (empty when installed)."""
    return [name for name in SERVER_MODULES if importlib.util.find_spec(name) is None]


def _settings(args: argparse.Namespace) -> Settings:
    from curvecast.service.config import Settings

    url = getattr(args, "database_url", None)
    return Settings(database_url=url) if url else Settings()


def _add_db_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url",
        help="SQLAlchemy URL or SQLite file path (default: $CURVECAST_DATABASE_URL, "
        "else ./curvecast.db)",
    )


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the API server with uvicorn."""
    import uvicorn

    from curvecast.service.app import prepare_database
    from curvecast.service.config import Settings, is_loopback_host
    from curvecast.service.errors import SchemaOutOfDate
    from curvecast.service.http_guard import protocol_for

    if args.database_url:
        os.environ["CURVECAST_DATABASE_URL"] = args.database_url
    settings = Settings()
    if not settings.auth_enabled and not is_loopback_host(args.host):
        print(
            f"curvecast: refusing to serve on {args.host} with authentication off.\n"
            "  Anyone who can reach that address could read and write every run. Either bind to\n"
            "  127.0.0.1, or turn auth on: create a token with\n"
            "    curvecast token create --project NAME --scope admin\n"
            "  and start with CURVECAST_AUTH_ENABLED=true.",
            file=sys.stderr,
        )
        return 2
    try:
        prepare_database(settings)
    except SchemaOutOfDate as exc:
        print(f"curvecast: {exc.message}", file=sys.stderr)
        return 2
    host = f"[{args.host}]" if ":" in args.host else args.host
    _default_public_url(settings, host, args.port)
    metrics_dir = _shared_metrics_dir() if args.workers > 1 else None
    worker = None
    if args.workers > 1 and settings.worker_enabled:
        # One background worker for all serve processes, in a process of its own
        # (service/worker/process.py says why); the serve processes read this variable.
        from curvecast.service.worker.process import WorkerProcess

        worker = WorkerProcess(os.environ)
        os.environ["CURVECAST_WORKER_ENABLED"] = "false"
    layout = ("" if args.workers == 1 else f"{args.workers} processes, "
              + ("background worker in its own process, " if worker else "no worker, "))
    print(
        f"curvecast {'(auth on) ' if settings.auth_enabled else ''}serving at "
        f"http://{host}:{args.port}  ({layout}database: {_redact(settings.database_url)})",
        flush=True,
    )
    if worker is not None:
        worker.start()
    try:
        uvicorn.run(
            "curvecast.service.app:create_app",
            factory=True,
            host=args.host,
            port=args.port,
            workers=args.workers,
            log_level=args.log_level,
            access_log=args.access_log,
            # Request-head size, header lines, head timeout and connection limits, enforced
            # before the app sees a request (CURVECAST_MAX_HEADER_BYTES, ...).
            http=protocol_for(settings),
        )
    finally:
        if worker is not None:
            worker.stop()
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


def _shared_metrics_dir() -> str | None:
    """With several processes, where each writes its Prometheus values, so that /metrics adds
    them up whichever process answers (service/prometheus.py). A fresh directory, set in the
    environment before the processes start, removed by the caller at the end; None when the
    operator set ``PROMETHEUS_MULTIPROC_DIR`` (theirs is used, and left alone)."""
    import tempfile

    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return None
    path = tempfile.mkdtemp(prefix="curvecast-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    return path


#: Hosts that mean "every interface": not an address to put in a link.
_WILDCARD_HOSTS = frozenset({"0.0.0.0", "[::]", ""})


def _default_public_url(settings: Settings, host: str, port: int) -> None:
    """Without ``CURVECAST_PUBLIC_URL``, links (alert notifications' dashboard links) name the
    address this server listens on, not the default port 8000: ``serve --port 8010`` sent
    on-call people to ``http://127.0.0.1:8000/runs/...``. Set in the environment, so that the
    serve processes and the background worker process (which sends the notifications) read it.
    A wildcard host has no address to name: loopback with the port, and a warning."""
    if "public_url" in settings.model_fields_set:
        return
    wildcard = host in _WILDCARD_HOSTS
    os.environ["CURVECAST_PUBLIC_URL"] = f"http://{'127.0.0.1' if wildcard else host}:{port}"
    if wildcard:
        print(f"curvecast: links in alert notifications point at "
              f"{os.environ['CURVECAST_PUBLIC_URL']}; set CURVECAST_PUBLIC_URL to the address "
              "people use to reach this server", file=sys.stderr)


def cmd_worker(args: argparse.Namespace) -> int:
    """Run the background worker alone, until SIGTERM or Ctrl-C.

    For deployments that keep it out of the request-serving processes (their
    ``CURVECAST_WORKER_ENABLED=false``): the worker's refits and alert rounds then no longer share
    a GIL with requests. Several may run at once; their leases keep them apart.
    """
    import signal
    import threading

    from curvecast.service.app import freeze_startup_heap, make_worker, prepare_database
    from curvecast.service.db import make_engine, make_sessionmaker
    from curvecast.service.errors import SchemaOutOfDate

    settings = _settings(args)
    try:
        prepare_database(settings)
    except SchemaOutOfDate as exc:
        print(f"curvecast: {exc.message}", file=sys.stderr)
        return 2
    engine = make_engine(settings)
    worker = make_worker(make_sessionmaker(engine), settings)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    freeze_startup_heap()
    worker.start()
    print(f"curvecast worker running (database: {_redact(settings.database_url)}); "
          "SIGTERM or Ctrl-C stops it", flush=True)
    try:
        while not stop.wait(1.0):
            if args.parent_pid and os.getppid() != args.parent_pid:
                print("curvecast worker: the serve process that started it is gone; stopping",
                      flush=True)
                break
    finally:
        # Each task finishes its round; a lease it held runs out on its own if this is cut short.
        worker.stop()
        engine.dispose()
    print("curvecast worker stopped", flush=True)
    return 0


def _redact(url: str) -> str:
    """Hide a password in a database URL before printing it."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def cmd_migrate(args: argparse.Namespace) -> int:
    """Upgrade (or downgrade) the database schema."""
    from curvecast.service import migrate

    settings = _settings(args)
    target = _redact(settings.database_url)
    if args.downgrade:
        print(f"downgrading {target} to {args.downgrade} ...", flush=True)
        migrate.downgrade(settings.database_url, args.downgrade)
        print(f"downgraded {target} to {args.downgrade}")
    else:
        print(f"migrating {target} to revision {args.revision}", flush=True)
        # One line per revision as it starts and ends: on a large database a revision can take
        # minutes, and the line says which one is running.
        migrate.upgrade(
            settings.database_url, args.revision, progress=lambda line: print(line, flush=True)
        )
        print(f"{target} is at revision {args.revision}")
        sealed = _seal_plaintext_secrets(settings)
        if sealed:
            print(f"sealed {sealed} webhook secret(s) and token-bearing URL(s) stored in clear "
                  "by an older version")
    return 0


def _seal_plaintext_secrets(settings: Settings) -> int:
    """Seal the webhook secrets and token-bearing URLs an older version stored in clear (none
    without a key: they keep working in clear until one is configured and this runs again)."""
    from curvecast.service.db import make_engine, make_sessionmaker, session_scope
    from curvecast.service.secrets import SecretUnavailable, box_for
    from curvecast.service.store.webhooks import seal_plaintext_secrets

    box = box_for(settings)
    engine = make_engine(settings)
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            return seal_plaintext_secrets(session, seal=box.seal)
    except SecretUnavailable as exc:
        print(f"warning: {exc.message}", flush=True)
        return 0
    finally:
        engine.dispose()


def cmd_token(args: argparse.Namespace) -> int:
    """Create, list or revoke API tokens."""
    from curvecast.service.db import make_engine, make_sessionmaker, session_scope
    from curvecast.service.errors import ServiceError
    from curvecast.service.migrate import check_schema
    from curvecast.service.store import tokens

    settings = _settings(args)
    engine = make_engine(settings)
    try:
        check_schema(engine)
        with session_scope(make_sessionmaker(engine)) as session:
            if args.token_command == "create":
                created = tokens.create_token(
                    session, project=args.project, scope=args.scope, name=args.name or args.scope
                )
                print(created.token)
                print(
                    f"token {created.id} for project {created.project!r} with scope "
                    f"{created.scope!r}. It is shown only now: store it somewhere safe.",
                    file=sys.stderr,
                )
            elif args.token_command == "list":
                for info in tokens.list_tokens(session, project=args.project):
                    state = f"revoked {info.revoked_at:%Y-%m-%d}" if info.revoked_at else "active"
                    print(f"{info.id}\t{info.project}\t{info.scope}\tcc_{info.prefix}_…\t{state}")
            else:
                tokens.revoke_token(session, token_id=args.id)
                print(f"token {args.id} revoked")
    except ServiceError as exc:
        print(f"curvecast: {exc.message}", file=sys.stderr)
        return 2
    finally:
        engine.dispose()
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``curvecast`` command."""
    parser = argparse.ArgumentParser(
        prog="curvecast", description="Watch and forecast neural-network training runs."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve", help="run the API server",
        description="Serve the REST API and the dashboards, with the background worker "
        "(refits, alerts, webhooks) in the same process. A SQLite database is brought up to "
        "date first; a PostgreSQL one must be ('curvecast migrate'). Settings not given here "
        "come from CURVECAST_* environment variables (docs/deployment.md).")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1; 0.0.0.0: every interface)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument("--workers", type=int, default=1,
                       help="serve processes; with more than one, the background worker runs "
                       "once, in a process of its own")
    serve.add_argument("--log-level", default="info",
                       help="uvicorn's log level: critical, error, warning, info (default), "
                       "debug, trace")
    serve.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=False,
                       help="log every request (default: off)")
    _add_db_option(serve)
    serve.set_defaults(func=cmd_serve)

    work = sub.add_parser(
        "worker", help="run the background worker alone (refits, alerts, webhooks, liveness, "
        "retention); for serve processes started with CURVECAST_WORKER_ENABLED=false")
    _add_db_option(work)
    # Set by `serve --workers N` for the worker process it starts: stop once that parent is gone.
    work.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)
    work.set_defaults(func=cmd_worker)

    mig = sub.add_parser("migrate", help="upgrade the database schema")
    mig.add_argument("--revision", default="head",
                     help="the schema revision to upgrade to (default: head, the newest)")
    mig.add_argument("--downgrade", metavar="REVISION", help="downgrade to REVISION ('base')")
    _add_db_option(mig)
    mig.set_defaults(func=cmd_migrate)

    token = sub.add_parser("token", help="manage API tokens")
    token_sub = token.add_subparsers(dest="token_command", required=True)
    create = token_sub.add_parser("create", help="create a token (printed once)")
    create.add_argument("--project", required=True,
                        help="the one project the token opens (created if missing)")
    create.add_argument("--scope", required=True, choices=["read", "ingest", "admin"],
                        help="read: the project's runs, forecasts and alerts; ingest: also "
                        "create runs, send points, acknowledge and silence alerts; admin: also "
                        "delete runs, set alert rules and webhooks")
    create.add_argument("--name", help="a label to recognise it by in 'token list'")
    _add_db_option(create)
    listing = token_sub.add_parser("list", help="list tokens")
    listing.add_argument("--project", help="only this project's tokens")
    _add_db_option(listing)
    revoke = token_sub.add_parser("revoke", help="revoke a token")
    revoke.add_argument("id", type=int, help="the token's id (from 'token list')")
    _add_db_option(revoke)
    token.set_defaults(func=cmd_token)

    if missing_server_modules():
        # Parse anything after these names: running them only prints how to install the extra.
        for name, help_text in (("forecast", "fit a loss curve from a file"),
                                ("demo", "serve and train a real model, forecasting live"),
                                ("import", "import runs from TensorBoard, MLflow or W&B"),
                                ("rank", "rank a project's runs: which ends best")):
            sub.add_parser(name, help=f"{help_text} (needs curvecast[server])").add_argument(
                "args", nargs=argparse.REMAINDER
            )
    else:
        from curvecast.service.demo import add_demo_parser
        from curvecast.service.forecast.cli import add_forecast_parser
        from curvecast.service.import_cli import add_import_parser
        from curvecast.service.rank_cli import add_rank_parser

        add_forecast_parser(sub)
        add_demo_parser(sub)
        add_import_parser(sub)
        add_rank_parser(sub)
    add_sync_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``curvecast`` console script."""
    args = build_parser().parse_args(argv)
    if args.command not in CLIENT_COMMANDS and (missing := missing_server_modules()):
        print(
            f"curvecast {args.command}: needs the packages of the [server] extra, which are not "
            f"installed here (missing: {', '.join(missing)}).\n"
            "  Install them with:  pip install 'curvecast[server]'",
            file=sys.stderr,
        )
        return 2
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
