"""Where the benchmarks read and write: the checkout's root, the recorded runs under
``bench/data``, and BENCHMARKS.md (one place, so a bench can move between areas freely)."""

from __future__ import annotations

from pathlib import Path

#: The checkout's root (where ``bench/``, ``BENCHMARKS.md`` and the product's folders are).
REPO = Path(__file__).resolve().parent.parent
#: Recorded runs and results the benches read back (corpora, GPU results).
DATA = REPO / "bench" / "data"
#: The file every bench writes its section of.
BENCHMARKS_MD = REPO / "BENCHMARKS.md"
#: Throwaway outputs (screenshots, profiles); git-ignored.
ARTIFACTS = REPO / "artifacts"
