"""The offline ``curvecast forecast`` command: CSV and JSON inputs, output contract, bad files."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from curvecast.service.forecast.cli import add_forecast_parser, load_series, main, run_forecast
from curvecast.service.forecast.files import first_value_per_step

ROOT = Path(__file__).resolve().parents[2]
TOP_KEYS = {"status", "n_points", "fitted_upto_step", "a", "b", "c", "f_star", "prediction",
            "target"}


def _curve(n: int = 200) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    t = np.linspace(100, 20_000, n)
    return t, 20.3 / np.sqrt(t + 377) + 2.07 + rng.normal(0, 0.002, n)


@pytest.fixture
def csv_file(tmp_path: Path) -> Path:
    t, y = _curve()
    p = tmp_path / "run.csv"
    rows = "".join(f"{s:g},{v:.6f},ignored\n" for s, v in zip(t, y, strict=True))
    p.write_text("step,loss,note\n" + rows)
    return p


@pytest.fixture
def json_file(tmp_path: Path) -> Path:
    t, y = _curve()
    p = tmp_path / "run.json"
    p.write_text(json.dumps({"step": t.tolist(), "loss": y.tolist()}))
    return p


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert isinstance(out, dict)
    return out


def test_csv_json_output_contract(csv_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, str(csv_file), "--upto", "0.3", "--target", "2.2")
    assert set(out) == TOP_KEYS
    assert out["status"] == "ok"
    assert out["fitted_upto_step"] is not None and out["fitted_upto_step"] <= 0.3 * 20_000
    assert set(out["f_star"]) == {"value", "lo", "hi"}
    pred = out["prediction"]
    assert isinstance(pred, dict) and set(pred) == {"step", "value", "lo", "hi", "reached"}
    assert pred["step"] == 20_000.0  # default horizon: the last step in the file
    truth = 20.3 / np.sqrt(20_000 + 377) + 2.07
    assert pred["lo"] <= truth <= pred["hi"]
    assert abs(pred["value"] - truth) < 0.01
    target = out["target"]
    assert isinstance(target, dict)
    assert set(target) == {"loss", "step", "lo", "hi", "reachable", "reached", "reason",
                           "past_planned_end"}
    assert target["reachable"] is True and target["step"] > 6_000


def test_json_input_upto_step_horizon_and_unreachable_target(
        json_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, str(json_file), "--upto-step", "5000", "--horizon", "1e6",
                   "--target", "1.5", "--confidence", "0.8")
    assert out["fitted_upto_step"] is not None and out["fitted_upto_step"] <= 5000
    assert out["prediction"]["step"] == 1e6
    target = out["target"]
    assert {k: target[k] for k in ("loss", "step", "lo", "hi", "reachable", "reached")} == {
        "loss": 1.5, "step": None, "lo": None, "hi": None, "reachable": False, "reached": False}
    assert target["reason"].startswith("below f*'s 80% interval")


def test_no_target_gives_null(csv_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_json(capsys, str(csv_file), "--upto", "0.5")["target"] is None


def test_too_few_points_is_a_status_not_an_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "short.csv"
    p.write_text("step,loss\n1,3\n2,2.9\n3,2.8\n")
    out = run_json(capsys, str(p), "--upto", "1")
    assert out["status"] == "insufficient_data"
    assert out["a"] is None and out["prediction"]["value"] is None


def test_human_summary(csv_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(csv_file), "--upto", "0.3", "--target", "2.2"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("status: ok")
    assert "loss at step 20,000:" in text and "[90%:" in text
    assert "asymptote f* ~ c:" in text
    assert "loss 2.2 reached at step ~" in text
    assert "not in this run" not in text  # no planned end given


def test_human_summary_says_a_target_past_the_planned_end_is_not_in_this_run(
        csv_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The curve reaches 2.2 near step 24,000; the config plans 20,000 steps."""
    target = run_json(capsys, str(csv_file), "--upto", "0.3", "--target", "2.2", "--config",
                      '{"total_steps": 20000}')["target"]
    assert target["past_planned_end"] is True
    assert target["reason"].startswith(
        "after the run's planned last step (20,000): not in this run;")
    assert main([str(csv_file), "--upto", "0.3", "--target", "2.2", "--config",
                 '{"total_steps": 20000}']) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("loss 2.2"))
    assert "] (after the run's planned last step (20,000): not in this run;" in line, line
    assert main([str(csv_file), "--upto", "0.3", "--target", "2.25", "--config",
                 '{"total_steps": 20000}']) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("loss 2.25"))
    assert "reached at step ~" in line and "not in this run" not in line, line


def test_wired_into_a_parent_parser(csv_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """How service/cli.py uses it: add_forecast_parser on subparsers, then args.func(args)."""
    parser = argparse.ArgumentParser(prog="curvecast")
    add_forecast_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["forecast", str(csv_file), "--upto", "0.25", "--json"])
    assert args.func is run_forecast
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "ok"


BAD_FILES = {
    "missing.csv": (None, "no such file"),
    "empty.csv": ("", "empty"),
    "noheader.csv": ("a,b\n1,2\n", "no 'step' or 'loss' column"),
    "noloss.csv": ("step,value\n1,2\n", "no 'loss' column"),
    "text.csv": ("step,loss\n1,2.5\n2,oops\n", "line 3, loss: 'oops' is not a number"),
    "short_row.csv": ("step,x,loss\n1,2,3\n4\n", "line 3 has 1 fields"),
    "header_only.csv": ("step,loss\n", "no data rows"),
    "bad.json": ('{"step": [1, 2', "invalid JSON"),
    "list.json": ("[1, 2, 3]", "must be an object"),
    "nokey.json": ('{"step": [1, 2]}', "no 'loss' key"),
    "lengths.json": ('{"step": [1, 2, 3], "loss": [1, 2]}', '"step" has 3 values but "loss" has 2'),
    "types.json": ('{"step": [1, 2], "loss": [1, true]}', "loss[1]: True is not a number"),
    "scalar.json": ('{"step": 1, "loss": 2}', "must be arrays"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_files_exit_2_with_a_clear_message(
        name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    content, expected = BAD_FILES[name]
    p = tmp_path / name
    if content is not None:
        p.write_text(content)
    assert main([str(p), "--upto", "0.5", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert expected in captured.err
    assert captured.err.startswith("curvecast forecast: error:")


def test_binary_file_and_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    binary = tmp_path / "blob.csv"
    binary.write_bytes(bytes(range(256)) * 4)
    assert main([str(binary), "--upto", "0.5"]) == 2
    assert "not a text file" in capsys.readouterr().err
    assert main([str(tmp_path), "--upto", "0.5"]) == 2
    assert "is a directory" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "expected"), [
    (["--upto", "0"], "--upto must be a fraction in (0, 1]"),
    (["--upto", "1.5"], "--upto must be a fraction in (0, 1]"),
    (["--upto", "0.5", "--confidence", "1.2"], "--confidence must be in (0.5, 1)"),
    (["--upto", "0.5", "--confidence", "0.3"], "--confidence must be in (0.5, 1), got 0.3"),
    (["--upto", "0.5", "--horizon", "nan"], "--horizon must be a finite number"),
    (["--horizon", "-5"], "--horizon must be a step in [0, "),
    (["--horizon", "1e300"], "--horizon must be a step in [0, "),
    (["--upto-step", "-1"], "--upto-step must be 0 or more"),
])
def test_bad_arguments_exit_2(argv: list[str], expected: str, csv_file: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(csv_file), *argv]) == 2
    assert expected in capsys.readouterr().err


def test_nan_cells_are_dropped_not_rejected(tmp_path: Path) -> None:
    p = tmp_path / "gaps.csv"
    p.write_text("step,loss\n1,3.0\n2,\n3,nan\n4,2.5\n")
    steps, losses = load_series(p)
    assert steps == [1.0, 2.0, 3.0, 4.0]
    assert np.isnan(losses[1]) and np.isnan(losses[2])


def test_load_series_keeps_repeated_steps_first_value_per_step_drops_them(
        tmp_path: Path) -> None:
    """The reader returns the file's rows; the service's view (the first value of a step) is
    one call away, and is what the command fits."""
    p = tmp_path / "resumed.csv"
    p.write_text("step,loss\n1,3.0\n2,2.5\n2,2.7\n3,2.4\n")
    curve = load_series(p)
    assert curve == ([1.0, 2.0, 2.0, 3.0], [3.0, 2.5, 2.7, 2.4])
    assert first_value_per_step(curve) == (([1.0, 2.0, 3.0], [3.0, 2.5, 2.4]), 1)


def test_semicolon_csv_and_bom(tmp_path: Path) -> None:
    p = tmp_path / "excel.csv"
    p.write_text("\ufeffStep;Loss\n1;3.0\n2;2.5\n", encoding="utf-8")
    assert load_series(p) == ([1.0, 2.0], [3.0, 2.5])


def test_module_entry_point(csv_file: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "curvecast.service.forecast.cli", str(csv_file),
                           "--upto", "0.2", "--json"], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert set(json.loads(proc.stdout)) == TOP_KEYS


def test_upto_defaults_to_every_point(csv_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    everything = run_json(capsys, str(csv_file))
    explicit = run_json(capsys, str(csv_file), "--upto", "1")
    assert everything == explicit
    assert everything["fitted_upto_step"] == pytest.approx(20_000, rel=0.01)


def test_formula_has_real_signs_and_no_placeholders(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A negative b prints as ``t - 300``; nothing prints ``+ -`` or ``n/a`` inside a formula."""
    t = np.arange(400.0, 4000.0, 10.0)
    y = 20.0 / np.sqrt(t - 300.0) + 1.5
    p = tmp_path / "negative_b.csv"
    p.write_text("step,loss\n" + "".join(f"{s:g},{v:.8f}\n" for s, v in zip(t, y, strict=True)))
    assert main([str(p), "--burn-in", "400"]) == 0
    text = capsys.readouterr().out
    fit_line = next(line for line in text.splitlines() if line.startswith("fit: "))
    assert "sqrt(t - 3" in fit_line and "+ -" not in fit_line and "n/a" not in fit_line
    flat = tmp_path / "flat.csv"
    flat.write_text("step,loss\n" + "".join(f"{s},{2.0 + 0.001 * (s % 3)}\n"
                                            for s in range(100, 200)))
    assert main([str(flat), "--burn-in", "100"]) == 0
    text = capsys.readouterr().out
    assert "status: flat" in text and "fit: f(t) = 2" in text and "n/a" not in text


def test_passed_target_and_unidentified_f_star_in_words(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    t = np.arange(100.0, 1000.0)
    p = tmp_path / "line.csv"
    p.write_text("step,loss\n" + "".join(f"{s:g},{3.0 - 0.001 * s:.6f}\n" for s in t))
    assert main([str(p), "--burn-in", "100", "--target", "2.5"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("status: no_asymptote")
    assert "asymptote f*: not identifiable yet, at most 2.0" in text
    assert "forecast: the current loss 2.0" in text and "not the curve above" in text
    assert "loss 2.5 already reached at step 5" in text  # 3 - 0.001 t = 2.5 at t = 500


def test_the_export_s_logged_learning_rate_marks_a_decay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The service's export holds ``opt/lr`` when the hook watched a torch optimizer: a rate
    that decays makes the forecast ``off_model``, as the server's refit does."""
    t, y = _curve()
    lr = np.where(t < 8000, 1e-3, 1e-3 * (1 - (t - 8000) / 20_000))  # linear decay from 8000

    def export(rate: np.ndarray) -> Path:
        p = tmp_path / "metrics.csv"
        p.write_text("key,step,value,wall_time\n"
                     + "".join(f"loss,{s:g},{v:.6f},\n" for s, v in zip(t, y, strict=True))
                     + "".join(f"opt/lr,{s:g},{v:.6g},\n" for s, v in zip(t, rate, strict=True)))
        return p

    assert run_json(capsys, str(export(np.full(t.size, 1e-3))))["status"] == "ok"
    assert run_json(capsys, str(export(lr)), "--upto-step", "7000")["status"] == "ok"
    decayed = export(lr)
    assert run_json(capsys, str(decayed))["status"] == "off_model"
    assert main([str(decayed)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("status: off_model (the logged learning rate decays")


def test_gzip_files_are_read_and_a_damaged_one_is_a_clear_error(
    csv_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import gzip

    plain = run_json(capsys, str(csv_file))
    packed = tmp_path / "run.csv.gz"
    packed.write_bytes(gzip.compress(csv_file.read_bytes()))
    assert run_json(capsys, str(packed)) == plain
    damaged = tmp_path / "damaged.csv.gz"
    damaged.write_bytes(gzip.compress(csv_file.read_bytes())[:40])
    assert main([str(damaged)]) == 2
    assert "a damaged gzip file" in capsys.readouterr().err


def test_an_sfplus_export_without_its_config_says_how_to_fix_off_model(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """One of our ScheduleFree+ runs (bench/data/sfplus_corpus), cut at 30%, its export without
    the optimizer's telemetry: without its c_warmup the fall once averaging starts reads as
    off_model, and the summary says which option fixes it; with its config the forecast is
    too_early, with no hint."""
    import gzip

    corpus = ROOT / "bench" / "data" / "sfplus_corpus"
    rows = gzip.decompress((corpus / "d-s-5k.csv.gz").read_bytes()).decode().splitlines()
    export = tmp_path / "losses.csv"
    export.write_text("\n".join(r for r in rows if not r.startswith("opt/")) + "\n")
    config = json.loads((corpus / "d-s-5k.json").read_text())["config"]
    assert main([str(export), "--upto", "0.3"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("status: off_model") and "hint: no --config" in text
    # The config itself, or a run as GET /api/v1/runs/{id} answers (its "config" inside).
    run = {"id": "r", "project": "p", "name": "n", "status": "finished", "config": config}
    for given in (config, run):
        path = tmp_path / "config.json"
        path.write_text(json.dumps(given))
        assert main([str(export), "--upto", "0.3", "--config", str(path)]) == 0
        text = capsys.readouterr().out
        assert text.startswith("status: too_early") and "hint:" not in text


def test_an_sfplus_export_gives_its_own_c_warmup(capsys: pytest.CaptureFixture[str]) -> None:
    """The whole export (the hook logs the averaging weight ``opt/c`` and the warmup factor,
    here every 10 steps): its c_warmup is read from them, and the forecast is the one its config
    gives. On every ScheduleFree+ run of the corpus the value read is the config's."""
    from curvecast.contract import RunConfig
    from curvecast.service.forecast.files import averaging_start, load_curves

    corpus = ROOT / "bench" / "data" / "sfplus_corpus"
    export = str(corpus / "d-s-5k.csv.gz")
    config = json.loads((corpus / "d-s-5k.json").read_text())["config"]
    assert main([export, "--upto", "0.3"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("status: too_early") and "hint:" not in text
    assert ("averaging start (c_warmup): step 1,000, read from opt/c (the averaging weight is 1 "
            "until then)") in text
    total = json.dumps({"total_steps": config["total_steps"]})
    read = run_json(capsys, export, "--upto", "0.3", "--config", total)
    given = run_json(capsys, export, "--upto", "0.3", "--config", json.dumps(config))
    assert read == given
    runs = [p for p in sorted(corpus.glob("*.json"))
            if json.loads(p.read_text())["config"].get("optimizer") == "sfplus"]
    assert len(runs) >= 16
    for path in runs:
        found = averaging_start(load_curves(str(path).replace(".json", ".csv.gz")))
        expected = RunConfig.read(json.loads(path.read_text())["config"]).averaging_start
        # (A run without warmup averages from its first step: nothing to read, or to skip.)
        assert found == (("opt/c", expected) if expected else None), path.name


def test_averaging_start_from_the_weight_alone() -> None:
    """Logged at every step: exact (c is 1 up to c_warmup + 1). Sparse, without the warmup
    factor: the equal-weights estimate. Nothing while c is still 1, from a c below 1 from the
    start, or from a bare "c" (any metric of the script's own)."""
    from curvecast.service.forecast.files import averaging_start
    from curvecast.sfplus.functional import averaging_weight

    steps, weights, total = list(range(1, 400)), [], 0.0
    for t in steps:
        c, total = averaging_weight(t, 1e-3, total, c_warmup=137, r=0.0, weight_lr_power=2.0)
        weights.append(c)
    dense = {"opt/c": ([float(s) for s in steps], weights)}
    assert averaging_start(dense) == ("opt/c", 137)
    sparse = {"sfplus/c": ([float(s) for s in steps[::10]], weights[::10])}
    assert averaging_start(sparse) == ("sfplus/c", 137)
    assert averaging_start({"opt/c": ([1.0, 2.0], [1.0, 1.0])}) is None
    assert averaging_start({"opt/c": ([1.0, 2.0], [0.5, 0.3])}) is None
    assert averaging_start({"c": dense["opt/c"]}) is None


def test_a_horizon_before_the_fitted_range_is_no_forecast_with_the_reason(
        csv_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before the first fitted step the model describes nothing: the summary says so instead
    of "n/a [90%: n/a – n/a]" (or a number from the curve extended backwards)."""
    out = run_json(capsys, str(csv_file), "--horizon", "50")
    assert out["prediction"] == {"step": 50, "value": None, "lo": None, "hi": None,
                                 "reached": None}  # nothing logged at or before step 50
    assert main([str(csv_file), "--horizon", "50"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("loss at step"))
    assert line.startswith("loss at step 50: no forecast: it is before the fitted range (from "
                           "step ") and line.endswith("the loss there is in the file")


def test_a_horizon_the_points_got_to_is_answered_with_the_loss_reached_there(
        csv_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """"Loss at step N?" for a step the run is past: beside the fit's value, the loss the
    points had there (the median of those over the last 1% of the steps up to N), as the API
    answers it; only from the points the command fits (``--upto``), and not for a step past
    the last of them."""
    t, y = _curve()
    at = int(t[120])  # between two points; the window (0.99 N, N] holds this one and one more
    window = y[(t > 0.99 * at) & (t <= at)]
    assert window.size == 2
    out = run_json(capsys, str(csv_file), "--horizon", str(at))
    assert out["prediction"]["reached"] == pytest.approx(float(np.median(window)), abs=1e-6)
    assert out["prediction"]["value"] is not None  # the fit's value stays the forecast
    assert main([str(csv_file), "--horizon", str(at)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("loss at step"))
    assert line.endswith(f"; reached there: {float(np.median(window)):.4g} (data)")
    cut = run_json(capsys, str(csv_file), "--horizon", str(at), "--upto-step", str(int(t[100])))
    assert cut["prediction"]["reached"] is None  # at the cut, the run was not there yet
    assert run_json(capsys, str(csv_file), "--horizon", "30000")["prediction"]["reached"] is None


def test_a_config_is_told_from_a_run_by_every_key_the_contract_reads() -> None:
    """``--config`` reads a run's "config" only when none of the keys ``RunConfig.read``
    consults is at the top: the contract lists them (fields and aliases) in one place."""
    import dataclasses

    from curvecast.contract import RunConfig
    from curvecast.service.forecast.cli import _read_config

    fields = {f.name for f in dataclasses.fields(RunConfig)}
    assert RunConfig.keys_read() == fields | set(RunConfig.ALIASES)
    assert set(RunConfig.ALIASES.values()) <= fields
    for alias, name in RunConfig.ALIASES.items():
        config = _read_config(json.dumps({alias: 100, "config": {name: 7}}))
        assert getattr(config, name) == 100  # a config with an alias, not a run


def test_a_file_that_ends_in_nan_is_diverged(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A log whose loss went NaN: no forecast and the reason, not a fit of the finite points
    (the "usable points" line is for too few points, not this)."""
    path = tmp_path / "diverged.csv"
    rows = [f"{s},{3.0 / (s + 10) ** 0.5 + 1.0}" for s in range(1, 60)]
    path.write_text("step,loss\n" + "\n".join(rows + ["60,nan", "61,inf", "62,nan"]) + "\n")
    out = run_json(capsys, str(path))
    assert out["status"] == "diverged" and out["prediction"]["value"] is None
    assert main([str(path)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("status: diverged (the loss is not finite after step 59")
    assert "usable points" not in text
