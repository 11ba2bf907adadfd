"""The server-drawn first chart (pure): a static SVG of a figure, readable before plotly.js
arrives — valid markup, axes and ticks, bounded size, bands filled, every string escaped."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np

from curvecast.dashboards.figures.spec import FigureSpec
from curvecast.dashboards.figures.static_svg import static_svg


def _figure(n: int = 50_000, title: str = "Loss") -> FigureSpec:
    """A loss line (a NumPy array, as the builders give) and a filled band (lists)."""
    steps = np.arange(n)
    loss = 3.0 / np.sqrt(steps / 100 + 1) + 1.0
    band_x = np.linspace(n, 2 * n, 20).tolist()
    return FigureSpec(
        data=[
            {"type": "scattergl", "x": steps, "y": loss, "mode": "lines",
             "name": "training loss", "line": {"color": "#1f77b4", "width": 1.6}},
            {"type": "scatter", "x": band_x, "y": [1.05] * 20, "mode": "lines",
             "line": {"width": 0}},
            {"type": "scatter", "x": band_x, "y": [1.2] * 20, "mode": "lines",
             "line": {"width": 0}, "fill": "tonexty", "fillcolor": "rgba(255,127,14,0.2)"},
        ],
        layout={"title": {"text": title}, "yaxis": {"range": [0.9, 4.2]}},
    )


def test_valid_svg_with_axes_lines_and_a_filled_band() -> None:
    svg = static_svg(_figure())
    root = ET.fromstring(svg)
    assert root.tag == "svg" and root.get("class") == "static-preview"
    paths = root.findall("path")
    lines = [p for p in paths if p.get("stroke") not in (None, "none")]
    fills = [p for p in paths if p.get("fill") not in (None, "none")]
    assert len(lines) == 1 and len(fills) == 1  # zero-width band edges are not stroked
    assert fills[0].get("fill") == "rgba(255,127,14,0.2)"
    ticks = [t.text for t in root.findall("text")]
    assert "Loss" in ticks and any(t and "static preview" in t for t in ticks)
    y_ticks = [float(t) for t in ticks if t and t.replace(".", "").isdigit()]
    assert min(y_ticks) >= 0.0 and len(y_ticks) >= 4


def test_a_long_series_is_thinned_to_about_a_point_per_pixel() -> None:
    svg = static_svg(_figure(n=1_000_000))
    line = next(p for p in ET.fromstring(svg).findall("path") if p.get("stroke") != "none")
    assert line.get("d", "").count("L") < 1300
    assert len(svg) < 60_000


def test_strings_are_escaped() -> None:
    svg = static_svg(_figure(title='<script>alert(1)</script> & "x"'))
    assert "<script>" not in svg and "&amp;" in svg
    ET.fromstring(svg)  # still well-formed
