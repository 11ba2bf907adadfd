"""The benchmarks, found by looking: every public module of an area (a public subpackage of
``bench``, such as ``bench/service``) is one, named by its module name.

Nothing lists them by hand: a module dropped into an area is a benchmark. Its docstring's first
line is its one-line description, and it defines ``main(argv: list[str] | None) -> int``.
Names are unique across areas, so ``python -m bench run ingest`` needs no area. Docstrings are
read from the source (:mod:`ast`), so listing imports nothing heavy (torch, the service).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from bench._paths import REPO

#: The folder whose public subpackages are the areas.
ROOT = REPO / "bench"


@dataclass(frozen=True)
class Bench:
    """One benchmark module."""

    name: str  #: the module's name, what ``python -m bench run`` takes (``"ingest"``)
    area: str  #: its subpackage (``"service"``)
    path: Path
    summary: str  #: the first line of its docstring

    @property
    def module(self) -> str:
        """Its import path (``"bench.service.ingest"``)."""
        return f"bench.{self.area}.{self.name}"


def first_line(path: Path) -> str:
    """The first line of a module's (or package's ``__init__``'s) docstring, "" without one."""
    doc = ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""
    # reStructuredText's ``literal`` reads as Markdown's `literal` in a terminal.
    return doc.strip().splitlines()[0].strip().replace("``", "`") if doc.strip() else ""


def areas() -> list[tuple[str, str]]:
    """``(area, summary)`` of every area, by name: the public subpackages of ``bench``."""
    return [(d.name, first_line(d / "__init__.py")) for d in sorted(ROOT.iterdir())
            if d.is_dir() and not d.name.startswith(("_", ".")) and (d / "__init__.py").exists()]


def benches() -> list[Bench]:
    """Every benchmark, by area then name."""
    return [Bench(f.stem, area, f, first_line(f))
            for area, _ in areas()
            for f in sorted((ROOT / area).glob("*.py")) if not f.stem.startswith("_")]


def find(name: str) -> Bench:
    """The benchmark called ``name`` (also ``area/name``, ``area.name`` or its module path).

    Raises:
        KeyError: no benchmark has that name; the message lists the near ones.
    """
    key = name.removeprefix("bench.").replace("/", ".").removesuffix(".py")
    found = [b for b in benches() if key in (b.name, f"{b.area}.{b.name}")]
    if len(found) == 1:
        return found[0]
    if found:
        raise KeyError(f"{name!r} names several benchmarks: "
                       + ", ".join(f"{b.area}/{b.name}" for b in found))
    near = [b.name for b in benches() if key.split(".")[-1] in b.name]
    near = near or [b.name for b in benches()]
    raise KeyError(f"no benchmark {name!r}; try: {', '.join(near)} (`python -m bench list`)")


def of_path(path: Path) -> Bench | None:
    """The benchmark whose module is the file ``path``, if any."""
    path = path.resolve()
    return next((b for b in benches() if b.path.resolve() == path), None)
