"""Process-level properties: the sans-IO core stays I/O-free, the CLI answers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = ("gevent", "trio", "httpx", "locust", "socket", "threading", "asyncio", "anyio")


def test_client_core_and_wire_import_no_io_library() -> None:
    code = (
        "import sys, pkgutil, importlib\n"
        "for pkg in ('lab.wire', 'lab.client'):\n"
        "    p = importlib.import_module(pkg)\n"
        "    for m in pkgutil.iter_modules(p.__path__): importlib.import_module(pkg + '.' + m.name)\n"
        f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"lab.wire/lab.client imported {out.stdout.strip()}"


def test_the_hygiene_check_sees_a_forbidden_import() -> None:
    # The same probe, on a module that does import one: it must be reported.
    code = f"import sys, socket\nprint(','.join(m for m in {FORBIDDEN!r} if m in sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "socket" in out.stdout


def test_client_core_and_wire_read_no_clock() -> None:
    for path in [*(ROOT / "lab" / "client").glob("*.py"), *(ROOT / "lab" / "wire").glob("*.py")]:
        text = path.read_text(encoding="utf-8")
        for needle in ("time.time(", "time.monotonic(", "datetime.now(", "import time"):
            assert needle not in text, f"{path.name} reads a clock ({needle})"


def test_lab_help_and_diagram_check() -> None:
    lab = Path(sys.executable).with_name("lab")
    out = subprocess.run([str(lab), "--help"], capture_output=True, text=True, check=True)
    assert "usage: lab" in out.stdout and "diagram" in out.stdout
    chk = subprocess.run([str(lab), "diagram", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert chk.returncode == 0, chk.stderr
