"""A figure as plain dictionaries, what every builder returns, and its JSON for ``Plotly.newPlot``.

The pages only ever send figures to the browser, so the builders hand back the dictionaries
they collected (:class:`FigureSpec`) and :meth:`FigureSpec.to_json` encodes them in one pass.
Going through :class:`plotly.graph_objects.Figure` and ``plotly.io.to_json`` gave the same JSON for
much more CPU: the Figure wraps every trace in an object, and ``to_json`` deep-copies the whole
figure before walking it again to turn arrays into typed arrays (most of a page open's CPU was
there). :meth:`FigureSpec.figure` still gives the Plotly object, validated, for tests and anyone who
wants Plotly's API.

The JSON is Plotly's own (``tests/dashboards/test_figures.py`` compares the two on every
chart of a page): NumPy arrays travel as typed arrays (``{"dtype": "f8", "bdata": <base64>}``;
int64 narrowed to the smallest integer type that holds it, as plotly.js has no 64-bit
integers), except under the keys Plotly leaves as lists (``range``, ``layer``, ...);
non-finite floats are ``null``; ``<``, ``>`` and ``/`` are escaped so the JSON can sit inside
an HTML ``<script>``.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # plotly.graph_objects is slow to import and the pages never need it
    import plotly.graph_objects as go

__all__ = ["FigureSpec"]

#: Keys whose arrays Plotly sends as plain lists (``_plotly_utils.utils.is_skipped_key``).
_LIST_KEYS = frozenset({"geojson", "layer", "layers", "range"})
#: plotly.js's typed-array codes for the NumPy dtypes it reads.
_TYPED = {"int8": "i1", "uint8": "u1", "int16": "i2", "uint16": "u2", "int32": "i4",
          "uint32": "u4", "float32": "f4", "float64": "f8"}
_NARROWER_INTS = tuple((np.dtype(t), np.iinfo(t).min, np.iinfo(t).max)
                       for t in (np.int8, np.int16, np.int32))
_NARROWER_UINTS = tuple((np.dtype(t), 0, np.iinfo(t).max)
                        for t in (np.uint8, np.uint16, np.uint32))
#: What an HTML parser could take for markup inside a ``<script>`` (Plotly escapes the same).
_HTML_ESCAPES = (("<", "\\u003c"), (">", "\\u003e"), ("/", "\\u002f"))


@dataclass(frozen=True, slots=True)
class FigureSpec:
    """A Plotly figure as plain data: ``data`` (traces, each a dict with ``type``) and
    ``layout``. Values may be NumPy arrays; strings are already escaped for Plotly's
    pseudo-HTML by the builders."""

    data: list[dict[str, Any]]
    layout: dict[str, Any]

    def to_json(self) -> str:
        """The figure as the JSON ``Plotly.newPlot`` takes (what ``plotly.io.to_json`` gives)."""
        text = json.dumps(_plain({"data": self.data, "layout": self.layout}),
                          separators=(",", ":"), allow_nan=False)
        for unsafe, safe in _HTML_ESCAPES:
            if unsafe in text:
                text = text.replace(unsafe, safe)
        return text

    def figure(self, validate: bool = True) -> go.Figure:
        """The Plotly figure (validated in full unless ``validate`` is False)."""
        import plotly.graph_objects as go

        return go.Figure({"data": self.data, "layout": self.layout}, _validate=validate)


def _plain(value: Any) -> Any:
    """``value`` with its arrays as typed-array dicts or lists, non-finite floats as None and
    NumPy scalars as Python numbers: what the standard JSON encoder takes."""
    kind = type(value)
    if kind is dict:
        return {key: _typed(item) if type(item) is np.ndarray and key not in _LIST_KEYS
                else _plain(item) for key, item in value.items()}
    if kind is list or kind is tuple:
        return [_plain(item) for item in value]
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is np.ndarray:  # under a key Plotly keeps as a list
        return _plain(value.tolist())
    if isinstance(value, np.generic):
        return _plain(value.item())
    return value


def _typed(array: np.ndarray) -> Any:
    """An array as plotly.js's typed-array spec, or as a list where plotly.js has no type."""
    if array.size == 0:
        return []
    if array.dtype.kind in "iu" and array.dtype.itemsize == 8:
        low, high = array.min(), array.max()
        narrower = _NARROWER_INTS if array.dtype.kind == "i" else _NARROWER_UINTS
        dtype = next((t for t, lo, hi in narrower if lo <= low and high <= hi), None)
        if dtype is None:
            return _plain(array.tolist())
        array = array.astype(dtype)
    code = _TYPED.get(array.dtype.name)
    if code is None:  # bools, strings, objects: a list, as Plotly sends them
        return _plain(array.tolist())
    spec = {"dtype": code, "bdata": base64.b64encode(array.tobytes()).decode("ascii")}
    if array.ndim > 1:
        spec["shape"] = str(array.shape)[1:-1]
    return spec
