"""The benchmarks' one command line.

    python -m bench list                  # every benchmark, by area, with what it measures
    python -m bench run NAME [ARGS...]    # run one; ARGS go to it (NAME --help lists them)

A benchmark is any public module of an area (``bench/<area>/<name>.py``); see
:mod:`bench._registry`. It writes its section of BENCHMARKS.md unless given ``--no-write``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from bench import _registry


def list_benches() -> str:
    """The benchmarks by area, each with its one-line description."""
    by_area: dict[str, list[_registry.Bench]] = {}
    for bench in _registry.benches():
        by_area.setdefault(bench.area, []).append(bench)
    width = max(len(b.name) for b in _registry.benches())
    lines = []
    for area, summary in _registry.areas():
        lines.append(f"{area}/  {summary}")
        lines += [f"  {b.name:<{width}}  {b.summary}" for b in by_area.get(area, [])]
    lines.append("\nRun one: python -m bench run NAME [ARGS...]  (NAME --help: its options)")
    return "\n".join(lines)


def run(bench: _registry.Bench, args: list[str]) -> int:
    """Run ``bench`` with ``args`` as its command line; its exit status."""
    module = importlib.import_module(bench.module)
    # As `python -m bench.<area>.<name> ARGS` would see it: the section's command line and any
    # code reading sys.argv name this bench.
    sys.argv = [str(Path(bench.path)), *args]
    status = module.main(args)
    return int(status or 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description="List or run the benchmarks (BENCHMARKS.md).")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="every benchmark, with what it measures")
    one = commands.add_parser("run", help="run one benchmark", add_help=False,
                              usage="python -m bench run NAME [ARGS...]")
    one.add_argument("name", help="the benchmark (python -m bench list)")
    one.add_argument("args", nargs=argparse.REMAINDER, help="its own arguments")
    args = parser.parse_args(argv)
    if args.command == "list":
        print(list_benches())
        return 0
    try:
        bench = _registry.find(args.name)
    except KeyError as err:
        parser.error(str(err.args[0]))
    return run(bench, args.args)


if __name__ == "__main__":
    sys.exit(main())
