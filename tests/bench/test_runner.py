"""The benchmarks' runner: every module of an area is listed and runnable by its name, the
sections it writes name that command, and BENCHMARKS.md's summary follows its sections."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import _registry
from bench._report import command_line, unwrap, write_section
from tests._servers import REPO

BENCH = REPO / "bench"


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def _modules_on_disk() -> list[Path]:
    return sorted(p for p in BENCH.glob("*/*.py")
                  if not p.name.startswith("_") and not p.parent.name.startswith("_"))


def test_list_shows_every_module_of_every_area_with_its_description() -> None:
    proc = _bench("list")
    assert proc.returncode == 0, proc.stderr
    on_disk = _modules_on_disk()
    assert len(on_disk) > 30
    for path in on_disk:
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        line = next(line for line in proc.stdout.splitlines()
                    if line.split()[:1] == [path.stem])
        assert doc.splitlines()[0].replace("``", "`") in line, (path, line)
    for area in {p.parent.name for p in on_disk}:
        assert f"{area}/ " in proc.stdout


def test_every_bench_has_a_one_line_description_and_a_main_taking_argv() -> None:
    names = [b.name for b in _registry.benches()]
    assert len(names) == len(set(names)), "bench names are unique across areas"
    for bench in _registry.benches():
        tree = ast.parse(bench.path.read_text())
        first = (ast.get_docstring(tree) or "").splitlines()
        assert first and first[0].endswith((".", "?")), f"{bench.name}: a one-line description"
        main = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"),
                    None)
        assert main is not None and [a.arg for a in main.args.args] == ["argv"], bench.name


def test_run_passes_its_arguments_to_the_bench() -> None:
    proc = _bench("run", "held_band", "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m bench run held_band")
    assert "--no-write" in proc.stdout


def test_run_of_an_unknown_name_says_which_names_there_are() -> None:
    proc = _bench("run", "no_such_bench")
    assert proc.returncode == 2
    assert "no benchmark 'no_such_bench'" in proc.stderr and "python -m bench list" in proc.stderr


def test_find_takes_the_name_or_the_module_path() -> None:
    assert _registry.find("ingest").module == "bench.service.ingest"
    assert _registry.find("service/ingest") == _registry.find("bench.service.ingest")
    with pytest.raises(KeyError, match="try: .*ingest"):
        _registry.find("ingestion")


def test_a_section_names_the_runner_command(monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(_registry.find("worker_rounds").path)
    monkeypatch.setattr(sys, "argv", [path, "--sqlite", "--rounds", "2"])
    assert command_line() == "python -m bench run worker_rounds --sqlite --rounds 2"


def test_write_section_replaces_its_block_and_rebuilds_the_summary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    md = tmp_path / "BENCHMARKS.md"
    monkeypatch.setattr(sys, "argv", [str(_registry.find("ingest").path)])
    table = "| a | b |\n|---|---|\n| 1 | 2 |"
    write_section("alpha", "Alpha things", f"Method in\ntwo lines.\n\n{table}", "1.5× the base",
                  path=md)
    write_section("beta", "Beta | things", "Beta's method.", "0.9× the base", path=md)
    write_section("alpha", "Alpha things", "Measured again.", "1.2× the base", path=md)
    text = md.read_text()
    assert text.count("<!-- bench:alpha -->") == 1 and "Method in" not in text
    summary = text[text.index("<!-- bench-summary -->"):text.index("<!-- /bench-summary -->")]
    assert summary.index("1.2× the base") < summary.index("0.9× the base")
    assert "[Beta \\| things](#beta--things)" in summary
    assert "`python -m bench run ingest`" in summary
    assert text.index("<!-- /bench-summary -->") < text.index("<!-- bench:alpha -->")


def test_unwrap_joins_prose_lines_and_leaves_tables_and_lists() -> None:
    body = "A method\nin two lines.\n\n| a |\n|---|\n| 1 |\n\nWhat drives it:\n- one\n- two"
    assert unwrap(body).split("\n\n") == [
        "A method in two lines.", "| a |\n|---|\n| 1 |", "What drives it:\n- one\n- two"]


def test_every_section_of_benchmarks_md_names_a_bench_that_exists() -> None:
    text = (REPO / "BENCHMARKS.md").read_text()
    names = {b.name for b in _registry.benches()}
    commands = re.findall(r"^Command: `python -m bench run (\w+)", text, re.M)
    sections = re.findall(r"^<!-- bench:[\w.-]+ -->$", text, re.M)
    assert commands and len(commands) == len(sections)
    assert set(commands) <= names, set(commands) - names
