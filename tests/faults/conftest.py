"""The addon is a mitmproxy script (addons/mcp_faults.py), not a package module: tests import
it the way mitmproxy does, with its folder on sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

ADDONS = Path(__file__).resolve().parents[2] / "addons"
if str(ADDONS) not in sys.path:
    sys.path.insert(0, str(ADDONS))
