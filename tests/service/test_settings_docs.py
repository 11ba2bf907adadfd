"""docs/configuration.md says "all settings": its table lists every field of ``Settings`` once,
with the default the code has."""

from __future__ import annotations

import re

from curvecast.service.config import Settings
from tests import REPO

ROW = re.compile(r"^\| `CURVECAST_([A-Z0-9_]+)` \| (.+?) \|", re.MULTILINE)


def _table() -> dict[str, str]:
    """``{field name: default cell}`` of docs/configuration.md's table."""
    rows = ROW.findall((REPO / "docs" / "configuration.md").read_text())
    names = [name.lower() for name, _ in rows]
    twice = sorted({n for n in names if names.count(n) > 1})
    assert twice == [], "settings listed twice"
    return {name.lower(): cell for name, cell in rows}


def _as_written(value: object) -> str:
    """A default as the table writes it: ``true``, ``5`` (not ``5.0``), ``unset``."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def test_the_docs_list_every_setting_and_nothing_else() -> None:
    table = _table()
    fields = set(Settings.model_fields)
    assert sorted(fields - set(table)) == [], "settings docs/configuration.md does not list"
    assert sorted(set(table) - fields) == [], "rows for settings that do not exist"


def test_the_readme_gives_each_literal_default_the_code_has() -> None:
    for name, cell in _table().items():
        literal = re.fullmatch(r"`([^`]*)`", cell.strip())
        default = Settings.model_fields[name].default
        if literal:
            assert literal.group(1) == _as_written(default), f"CURVECAST_{name.upper()}"
        elif cell.strip() == "unset":
            assert default is None, f"CURVECAST_{name.upper()}"
        # Otherwise the cell describes the default in words (public_url, allowed_hosts).
