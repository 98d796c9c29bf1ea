"""The benches are scripts, not a package: tests import their modules the way the scripts
do, with bench/ on sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
