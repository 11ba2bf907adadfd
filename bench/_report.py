"""Write one benchmark's section of BENCHMARKS.md without touching the others.

Every benchmark owns a block delimited by ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``.
Re-running a benchmark replaces its block in place, so the file can be rebuilt piecemeal.
"""

from __future__ import annotations

import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

BENCHMARKS_MD = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"
_HEADER = (
    "# Benchmarks\n\n"
    "Every table below was written by the command shown above it; each reports a ratio against a\n"
    "baseline measured in the same run. Numbers come from the machine named in each section.\n"
)


def machine_line() -> str:
    """A one-line description of where the numbers were measured."""
    import os

    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores, "
        f"Python {platform.python_version()}, measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    )


def command_line() -> str:
    """The command that produced this run, as a user would type it."""
    script = Path(sys.argv[0]).resolve()
    repo = BENCHMARKS_MD.parent
    if script.suffix == ".py" and script.is_relative_to(repo):
        module = ".".join(script.relative_to(repo).with_suffix("").parts)
        return "python -m " + " ".join([module, *map(shlex.quote, sys.argv[1:])])
    return " ".join(map(shlex.quote, sys.argv))


def checkout_commit(checkout: Path) -> str:
    """``<short hash> <subject>`` of a baseline checkout's commit (its path where git cannot
    tell), to name the baseline a section compares with."""
    top = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--show-toplevel"],
                         capture_output=True, text=True, check=False).stdout.strip()
    if not top or Path(top).resolve() != checkout.resolve():
        # Not a checkout of its own (files copied into a folder of another repository, whose
        # commit says nothing about them): its path.
        return str(checkout)
    out = subprocess.run(["git", "-C", str(checkout), "log", "-1", "--format=%h %s"],
                         capture_output=True, text=True, check=False).stdout.strip()
    return out[:90] if out else str(checkout)


def revision_line(rev: str) -> str | None:
    """``<short hash> <subject>`` of revision ``rev`` of this repository, or None when it is
    not one (for a bench's ``--base``)."""
    found = subprocess.run(["git", "log", "-1", "--format=%h %s", rev, "--"],
                           capture_output=True, text=True, check=False)
    return found.stdout.strip()[:90] if found.returncode == 0 else None


def paired_summary(ratios: dict[str, list[float]]) -> str:
    """The closing line of a paired bench: the median (and range) of this checkout's ratio to
    the revision's, rounds ``"revision"``, beside that of its A/A rounds, ``"A/A"``."""
    def spread(values: list[float]) -> str:
        return f"({min(values):.3f}–{max(values):.3f})"

    base, same = ratios["revision"], ratios["A/A"]
    return (f"Median ratio, this checkout / baseline: **{statistics.median(base):.3f}** "
            f"{spread(base)}; A/A: {statistics.median(same):.3f} {spread(same)}.")


def write_section(name: str, title: str, body: str, path: Path = BENCHMARKS_MD) -> None:
    """Replace (or append) the block for benchmark ``name`` in BENCHMARKS.md.

    Args:
        name: the benchmark's stable identifier, e.g. ``"optimizer"``.
        title: the section heading (without the leading ``##``).
        body: Markdown for the section: tables and notes. The command and machine are added here.
    """
    text = path.read_text() if path.exists() else _HEADER
    block = (
        f"<!-- bench:{name} -->\n## {title}\n\n"
        f"Command: `{command_line()}`  \nMachine: {machine_line()}\n\n{body.strip()}\n"
        f"<!-- /bench:{name} -->"
    )
    pattern = re.compile(
        rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->", re.S
    )
    if pattern.search(text):
        text = pattern.sub(lambda _m: block, text)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    """Render a simple Markdown table."""
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


@contextmanager
def phase(bench: str, what: str, step: int | None = None, of: int | None = None) -> Iterator[None]:
    """Print what a benchmark is doing as it starts a phase, and how long it took at the end.

    Benchmarks run for minutes; these lines (on stderr, flushed, so they show up at once under
    ``make bench`` and in CI logs) say which phase is running and how far along the run is.

    Args:
        bench: the benchmark's name, e.g. ``"load"``.
        what: the phase, e.g. ``"ingesting 10^6 steps"``.
        step: this phase's number (1-based), when the number of phases is known.
        of: the number of phases.
    """
    progress(bench, f"{what} ...", step, of)
    started = time.perf_counter()
    yield
    progress(bench, f"{what}: done in {time.perf_counter() - started:.1f} s", step, of)


def progress(bench: str, what: str, step: int | None = None, of: int | None = None) -> None:
    """One progress line, ``[bench step/of] what``, on stderr (see :func:`phase`)."""
    counter = f" {step}/{of}" if step is not None and of is not None else ""
    print(f"[{bench}{counter}] {what}", file=sys.stderr, flush=True)
