"""``curvecast rank PROJECT``: the project's runs at a common step, most likely best first.

Prints the answer of ``GET /api/v1/projects/{project}/ranking`` as a table: read from a
service (``--url``, with ``--token``) or straight from the database (``--database-url``, as
``curvecast migrate`` and ``token`` do). Both build the answer with
:func:`~curvecast.service.forecast.decision_answers.ranking_answer`; docs/decisions.md says
what the numbers mean. Without a project it lists the projects there are to rank (``GET
/api/v1/projects``), so a first ranking needs no other tool to find the name.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import TypeVar

from pydantic import BaseModel

from curvecast.dashboards.fmt import chance, when
from curvecast.service.schemas import ProjectList
from curvecast.service.schemas.decisions import RankedRunOut, RankingOut

__all__ = ["add_rank_parser", "format_projects", "format_ranking", "run_rank"]

_Answer = TypeVar("_Answer", bound=BaseModel)

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
    return "\n".join([*lines, "", *_table(rows, frozenset({0, 3}))])


def _table(rows: Sequence[Sequence[str]], right: frozenset[int]) -> list[str]:
    """``rows`` as aligned text columns (``right``: the columns aligned right), the last one
    left ragged."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    out = []
    for row in rows:
        cells = [cell.rjust(w) if i in right else cell.ljust(w)
                 for i, (cell, w) in enumerate(zip(row[:-1], widths, strict=True))]
        out.append("  ".join([*cells, row[-1]]).rstrip())
    return out


def format_projects(listing: ProjectList) -> str:
    """The projects as a text table: name, runs, runs by status, firing alerts, last change;
    then how to rank one."""
    if not listing.projects:
        return ("no projects yet: a run's project is the one its Monitor names "
                "(Monitor(project=...)); rank one with: curvecast rank PROJECT")
    rows = [("project", "runs", "by status", "alerts", "last change")]
    for p in listing.projects:
        by_status = ", ".join(f"{n} {status}" for status, n in sorted(p.runs_by_status.items()))
        rows.append((p.name, str(p.runs), by_status or "-", str(p.firing_alerts),
                     when(p.last_update)))
    return "\n".join([*_table(rows, frozenset({1, 3})), "",
                      "rank one with: curvecast rank PROJECT"])


def _get(url: str, path: str, query: dict[str, object], args: argparse.Namespace,
         model: type[_Answer]) -> _Answer:
    """``GET path`` from the service at ``url``, read as ``model``."""
    address = f"{url.rstrip('/')}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    headers = {"Accept": "application/json"}
    token = args.token or os.environ.get("CURVECAST_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(address, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=args.timeout) as response:
            return model.model_validate_json(response.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("message") or exc.reason
        except ValueError:
            message = exc.reason
        raise _Refused(f"{url} answered {exc.code}: {message}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise _Refused(f"cannot reach {url}: {getattr(exc, 'reason', exc)}") from None


def _from_service(url: str, args: argparse.Namespace) -> RankingOut | ProjectList:
    if args.project is None:
        return _get(url, "/api/v1/projects", {}, args, ProjectList)
    query = {k: v for k, v in (("key", args.key), ("horizon", args.horizon),
                                ("confidence", args.confidence)) if v is not None}
    path = f"/api/v1/projects/{urllib.parse.quote(args.project, safe='')}/ranking"
    return _get(url, path, query, args, RankingOut)


def _from_database(args: argparse.Namespace) -> RankingOut | ProjectList:
    from curvecast.service.config import Settings
    from curvecast.service.db import make_engine, make_sessionmaker, session_scope
    from curvecast.service.errors import ServiceError
    from curvecast.service.forecast.decision_answers import ranking_answer
    from curvecast.service.migrate import check_schema
    from curvecast.service.store import decisions, projects

    settings = Settings(database_url=args.database_url) if args.database_url else Settings()
    engine = make_engine(settings)
    try:
        check_schema(engine)  # an empty or older database: say to migrate, not a traceback
        with session_scope(make_sessionmaker(engine)) as session:
            if args.project is None:
                return ProjectList(projects=projects.project_overviews(
                    session, allowed_project=None))
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
    """``curvecast rank``: print the ranking, or without a project the projects (``--json``:
    the API's JSON)."""
    if args.project is None and (given := [f"--{name}" for name in ("key", "horizon", "confidence")
                                           if getattr(args, name) is not None]):
        needs = "needs" if len(given) == 1 else "need"
        print(f"curvecast rank: {', '.join(given)} {needs} a project to rank: name it "
              "(curvecast rank PROJECT ...; without one, the projects are listed)",
              file=sys.stderr)
        return 2
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
    if args.json:
        print(answer.model_dump_json(indent=2))
    else:
        print(format_ranking(answer) if isinstance(answer, RankingOut)
              else format_projects(answer))
    return 0


def add_rank_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``rank`` on the ``curvecast`` command's subparsers."""
    parser = subparsers.add_parser(
        "rank", help="rank a project's runs: which ends best, with P(best)",
        description="The project's runs at a common step (default: the largest planned "
        "total_steps), most likely best first, with each one's chance of the lowest loss and "
        "its forecast there; runs the forecast cannot judge last, with the reason "
        "(docs/decisions.md). Without a project: the projects there are, with their runs.")
    parser.add_argument("project", nargs="?", help="the project (omit it to list the projects)")
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
