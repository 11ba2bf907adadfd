"""Colours: the Okabe–Ito palette, distinguishable with the common colour-vision deficiencies.

Okabe, M. and Ito, K. (2008), "Color Universal Design". Yellow is kept out of lines on white
(too little contrast); it is used only for fills and badges.
"""

from __future__ import annotations

BLACK = "#000000"
ORANGE = "#E69F00"
SKY = "#56B4E9"
GREEN = "#009E73"
YELLOW = "#F0E442"
BLUE = "#0072B2"
VERMILLION = "#D55E00"
PURPLE = "#CC79A7"
GREY = "#6E6E6E"

#: Colours for overlaid runs, in order (compare page).
SEQUENCE = (BLUE, ORANGE, GREEN, VERMILLION, PURPLE, SKY, BLACK, GREY)

#: Alert states → colour of their markers.
ALERT_STATE = {"firing": VERMILLION, "pending": ORANGE, "resolved": GREY}


def rgba(hex_colour: str, alpha: float) -> str:
    """``#RRGGBB`` with an opacity, as a CSS ``rgba()`` string."""
    value = hex_colour.lstrip("#")
    red, green, blue = (int(value[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({red},{green},{blue},{alpha:g})"


def run_colour(index: int) -> str:
    """The colour of the ``index``-th run on a comparison (cycles after eight)."""
    return SEQUENCE[index % len(SEQUENCE)]
