"""``curvecast rank PROJECT``: the project's runs at a common step, most likely best first.

Prints the answer of ``GET /api/v1/projects/{project}/ranking`` as a table: read from a
service (``--url``, with ``--token``) or straight from the database (``--database-url``, as
``curvecast migrate`` and ``token`` do). Both build the answer with
:func:`~curvecast.service.forecast.decision_answers.ranking_answer`; docs/decisions.md says
what the numbers mean.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request

from curvecast.dashboards.fmt import chance
from curvecast.service.schemas.decisions import RankedRunOut, RankingOut

__all__ = ["add_rank_parser", "format_ranking", "run_rank"]

_SOURCES = {
    "given": "as asked",
    "planned_total_steps": "the largest planned total_steps",
    "last_step": "the largest last step: no run plans total_steps",
    "none": "no step to compare at",
}


def _pct(p: float | None) -> str:
    return "-" if p is None else chance(p)


def _loss(run: RankedRunOut) -> str:
    f = run.forecast
    if f is None:
        return "-"
    if f.observed:
        return f"{f.value:.4g} (observed)"
    return f"{f.value:.4g} [{f.lo:.4g}, {f.hi:.4g}]"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def format_ranking(answer: RankingOut) -> str:
    """The ranking as a text table: rank, run, status, P(best), loss at the horizon with its
    interval (or observed), and the reason or note."""
    series = answer.key or "default (each run's)"
    head = f"project {answer.project}, series {series}"
    if answer.horizon is not None:
        head += (f": compared at step {answer.horizon:,} ({_SOURCES[answer.horizon_source]}); "
                 f"{round(100 * answer.confidence)}% intervals")
    lines = [head]
    if answer.message:
        lines.append(answer.message)
    if not answer.runs:
        return "\n".join(lines)
    rows = [("#", "run", "status", "P(best)", "loss at horizon", "why / note")]
    place = 0
    for run in answer.runs:
        place += run.p_best is not None
        rows.append((str(place) if run.p_best is not None else "-", _clip(run.name, 32),
                     run.status, _pct(run.p_best), _loss(run), run.reason or run.note))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines.append("")
    for row in rows:
        cells = [row[0].rjust(widths[0]), row[1].ljust(widths[1]), row[2].ljust(widths[2]),
                 row[3].rjust(widths[3]), row[4].ljust(widths[4]), row[5]]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _from_service(url: str, args: argparse.Namespace) -> RankingOut:
    query = {k: v for k, v in (("key", args.key), ("horizon", args.horizon),
                                ("confidence", args.confidence)) if v is not None}
    address = (f"{url.rstrip('/')}/api/v1/projects/{urllib.parse.quote(args.project, safe='')}"
               f"/ranking?{urllib.parse.urlencode(query)}")
    headers = {"Accept": "application/json"}
    token = args.token or os.environ.get("CURVECAST_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(address, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=args.timeout) as response:
            return RankingOut.model_validate_json(response.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("message") or exc.reason
        except ValueError:
            message = exc.reason
        raise _Refused(f"{url} answered {exc.code}: {message}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise _Refused(f"cannot reach {url}: {getattr(exc, 'reason', exc)}") from None


def _from_database(args: argparse.Namespace) -> RankingOut:
    from curvecast.service.config import Settings
    from curvecast.service.db import make_engine, make_sessionmaker, session_scope
    from curvecast.service.errors import ServiceError
    from curvecast.service.forecast.decision_answers import ranking_answer
    from curvecast.service.store import decisions

    settings = Settings(database_url=args.database_url) if args.database_url else Settings()
    engine = make_engine(settings)
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            runs = decisions.project_runs(session, project=args.project, allowed_project=None,
                                          key=args.key)
            return ranking_answer(args.project, runs, key=args.key, horizon=args.horizon,
                                  confidence=args.confidence or 0.9)
    except ServiceError as exc:
        raise _Refused(exc.message) from None
    finally:
        engine.dispose()


class _Refused(Exception):
    """The ranking could not be read; the message says why."""


def run_rank(args: argparse.Namespace) -> int:
    """``curvecast rank``: print the ranking (``--json``: the API's JSON)."""
    if args.horizon is not None and args.horizon < 1:
        print("curvecast rank: --horizon must be a step of 1 or more", file=sys.stderr)
        return 2
    if args.confidence is not None and not 0.5 < args.confidence < 1.0:
        print("curvecast rank: --confidence must be between 0.5 and 1 (e.g. 0.9)",
              file=sys.stderr)
        return 2
    try:
        answer = _from_service(args.url, args) if args.url else _from_database(args)
    except _Refused as exc:
        print(f"curvecast rank: {exc}", file=sys.stderr)
        return 2
    print(answer.model_dump_json(indent=2) if args.json else format_ranking(answer))
    return 0


def add_rank_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``rank`` on the ``curvecast`` command's subparsers."""
    parser = subparsers.add_parser(
        "rank", help="rank a project's runs: which ends best, with P(best)",
        description="The project's runs at a common step (default: the largest planned "
        "total_steps), most likely best first, with each one's chance of the lowest loss and "
        "its forecast there; runs the forecast cannot judge last, with the reason "
        "(docs/decisions.md).")
    parser.add_argument("project", help="the project")
    parser.add_argument("--key", help="the series to compare (default: each run's default "
                        "loss series)")
    parser.add_argument("--horizon", type=int, help="the step to compare at")
    parser.add_argument("--confidence", type=float, help="interval coverage (default 0.9)")
    parser.add_argument("--url", help="read from this service (default: read the database)")
    parser.add_argument("--token", help="bearer token for --url (default: $CURVECAST_TOKEN)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds for --url")
    parser.add_argument("--database-url", help="SQLAlchemy URL or SQLite file path (default: "
                        "$CURVECAST_DATABASE_URL, else ./curvecast.db)")
    parser.add_argument("--json", action="store_true", help="print the API's JSON answer")
    parser.set_defaults(func=run_rank)
