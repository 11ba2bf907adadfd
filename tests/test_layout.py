"""The layout docs/architecture.md promises: no import cycle between packages, and each room
entered through one door (the store imports no rules, web or worker code; the pure cores import
no store; the client and the contract import only the standard library and each other)."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests import REPO

FOLDERS = ("client", "service", "sfplus", "dashboards")


def _modules() -> Iterator[tuple[str, Path]]:
    yield "curvecast", REPO / "curvecast" / "__init__.py"
    yield "curvecast.contract", REPO / "curvecast" / "contract.py"
    for path in sorted((REPO / "curvecast" / "integrations").glob("*.py")):
        name = "" if path.stem == "__init__" else f".{path.stem}"
        yield f"curvecast.integrations{name}", path
    for folder in FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield "curvecast." + ".".join(parts), path


def _unit(module: str) -> str | None:
    """The package a module belongs to: ``service.<sub>`` for the service's subpackages and
    top-level modules, the first component elsewhere."""
    parts = module.split(".")
    if parts[0] != "curvecast":
        return None
    if len(parts) == 1:
        return "curvecast"
    if parts[1] == "service" and len(parts) > 2:
        return "service." + parts[2]
    return parts[1]


def _imports(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from curvecast.service import web` imports the subpackage web.
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                yield candidate if _is_module(candidate) else node.module


def _is_module(name: str) -> bool:
    parts = name.split(".")[1:]
    # The top-level folders (curvecast/client -> ../client, ...), and what lives in curvecast/
    # itself (the contract, the integrations).
    bases = [REPO.joinpath(*parts), REPO.joinpath("curvecast", *parts)] if parts else [
        REPO / "curvecast"]
    return any(base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()
               for base in bases)


def _graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for module, path in _modules():
        source = _unit(module)
        assert source is not None
        for name in _imports(path):
            target = _unit(name)
            if target is not None and target != source:
                edges.setdefault(source, set()).add(target)
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_no_import_cycle_between_packages() -> None:
    assert _cycle(_graph()) is None


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None


def test_each_room_has_one_door() -> None:
    edges = _graph()
    # The store talks SQL and returns schemas: it never runs rules, pages or the worker.
    assert not edges["service.store"] & {"service.alerting", "service.web", "service.worker",
                                         "service.api", "dashboards"}
    # The pure cores take data and return results: no store, no HTTP layer.
    for core in ("service.alerting", "service.forecast", "dashboards"):
        assert not edges.get(core, set()) & {"service.store", "service.api", "service.web",
                                             "service.worker", "service.db"}, core
    # The integrations run the forecast core inside another tool (and may stream through the
    # client): no server parts.
    assert edges["integrations"] <= {"service.forecast", "client", "contract"}
    # The client is what `pip install curvecast` gets: the contract and the standard library.
    assert edges["client"] <= {"contract"}
    assert "contract" not in edges


def test_the_pages_read_one_way_never_through_the_rest_routes() -> None:
    """The pages, their chart data and the live poll read through ``service/web/reads.py`` (the
    store and the answer builder), never by calling the REST API's route modules; what both
    share (the route class, query parameters) lives outside ``service/api``."""
    checked = 0
    for module, path in _modules():
        if not module.startswith(("curvecast.service.web", "curvecast.dashboards")):
            continue
        checked += 1
        routes = sorted(name for name in _imports(path)
                        if name == "curvecast.service.api"
                        or name.startswith("curvecast.service.api."))
        assert not routes, f"{module} imports {routes}"
    assert checked > 10


def test_the_contract_imports_only_the_standard_library() -> None:
    tree = ast.parse((REPO / "curvecast" / "contract.py").read_text(encoding="utf-8"))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


def _runtime_imports(path: Path) -> set[str]:
    """The modules a file imports when it runs (at module level or inside functions): every
    import but those under ``if TYPE_CHECKING:``."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names
                         if _is_module(f"{node.module}.{alias.name}"))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def test_the_store_never_imports_the_answer_builder() -> None:
    """The store reads what answers need and the answer builder shapes them: the one rule both
    apply (the loss a run reached) is the forecast core's (``forecast/reached.py``), so the
    store never imports the answer builder, in its source or when it runs."""
    answer = "curvecast.service.forecast.answer"
    store = [(module, path) for module, path in _modules()
             if module.startswith("curvecast.service.store")]
    assert len(store) > 5
    for module, path in store:
        assert answer not in _runtime_imports(path), module
    code = "\n".join(["import sys", *(f"import {module}" for module, _ in store),
                      f"print({answer!r} in sys.modules)"])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=REPO)
    assert out.stdout.strip() == "False"


def test_the_runtime_import_finder_skips_type_checking_blocks(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\n"
                      "else:\n    import b\ndef f():\n    import c\n", encoding="utf-8")
    assert _runtime_imports(source) == {"typing", "b", "c"}
