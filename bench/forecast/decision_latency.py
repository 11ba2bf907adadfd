"""What a decision costs: a project's ranking over REST, and one ``CurvecastPruner.prune()``.

1. ``GET /api/v1/projects/{p}/ranking`` of a project of 50 runs (each streamed 6,000 steps of
   the loss and the hook's telemetry, then fitted by the worker's refit task), on PostgreSQL
   through a real server on a loopback port, against ``GET /healthz`` asked the same way in
   the same run (the framework's floor). Requests alternate between the two. Then the same
   ranking right after every run logged 50 more steps and was refitted: a live sweep, whose
   fits are new at every request, so nothing a fit caches helps.
2. ``CurvecastPruner.prune()`` of a trial that reported 1,000 points, with one completed
   trial to beat, in a real in-memory Optuna study, against the plain fit of those points
   (``fit_curve``, which the pruner's forecast starts from) timed in the same run.

Goals: the ranking of 50 runs <= 100 ms at p95; ``prune()`` <= 20 ms a call.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import numpy as np

from bench._cli import parser, publish
from bench._db import fresh_database
from bench._report import markdown_table, phase
from curvecast.contract import TELEMETRY_PREFIX
from curvecast.service.config import Settings
from curvecast.service.db import make_engine, make_sessionmaker
from curvecast.service.forecast.solver import fit_curve
from curvecast.service.worker.refit import refit_due_runs
from tests.support import thread_server
from tests.support.synthetic import batch, create_run

RUNS = 50
STEPS = 6_000
RANKING_GOAL_MS = 100.0
PRUNE_GOAL_MS = 20.0
PRUNE_POINTS = 1_000
#: Rankings timed right after every run was refitted (each round: 50 more steps per run).
FRESH_ROUNDS = 20
FRESH_STEPS = 50


def _p(values: list[float], q: float) -> float:
    return float(np.quantile(values, q))


def ranking_latency(backend: str, requests: int, fresh_rounds: int) -> dict[str, list[float]]:
    """Milliseconds per ranking and per ``/healthz``, alternating, after a warm-up; then per
    ranking right after every run was refitted (``fresh``)."""
    with tempfile.TemporaryDirectory() as tmp, fresh_database(backend, Path(tmp)) as url:
        settings = Settings(database_url=url, worker_enabled=False, refit_min_interval_s=0)
        sessions = make_sessionmaker(make_engine(settings))
        with thread_server(settings) as base, httpx.Client(base_url=base, timeout=120) as c:
            with phase("decision_latency", f"{RUNS} runs of {STEPS:,} steps, fitted", 1, 4):
                run_ids = [uuid.uuid4() for _ in range(RUNS)]
                for i, run_id in enumerate(run_ids):
                    create_run(c, run_id, "sweep", name=f"run-{i}", total_steps=20_000)

                def log(start: int, stop: int) -> None:
                    for i, run_id in enumerate(run_ids):
                        # Each run its own curve: the ranking has something to tell apart.
                        curve = (60.0 * (1 + 0.01 * i), 300.0, 2.0 + 0.002 * i)
                        c.post(f"/api/v1/runs/{run_id}/metrics", json=batch(
                            start, stop, total_steps=20_000, seed=i, prefix=TELEMETRY_PREFIX,
                            curve=curve, eval_every=50)).raise_for_status()
                    while refit_due_runs(sessions, settings):
                        pass

                log(0, STEPS)
            times: dict[str, list[float]] = {"ranking": [], "healthz": [], "fresh": []}
            paths = {"ranking": "/api/v1/projects/sweep/ranking", "healthz": "/healthz"}
            with phase("decision_latency", f"{requests} rankings and /healthz", 2, 4):
                for path in paths.values():  # warm-up
                    c.get(path).raise_for_status()
                for _ in range(requests):
                    for kind, path in paths.items():
                        t0 = time.perf_counter()
                        c.get(path).raise_for_status()
                        times[kind].append((time.perf_counter() - t0) * 1e3)
            ranked = c.get(paths["ranking"]).json()
            with phase("decision_latency", f"{fresh_rounds} rankings of refitted runs", 3, 4):
                for k in range(fresh_rounds):
                    log(STEPS + k * FRESH_STEPS, STEPS + (k + 1) * FRESH_STEPS)
                    t0 = time.perf_counter()
                    c.get(paths["ranking"]).raise_for_status()
                    times["fresh"].append((time.perf_counter() - t0) * 1e3)
    known = sum(r.get("p_best") is not None for r in ranked.get("runs", []))
    times["known"] = [float(known)]
    return times


def prune_latency(calls: int) -> dict[str, list[float]]:
    """Milliseconds per ``prune()`` of a 1,000-point trial and per plain fit of its points."""
    import optuna

    from curvecast.integrations.optuna import CurvecastPruner

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    total = 20_000
    steps = np.linspace(10, total // 2, PRUNE_POINTS).astype(int)
    rng = np.random.default_rng(0)
    config = {"warmup_steps": 200, "c_warmup": 400}
    pruner = CurvecastPruner(total_steps=total, config=config)
    study = optuna.create_study(direction="minimize", pruner=pruner)

    def objective(trial: optuna.Trial, scale: float) -> float:
        values = 60.0 * scale / np.sqrt(steps + 300.0) + 2.0 + rng.normal(0, 0.01, len(steps))
        for step, value in zip(steps, values, strict=True):
            trial.report(float(value), int(step))
        return float(values[-1])

    study.optimize(lambda t: objective(t, 1.0), n_trials=1)  # the best to beat
    study.optimize(lambda t: objective(t, 1.05), n_trials=1)  # the trial judged
    judged = study.trials[-1]
    pairs = sorted(judged.intermediate_values.items())
    xs = np.array([s for s, _ in pairs], dtype=float)
    times: dict[str, list[float]] = {"prune": [], "fit": []}
    ok = 0
    with phase("decision_latency", f"{calls} prune() calls at {PRUNE_POINTS:,} points", 4, 4):
        for _ in range(calls):
            # Each call on values it has not seen (as after a new report): nothing cached helps.
            ys = np.array([v for _, v in pairs]) + rng.normal(0, 1e-6, len(pairs))
            trial = optuna.trial.create_trial(
                state=optuna.trial.TrialState.COMPLETE, value=float(ys[-1]),
                intermediate_values={int(s): float(v) for s, v in zip(xs, ys, strict=True)},
                user_attrs=dict(judged.user_attrs))
            t0 = time.perf_counter()
            pruner.prune(study, trial)
            t1 = time.perf_counter()
            fit_curve(xs, ys, config=config)
            t2 = time.perf_counter()
            times["prune"].append((t1 - t0) * 1e3)
            times["fit"].append((t2 - t1) * 1e3)
            ok += pruner.decisions[trial.number].fit_status == "ok"
    times["status"] = [float(ok == calls)]
    for name, got in corrected_prune_latency(calls, steps, total, config).items():
        times[f"corrected, {name}"] = got
    return times


def corrected_prune_latency(calls: int, steps: np.ndarray, total: int,
                            config: dict[str, int]) -> dict[str, list[float]]:
    """Milliseconds per ``prune()`` with ``sweep_correction=True`` and ``SWEEP_PEERS``
    completed trials of 1,000 points: ``new point``, each call at a point no trial asked at
    before (the trial one report shorter each time), so the completed trials' forecasts there
    are fitted in the call (the worst case); ``asked before``, each call at the trial's
    1,000th point, on values it has not seen, as when trials report at the same steps (a
    completed trial's forecast from its reports up to a step is fitted once)."""
    import optuna

    from curvecast.integrations.optuna import _CORRECTED_NOTE, SWEEP_PEERS, CurvecastPruner

    pruner = CurvecastPruner(total_steps=total, config=config, sweep_correction=True)
    study = optuna.create_study(direction="minimize", pruner=pruner)
    rng = np.random.default_rng(1)
    for k in range(SWEEP_PEERS):
        values = (60.0 * (1 + 0.01 * k) / np.sqrt(steps + 300.0) + 2.0
                  + rng.normal(0, 0.01, len(steps)))
        study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.COMPLETE, value=float(values[-1]),
            intermediate_values={int(s): float(v) for s, v in zip(steps, values, strict=True)}))
    values = 60.0 * 1.03 / np.sqrt(steps + 300.0) + 2.0 + rng.normal(0, 0.01, len(steps))
    times: dict[str, list[float]] = {"new point": [], "asked before": []}
    corrected = 0
    with phase("decision_latency", f"{2 * calls} prune() calls with the sweep correction"):
        for i in range(2 * calls):
            upto = len(steps) - i % (len(steps) // 2) if i < calls else len(steps)
            noise = 0.0 if i < calls else 1e-6
            ys = values[:upto] + rng.normal(0, noise, upto)
            trial = optuna.trial.create_trial(
                state=optuna.trial.TrialState.COMPLETE, value=float(ys[-1]),
                intermediate_values={int(s): float(v) for s, v in zip(
                    steps[:upto], ys, strict=True)})
            t0 = time.perf_counter()
            pruner.prune(study, trial)
            times["new point" if i < calls else "asked before"].append(
                (time.perf_counter() - t0) * 1e3)
            corrected += _CORRECTED_NOTE in pruner.decisions[trial.number].reason
    if corrected < 2 * calls:
        print(f"warning: {2 * calls - corrected} of {2 * calls} prune() calls with the sweep "
              "correction were not corrected")
    return times


def summarise(rank: dict[str, list[float]], prune: dict[str, list[float]],
              backend: str) -> tuple[str, str]:
    """The section's body and its one-line result."""
    r95, h95 = _p(rank["ranking"], 0.95), _p(rank["healthz"], 0.95)
    n95 = _p(rank["fresh"], 0.95)
    p95, f95 = _p(prune["prune"], 0.95), _p(prune["fit"], 0.95)
    c95, a95 = _p(prune["corrected, new point"], 0.95), _p(prune["corrected, asked before"], 0.95)
    from curvecast.integrations.optuna import SWEEP_PEERS  # optuna: imported where it is used

    rows: list[list[object]] = [
        [f"`GET .../ranking`, {RUNS} runs ({int(rank['known'][0])} with a P(best))",
         f"{_p(rank['ranking'], 0.5):.1f}", f"**{r95:.1f}**",
         f"{r95 / h95:.1f}x `/healthz` ({h95:.1f} ms)",
         "met" if r95 <= RANKING_GOAL_MS else "NOT met"],
        [f"the same, every run refitted since the last request ({len(rank['fresh'])} "
         "requests)", f"{_p(rank['fresh'], 0.5):.1f}", f"**{n95:.1f}**",
         f"{n95 / h95:.1f}x `/healthz` ({h95:.1f} ms)",
         "met" if n95 <= RANKING_GOAL_MS else "NOT met"],
        [f"`CurvecastPruner.prune()`, {PRUNE_POINTS:,} points",
         f"{_p(prune['prune'], 0.5):.1f}", f"**{p95:.1f}**",
         f"{p95 / f95:.2f}x the plain fit ({f95:.1f} ms)",
         "met" if p95 <= PRUNE_GOAL_MS else "NOT met"],
        [f"the same with `sweep_correction=True`, {SWEEP_PEERS} completed trials, at steps "
         "an earlier call asked at", f"{_p(prune['corrected, asked before'], 0.5):.1f}",
         f"**{a95:.1f}**", f"{a95 / f95:.2f}x the plain fit",
         "met" if a95 <= PRUNE_GOAL_MS else "NOT met"],
        ["the same, each call at a new step (their forecasts fitted in the call)",
         f"{_p(prune['corrected, new point'], 0.5):.1f}", f"**{c95:.1f}**",
         f"{c95 / f95:.2f}x the plain fit", "met" if c95 <= PRUNE_GOAL_MS else "NOT met"],
    ]
    table = markdown_table(["what", "p50 ms", "p95 ms", "against the baseline (p95)",
                            "goal (100 ms, 20 ms at p95)"], rows)
    body = (f"The ranking: a project of {RUNS} runs on {backend}, each {STEPS:,} steps of the "
            "loss, an eval loss and the hook's telemetry, fitted by the worker's refit task; "
            f"{len(rank['ranking'])} requests through a real server on loopback, alternating "
            f"with `/healthz`; then {len(rank['fresh'])} requests each right after every run "
            f"logged {FRESH_STEPS} more steps and the refit task refitted it (a live sweep: "
            "no fit is the one the last request saw). The pruner: a real in-memory Optuna "
            "study, one completed trial to "
            f"beat and a trial of {PRUNE_POINTS:,} reported points ({len(prune['prune'])} "
            "calls, each on values it has not seen, as after a new report), beside the plain "
            "fit of the same points; then with the sweep correction, which also reads the "
            "completed trials' forecasts from their reports up to the same point: fitted once "
            "per step (trials that report at the same steps reuse them), or in the call at a "
            "step no call asked at before (the worst case).\n\n" + table)
    worst = max(r95, n95)
    result = (f"ranking of {RUNS} runs {r95:.0f} ms p95, {n95:.0f} ms with every run just "
              f"refitted ({r95 / h95:.1f}x and {n95 / h95:.1f}x `/healthz`; goal ≤ 100 ms: "
              f"{'met' if worst <= RANKING_GOAL_MS else 'NOT met'}); `prune()` at "
              f"{PRUNE_POINTS:,} points {p95:.1f} ms p95 ({p95 / f95:.2f}x a plain fit; goal "
              f"≤ 20 ms: {'met' if p95 <= PRUNE_GOAL_MS else 'NOT met'}; with the opt-in "
              f"sweep correction {a95:.1f} ms, {c95:.1f} ms at a step no call asked at before)")
    return body, result


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__, quick="10 requests and calls")
    cli.add_argument("--sqlite", action="store_true", help="SQLite instead of PostgreSQL")
    cli.add_argument("--requests", type=int, default=200)
    args: argparse.Namespace = cli.parse_args(argv)
    fresh_rounds = FRESH_ROUNDS
    if args.quick:
        args.requests, fresh_rounds = 10, 2
    backend = "sqlite" if args.sqlite else "postgres"
    rank = ranking_latency(backend, args.requests, fresh_rounds)
    prune = prune_latency(args.requests)
    if not prune["status"][0]:
        print("warning: the judged trial's fit is not ok; prune() timed an early return")
    body, result = summarise(rank, prune, backend)
    return publish(args, "decision_latency" + ("_sqlite" if args.sqlite else ""),
                   f"What a decision costs: the ranking and the pruner, {backend}", body,
                   result)
