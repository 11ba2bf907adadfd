"""The demo's terminal: two progress rows redrawn in place, and log messages printed above
them (``curvecast demo``, ``service/demo.py``)."""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Callable, Sequence
from typing import Any


class Rows:
    """Rows of text redrawn in place on a terminal.

    Each row is cut to the terminal's width: a row that wrapped would leave its first screen
    line behind at every redraw (a 160-character line on a 120-column terminal printed a new,
    cut-off line every second). The width is read at every draw, so a resized window works.
    The last draw (``final``) is not cut: nothing redraws it, and its end is the answer.
    Other output (the service's log messages) goes through :meth:`above`, from any thread:
    written straight to the terminal, it would land inside the rows and be half overwritten
    at the next redraw.
    """

    def __init__(self, out: Any, width: Callable[[], int] | None = None) -> None:
        self.out = out
        self.width = width or (lambda: shutil.get_terminal_size((100, 24)).columns)
        self.drawn = 0  # rows on screen from the last draw
        self.rows: Sequence[str] = ()  # what they say (redrawn under a message)
        self.lock = threading.Lock()  # draws and messages come from different threads

    def draw(self, rows: Sequence[str], final: bool = False) -> None:
        """Replace the rows drawn last with ``rows``; ``final`` leaves the cursor below them."""
        with self.lock:
            if final:  # uncut rows may wrap onto the old ones: those are cleared first
                self.out.write(self._cleared() + "\n".join(rows) + "\n")
            else:
                # Up to the first row drawn last (the cursor sits at the end of the last one),
                # then each row cleared and rewritten.
                cols = max(10, self.width())
                self.out.write("\r" + "\x1b[1A" * max(0, self.drawn - 1)
                               + "\n".join("\x1b[2K" + cut(row, cols - 1) for row in rows))
            self.out.flush()
            self.drawn = 0 if final else len(rows)
            self.rows = () if final else rows

    def above(self, text: str) -> None:
        """Print ``text`` (whole lines) where the rows are, and the rows again below it."""
        with self.lock:
            self.out.write(self._cleared() + text.rstrip("\n") + "\n")
            self.out.flush()
            self.drawn = 0
        if self.rows:
            self.draw(self.rows)

    def _cleared(self) -> str:
        """The escapes that blank the rows drawn last and put the cursor at the first one's
        start (text written there that is shorter than a row would leave that row's tail)."""
        if not self.drawn:
            return ""
        up = "\x1b[1A" * (self.drawn - 1)
        return "\r" + up + "\n".join(["\x1b[2K"] * self.drawn) + up + "\r"


def log_above(rows: Rows) -> None:
    """Route log records (and ``warnings``) of this process through ``rows`` from now on."""
    root = logging.getLogger()
    root.addHandler(AboveRows(rows))
    if root.level > logging.WARNING or root.level == logging.NOTSET:
        root.setLevel(logging.WARNING)
    logging.captureWarnings(True)


class AboveRows(logging.Handler):
    """Log records printed above the progress rows (:meth:`Rows.above`)."""

    def __init__(self, rows: Rows) -> None:
        super().__init__(logging.WARNING)
        self.rows = rows
        self.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.rows.above(self.format(record))
        except Exception:
            self.handleError(record)


def cut(row: str, width: int) -> str:
    """``row`` in at most ``width`` characters (an ellipsis where it was cut)."""
    return row if len(row) <= width else row[: width - 1] + "…"
