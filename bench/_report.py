"""Write one benchmark's section of BENCHMARKS.md without touching the others.

Every benchmark owns a block delimited by ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``:
its title, a one-line result (the headline, a ratio against the baseline measured in the same
run where there is one), the command and the machine, then its tables and a few lines of method.
Re-running a benchmark replaces its block in place, and the summary table at the top of the file
is rebuilt from every block's title, result and command, so the file can be rebuilt piecemeal.
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

from bench import _registry
from bench._paths import BENCHMARKS_MD

_HEADER = (
    "# Benchmarks\n\n"
    "Each section below was written by the command it names (`python -m bench list` shows them\n"
    "all), on the machine it names; its result is a ratio against a baseline measured in the\n"
    "same run wherever there is one.\n"
)
_SUMMARY = re.compile(r"<!-- bench-summary -->.*?<!-- /bench-summary -->", re.S)
_BLOCK = re.compile(r"<!-- bench:([\w.-]+) -->\n## (.*?)\n.*?<!-- /bench:\1 -->", re.S)


def machine_line() -> str:
    """A one-line description of where the numbers were measured."""
    import os

    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores, "
        f"Python {platform.python_version()}, measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    )


def command_line() -> str:
    """The command that produced this run, as a user would type it (the runner's form,
    ``python -m bench run NAME ARGS``, whichever way the bench was started)."""
    bench = _registry.of_path(Path(sys.argv[0]))
    if bench is not None:
        return " ".join(["python -m bench run", bench.name, *map(shlex.quote, sys.argv[1:])])
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


def write_section(name: str, title: str, body: str, result: str,
                  path: Path = BENCHMARKS_MD) -> None:
    """Replace (or append) the block for benchmark ``name`` in BENCHMARKS.md, and rebuild the
    summary table.

    Args:
        name: the section's stable identifier, e.g. ``"optimizer"``.
        title: the section heading (without the leading ``##``): what is measured.
        body: Markdown for the section: tables and a few lines of method. The result, command
            and machine are added here.
        result: the headline, one line: the ratio against the baseline (or the goal's verdict).
    """
    text = path.read_text() if path.exists() else _HEADER
    block = render_block(name, title, result, command_line(), machine_line(), body)
    pattern = re.compile(
        rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->", re.S
    )
    if pattern.search(text):
        text = pattern.sub(lambda _m: block, text)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(with_summary(text))


def render_block(name: str, title: str, result: str, command: str, machine: str,
                 body: str) -> str:
    """One section as BENCHMARKS.md holds it: its markers, heading, result, command and
    machine, then its body (prose paragraphs on one line each: see :func:`unwrap`)."""
    return (f"<!-- bench:{name} -->\n## {title}\n"
            f"Result: {' '.join(result.split())}  \n"
            f"Command: `{command}` · Machine: {machine}\n\n"
            f"{unwrap(body)}\n<!-- /bench:{name} -->")


def unwrap(body: str) -> str:
    """``body`` with each prose paragraph on one line (writers wrap their source text; the
    file need not): tables, lists and headings are left as they are."""
    def keep(line: str) -> bool:
        return line.lstrip().startswith(("|", "- ", "* ", "#"))

    paragraphs = re.split(r"\n\s*\n", body.strip())
    return "\n\n".join(p if any(keep(line) for line in p.splitlines())
                        else " ".join(line.strip() for line in p.splitlines())
                        for p in paragraphs)


def anchor(title: str) -> str:
    """The link target GitHub gives a heading (lower case, punctuation dropped, spaces to -)."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def with_summary(text: str) -> str:
    """``text`` with its summary table rebuilt from its sections (one row per section: its
    title, result and command), before the first section."""
    rows = []
    for m in _BLOCK.finditer(text):
        block = m.group(0)
        result = re.search(r"^Result: (.*?) *$", block, re.M)
        command = re.search(r"^Command: `(.*?)`", block, re.M)
        title = m.group(2).strip()
        rows.append([f"[{title}](#{anchor(title)})", result.group(1) if result else "",
                     f"`{command.group(1)}`" if command else ""])
    rows = [[str(cell).replace("|", "\\|") for cell in row] for row in rows]
    table = ("<!-- bench-summary -->\n"
             + markdown_table(["what is measured", "result (against the baseline)", "command"],
                              rows)
             + "\n<!-- /bench-summary -->")
    if _SUMMARY.search(text):
        return _SUMMARY.sub(lambda _m: table, text)
    first = text.find("<!-- bench:")
    if first < 0:
        return text.rstrip() + "\n\n" + table + "\n"
    return text[:first] + table + "\n\n" + text[first:]


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
