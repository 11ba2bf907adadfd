"""The whole client hook of this checkout against a git revision's, in alternating processes.

``client_overhead``'s CPU accounting (:func:`~bench.client._loop.bench_cost`: 2,000
steps of its MLP with ``watch()`` and ``log()`` of 8 metrics, the server up) moves by ±25% from
run to run and by 2-5x with the machine's speed, so a reading taken on one day says little
about a change made on another. Here that accounting runs in pairs of processes, one with the
curvecast package of ``--base`` (the revision's tree, extracted with ``git archive``) and one
with this checkout's, their order alternating from pair to pair, and the ratio is read pair by
pair: the two runs of a pair, a few seconds apart, see nearly the same machine. The bench code
(this module and ``client_overhead``) is this checkout's in both; only the package
differs (what ``import curvecast`` finds first on ``PYTHONPATH``), the server's included. A/A
pairs, this checkout against itself in the same way, show the spread of ratios when nothing
changed, in the same session.

The headline ratio is that of the hook's share of the training step (whole hook µs over the
training thread's own CPU per step outside the hook): when the machine slows between the two
runs of a pair, both slow alike. The ratio of the whole hook's µs is beside it.

Usage: ``python -m bench run hook_paired --base REV [--pairs N] [--aa N] [--steps N] [--no-write]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench._cli import parser, publish
from bench._paths import REPO
from bench._report import markdown_table, phase, progress, revision_line
from bench.client._loop import Cost, bench_cost, median_ci, server

#: The parts of the hook, as ``Cost`` names them, with their names in the section's table.
PARTS = {"log": "`log()`", "watch": "`watch()` hook", "batcher": "batcher thread",
         "sender": "sender thread", "total": "**whole hook**"}


def child(steps: int) -> int:
    """One :func:`bench_cost` run against a server of its own; its ``Cost`` as JSON on stdout."""
    import torch

    # Stopped by the parent (its SIGTERM, or a Ctrl-C it passes on as one): unwind the
    # with-blocks, once, so the server stops and the temporary folder goes; the terminal's
    # Ctrl-C is the parent's to pass on, not a second signal in the middle of the cleanup.
    def stop(*_: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sys.exit(143)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)  # as client_overhead: no OpenMP spinning on 2 shared cores
    with tempfile.TemporaryDirectory() as tmp, server(Path(tmp)) as srv:
        cost = bench_cost(srv.url, Path(tmp) / "spool", steps, True)
    print(json.dumps(dataclasses.asdict(cost)), flush=True)
    return 0


def extract(rev: str, into: Path) -> Path:
    """The tree of ``rev`` under ``into``; returns a folder whose only entry is its package."""
    tree = into / "tree"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", rev],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    if not (tree / "curvecast" / "__init__.py").exists():
        raise SystemExit(f"{rev} has no curvecast/ package folder: the bench needs a revision "
                         "with the namespace layout")
    return package_dir(tree, into / "base-path")


def package_dir(root: Path, where: Path) -> Path:
    """A folder holding only a ``curvecast`` link to ``root``'s package, to put first on
    ``PYTHONPATH`` (the root itself would also shadow this checkout's ``bench``)."""
    where.mkdir()
    (where / "curvecast").symlink_to(root / "curvecast")
    return where


def run_once(path: Path, steps: int, cwd: Path) -> Cost:
    """One child process with ``path``'s package first on ``PYTHONPATH``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(path), str(REPO)])}
    # cwd: a folder of neither package, or ``python -m`` would put this checkout first
    with subprocess.Popen([sys.executable, "-m", "bench", "run", "hook_paired", "--child",
                           "--steps", str(steps)], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:
        try:
            out, err = proc.communicate()
        except BaseException:
            # Stopped (SIGTERM, Ctrl-C): on SIGTERM the child stops its server and removes
            # its temporary folder (database, server log), which subprocess.run's SIGKILL
            # left behind (the server exits by itself once orphaned).
            proc.terminate()
            proc.wait(timeout=60)
            raise
    if proc.returncode != 0:
        raise SystemExit(f"a bench_cost run failed ({path}):\n{err[-3000:]}")
    return Cost(**json.loads(out.strip().splitlines()[-1]))


def share(c: Cost, part: str = "total") -> float:
    """A part of the hook (a ``Cost`` field; default the whole hook) as a share of the run's
    training step."""
    return float(getattr(c, part)) / c.step


def schedule(pairs: int, aa: int) -> list[str]:
    """``"ab"`` and ``"aa"`` pairs spread evenly over the run."""
    slots = [(k / pairs, "ab") for k in range(pairs)] + [((k + 0.5) / aa, "aa") for k in range(aa)]
    return [kind for _, kind in sorted(slots)]


def ratio_cell(values: list[float]) -> str:
    """Median with its ~95% sign-test interval."""
    low, high = median_ci(values)
    return f"{statistics.median(values):.3f} ({low:.3f} … {high:.3f})"


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__)
    cli.add_argument("--base", help="the revision to compare with")
    cli.add_argument("--pairs", type=int, default=12, help="pairs of base and this checkout")
    cli.add_argument("--aa", type=int, default=6, help="A/A pairs (this checkout twice)")
    cli.add_argument("--steps", type=int, default=2000, help="measured steps a run")
    cli.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = cli.parse_args(argv)
    if args.steps < 100:
        cli.error(f"--steps must be 100 or more, got {args.steps}")
    if args.child:
        return child(args.steps)
    if args.base is None:
        cli.error("--base REV is required")
    if args.pairs < 2 or args.aa < 1:
        cli.error(f"--pairs must be 2 or more and --aa 1 or more, got {args.pairs}, {args.aa}")
    base_rev = revision_line(args.base)
    if base_rev is None:
        cli.error(f"--base {args.base!r} is not a revision of this repository")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    ab: list[tuple[Cost, Cost]] = []  # (base, this checkout)
    aa: list[tuple[Cost, Cost]] = []  # (first, second)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        base_path = extract(args.base, tmp)
        head_path = package_dir(REPO, tmp / "head-path")
        cwd = tmp / "cwd"
        cwd.mkdir()
        plan = schedule(args.pairs, args.aa)
        for i, kind in enumerate(plan, start=1):
            with phase("hook_paired", f"{kind} pair", i, len(plan)):
                if kind == "aa":
                    aa.append((run_once(head_path, args.steps, cwd),
                               run_once(head_path, args.steps, cwd)))
                elif len(ab) % 2 == 0:
                    b = run_once(base_path, args.steps, cwd)
                    ab.append((b, run_once(head_path, args.steps, cwd)))
                else:
                    h = run_once(head_path, args.steps, cwd)
                    ab.append((run_once(base_path, args.steps, cwd), h))
            last = ab[-1] if kind == "ab" else aa[-1]
            progress("hook_paired", f"whole hook {last[0].total:.1f} -> {last[1].total:.1f} µs, "
                     f"steps {last[0].step:.0f} / {last[1].step:.0f} µs")

    def part_ratios(pairs: list[tuple[Cost, Cost]], part: str) -> list[float]:
        # Each part as a share of its own run's step, the ratio taken pair by pair.
        return [share(h, part) / share(b, part) for b, h in pairs]

    rows: list[list[object]] = []
    for part, name in PARTS.items():
        base_us = statistics.median(getattr(b, part) for b, _ in ab)
        head_us = statistics.median(getattr(h, part) for _, h in ab)
        rows.append([name, f"{base_us:.1f}", f"{head_us:.1f}", ratio_cell(part_ratios(ab, part)),
                     ratio_cell(part_ratios(aa, part))])
    totals = [h.total / b.total for b, h in ab]
    steps = [c.step for pair in ab + aa for c in pair]
    shares_base = [share(b) * 100 for b, _ in ab]
    shares_head = [share(h) * 100 for _, h in ab]
    table = markdown_table(["part of the hook", "base µs", "this checkout µs",
                            "ratio of shares of the step", "A/A"], rows)
    base_hash = base_rev.split()[0]
    body = f"""Baseline: the curvecast package of `{base_hash}`; this checkout's bench code runs
both. {args.pairs} pairs of processes, base and this checkout in alternating order, and
{args.aa} A/A pairs (this checkout twice) among them; each process one `bench_cost` run of
{args.steps:,} steps against a server of its own (SQLite). The µs: medians of CPU per step; the
ratios: each part as a share of its own run's training step ({min(steps):.0f}–{max(steps):.0f}
µs of CPU), this checkout over the base pair by pair, median and ~95% sign-test interval.

{table}"""
    aa_total = statistics.median(part_ratios(aa, "total"))
    result = (f"the whole hook {statistics.median(shares_head):.2f}% of the training step "
              f"against {statistics.median(shares_base):.2f}% with the revision's package: "
              f"{ratio_cell(part_ratios(ab, 'total'))} pair by pair (A/A {aa_total:.3f}); its "
              f"µs {ratio_cell(totals)}")
    return publish(args, "hook_paired",
                   "The whole client hook against a revision, in paired processes", body, result)
