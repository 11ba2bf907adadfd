"""Fuzz the whole OpenAPI schema with schemathesis against real ``curvecast serve`` processes.

Each configuration starts a real server on a fresh database (SQLite file, PostgreSQL; auth off
on loopback, and auth on with an admin token) and runs schemathesis's coverage, fuzzing and
stateful phases over every operation the server publishes, with every check except
``positive_data_acceptance`` (see :data:`EXCLUDED_CHECKS`). A configuration passes when
schemathesis reports no failure and the server logged no traceback: no 5xx, every status code,
content type, header and body as the schema documents, schema-violating input refused.

``make test`` runs a bounded version (``tests/reliability/test_fuzz.py``); this module's main is
the long run whose numbers go into BENCHMARKS.md.

Usage: ``python -m bench run fuzz [--max-examples 500] [--seed N] [--quick] [--no-write]``
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench._db import fresh_database
from tests.support import create_token, start_server_process

#: ``positive_data_acceptance`` asserts that every request the schema allows is accepted. The
#: service is deliberately stricter than OpenAPI can say (a batch needs at least one key and
#: equal-length columns; ``page_token`` must be one the API issued; ``keys`` is a
#: comma-separated list of metric names; integers must be JSON integers, not ``2.0``), so that
#: check reports those refusals, which are correct. Every other check runs.
EXCLUDED_CHECKS = ("positive_data_acceptance",)
PHASES = "coverage,fuzzing,stateful"
#: The bounded run of ``make test`` (``tests/reliability/test_fuzz.py``): examples and seed.
BOUNDED_EXAMPLES = 25
BOUNDED_SEED = 20261121


@dataclass
class FuzzRun:
    """One schemathesis run against one server configuration."""

    label: str
    returncode: int
    seconds: float
    cases: int | None
    operations: int | None
    failures: int
    server_tracebacks: int
    output: str
    server_log: str

    @property
    def ok(self) -> bool:
        """No schemathesis failure and no traceback in the server's log."""
        return self.returncode == 0 and self.server_tracebacks == 0


# One worker: schemathesis's workers are threads, and hypothesis parses lambda sources with
# ``ast``, which is not thread-safe on CPython 3.11 ("AST constructor recursion depth
# mismatch" aborts the coverage phase).
def schemathesis(
    base_url: str,
    workdir: Path,
    *,
    max_examples: int,
    seed: int,
    workers: int = 1,
    headers: dict[str, str] | None = None,
    timeout: float = 3600,
) -> tuple[int, str, float]:
    """Run the schemathesis CLI against ``base_url``; returns (exit code, output, seconds)."""
    cmd = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{base_url}/openapi.json",
        "--checks", "all", "--exclude-checks", ",".join(EXCLUDED_CHECKS),
        "--phases", PHASES,
        "--max-examples", str(max_examples), "--seed", str(seed), "--workers", str(workers),
        "--request-timeout", "30", "--generation-database", "none", "--no-color",
        "--suppress-health-check", "all",
    ]
    for name, value in (headers or {}).items():
        cmd += ["--header", f"{name}: {value}"]
    started = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout,
        env={"PATH": "/usr/bin:/bin", "HOME": str(workdir), "NO_COLOR": "1"},
    )
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started


def _summary_number(pattern: str, output: str) -> int | None:
    match = re.search(pattern, output)
    return int(match.group(1)) if match else None


def fuzz_url(
    database_url: str,
    workdir: Path,
    *,
    label: str,
    auth: bool,
    max_examples: int,
    seed: int,
    workers: int = 1,
) -> FuzzRun:
    """Start ``curvecast serve`` on a migrated (empty) database and fuzz it."""
    env = {"CURVECAST_WORKER_INTERVAL_S": "0.2"}
    headers = None
    if auth:
        env["CURVECAST_AUTH_ENABLED"] = "true"
        headers = {"Authorization": f"Bearer {create_token(database_url, 'fuzz', 'admin')}"}
    server = start_server_process(database_url, workdir, env=env)
    try:
        rc, output, seconds = schemathesis(
            server.url, workdir, max_examples=max_examples, seed=seed, workers=workers,
            headers=headers,
        )
    finally:
        server.stop()
    log = server.log()
    return FuzzRun(
        label=label,
        returncode=rc,
        seconds=seconds,
        cases=_summary_number(r"(\d+) generated", output),
        operations=_summary_number(r"Tested: (\d+)", output),
        failures=_summary_number(r"found (\d+) unique failure", output) or 0,
        server_tracebacks=log.count("Traceback"),
        output=output,
        server_log=log,
    )


def fuzz_server(
    backend: str, workdir: Path, *, auth: bool, max_examples: int, seed: int, workers: int = 1
) -> FuzzRun:
    """Fuzz a server on a fresh ``backend`` ("sqlite" or "postgres") database."""
    label = f"{backend}, auth {'on (admin token)' if auth else 'off'}"
    with fresh_database(backend, workdir) as url:
        return fuzz_url(url, workdir, label=label, auth=auth, max_examples=max_examples,
                        seed=seed, workers=workers)


def main(argv: list[str] | None = None) -> int:
    from bench._cli import parser, publish
    from bench._report import markdown_table

    cli = parser(__doc__, quick="20 examples")
    cli.add_argument("--max-examples", type=int, default=500)
    cli.add_argument("--seed", type=int, default=None, help="default: random (reported)")
    args = cli.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    n = 20 if args.quick else args.max_examples
    configs = [("sqlite", False), ("postgres", False), ("postgres", True)]
    runs = []
    with tempfile.TemporaryDirectory(prefix="curvecast-fuzz-") as tmp:
        for backend, auth in configs:
            run = fuzz_server(backend, Path(tmp), auth=auth, max_examples=n, seed=seed)
            runs.append(run)
            print(f"{run.label}: {'ok' if run.ok else 'FAILED'}, {run.cases} cases in "
                  f"{run.seconds:.0f} s", flush=True)
            if not run.ok:
                print(run.output[-20_000:], run.server_log[-5_000:], sep="\n", file=sys.stderr)
    rows: list[list[object]] = [
        [r.label, r.operations, f"{r.cases:,}" if r.cases else "?", f"{r.seconds:.0f}",
         r.failures, r.server_tracebacks, "pass" if r.ok else "**FAIL**"]
        for r in runs
    ]
    body = (
        f"schemathesis phases {PHASES.replace(',', ', ')}; every check except "
        f"{', '.join(EXCLUDED_CHECKS)} (the service is deliberately stricter than its schema "
        f"can express); up to {n} examples per operation and phase; seed {seed}; each "
        "configuration a real `curvecast serve` on a fresh database. \"Server tracebacks\": "
        "unhandled exceptions in the server's log (any 5xx but a 503 leaves one). `make test` "
        f"runs {BOUNDED_EXAMPLES} examples (`tests/reliability/test_fuzz.py`).\n\n"
        + markdown_table(
            ["configuration", "operations", "test cases", "seconds", "failures",
             "server tracebacks", "result"],
            rows,
        )
    )
    failures = sum(r.failures for r in runs) + sum(r.server_tracebacks for r in runs)
    result = (f"{sum(r.cases or 0 for r in runs):,} test cases in {len(runs)} configurations, "
              f"{failures} failures or server tracebacks")
    publish(args, "fuzz", "Schema fuzzing with schemathesis", body, result)
    return 0 if all(r.ok for r in runs) else 1
