"""What every benchmark's command line shares: its parser (description from the module's
docstring, ``--no-write``, and ``--quick`` where the bench has a smoke size) and its closing
lines (print the section, write it into BENCHMARKS.md unless told not to)."""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from bench import _registry
from bench._report import paired_summary, revision_line, write_section


def parser(doc: str | None, quick: str | None = None,
           writes_to: str = "BENCHMARKS.md") -> argparse.ArgumentParser:
    """A bench's argument parser.

    Args:
        doc: the module's docstring; its first line is the description.
        quick: what ``--quick`` does, for a bench with a smoke size (a quick run never writes
            BENCHMARKS.md); None for a bench without one.
        writes_to: what ``--no-write`` leaves alone, for its help.
    """
    first = (doc or "").strip().splitlines()
    bench = _registry.of_path(Path(sys.argv[0]))
    made = argparse.ArgumentParser(prog=f"python -m bench run {bench.name}" if bench else None,
                                   description=first[0] if first else None)
    made.add_argument("--no-write", action="store_true",
                      help=f"print the results; leave {writes_to} as it is")
    if quick is not None:
        made.add_argument("--quick", action="store_true",
                          help=f"{quick} (a smoke run: prints, writes nothing)")
    return made


def writes(args: argparse.Namespace) -> bool:
    """Whether this run writes BENCHMARKS.md: not under ``--no-write`` nor ``--quick``."""
    return not (getattr(args, "no_write", False) or getattr(args, "quick", False))


def publish(args: argparse.Namespace, name: str, title: str, body: str, result: str,
            details: str = "") -> int:
    """Print a section and write it into BENCHMARKS.md when :func:`writes` says so; returns
    the exit status (0), so a bench's ``main`` can end with ``return publish(...)``.

    Args:
        args: the parsed arguments (``--no-write``, ``--quick``).
        name: the section's identifier (``<!-- bench:NAME -->``).
        title: its heading: what is measured.
        body: its main table(s) and a few lines of method.
        result: its headline, one line: the ratio against the baseline or the goal's verdict.
        details: secondary tables (breakdowns, candidates tried), printed but not written:
            BENCHMARKS.md keeps each bench's main table.
    """
    print(f"Result: {result}\n\n{body}" + (f"\n\n{details}" if details else ""))
    if writes(args):
        write_section(name, title, body, result)
    return 0


def revision_parser(doc: str | None, rounds: int) -> argparse.ArgumentParser:
    """The parser of a bench that pairs this checkout with a git revision, round by round:
    :func:`parser`'s, with ``--base REV`` and ``--rounds N`` (each round followed by an A/A
    round, this checkout against itself: the spread the bench reads when nothing changed)."""
    made = parser(doc)
    made.add_argument("--base", default="HEAD", help="the revision to compare with (HEAD)")
    made.add_argument("--rounds", type=int, default=rounds,
                      help=f"rounds, each followed by an A/A round ({rounds})")
    made.add_argument("--write", action="store_true",
                      help="also write the section into BENCHMARKS.md (by default it is "
                           "printed: a comparison with one revision is evidence for that "
                           "change, for its commit message)")
    return made


def base_revision(cli: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """``<short hash> <subject>`` of ``--base``; a usage error when it is not a revision of
    this repository or ``--rounds`` is below 1."""
    if args.rounds < 1:
        cli.error(f"--rounds must be 1 or more, got {args.rounds}")
    line = revision_line(args.base)
    if line is None:
        cli.error(f"--base {args.base!r} is not a revision of this repository")
    return line


def publish_paired(args: argparse.Namespace, name: str, title: str, method: str,
                   rounds: str, ratios: dict[str, list[float]], what: str) -> int:
    """Close a revision-paired bench: print its rounds' table and its method with the median
    ratios (this checkout over the revision, and A/A); written as a section only with
    ``--write``.

    Args:
        rounds: the Markdown table of the rounds (printed, not written).
        ratios: ``"revision"`` and ``"A/A"``: the ratio of each round.
        what: what the ratio is of, for the result line (``"`log()`'s CPU"``).
    """
    print(rounds)
    if not getattr(args, "write", False):
        args.no_write = True
    result = (f"{what} {statistics.median(ratios['revision']):.3f}× the revision's "
              f"(A/A {statistics.median(ratios['A/A']):.3f}×)")
    return publish(args, name, title, method + "\n\n" + paired_summary(ratios), result)
