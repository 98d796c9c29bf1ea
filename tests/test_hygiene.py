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


def _make_dir(tmp: Path, python: str | None) -> Path:
    """A folder with the Makefile and a .venv whose python is `python` (a script's text)
    or, when None, the Python 3.12 running this test; stamped as installed."""
    for name in ("Makefile", "pyproject.toml", "setup.py", "constraints.txt"):
        (tmp / name).write_bytes((ROOT / name).read_bytes())
    bindir = tmp / ".venv" / "bin"
    bindir.mkdir(parents=True)
    if python is None:
        (bindir / "python").symlink_to(sys.executable)
    else:
        (bindir / "python").write_text(python)
        (bindir / "python").chmod(0o755)
    (tmp / ".venv" / ".installed").touch()  # newer than the inputs: "installed"
    return tmp


def test_make_leaves_a_good_venv_alone(tmp_path: Path) -> None:
    out = subprocess.run(
        ["make", "-n", "venv"], cwd=_make_dir(tmp_path, None), capture_output=True, text=True
    )
    assert out.returncode == 0 and "Nothing to be done" in out.stdout, out.stdout + out.stderr


def test_make_rebuilds_a_venv_of_another_python(tmp_path: Path) -> None:
    # A .venv of Python 3.11 (or whose base interpreter is gone): its python fails the check.
    wrong = "#!/bin/sh\necho 'Python 3.11.7'; exit 1\n"
    out = subprocess.run(
        ["make", "-n", "venv"], cwd=_make_dir(tmp_path, wrong), capture_output=True, text=True
    )
    assert "rm -rf .venv" in out.stdout and "-m venv .venv" in out.stdout, out.stdout + out.stderr


def test_make_says_what_to_run_without_a_python_3_12(tmp_path: Path) -> None:
    folder = _make_dir(tmp_path, "#!/bin/sh\nexit 1\n")
    out = subprocess.run(
        ["make", "venv", "PYTHON_BOOT=/bin/false"], cwd=folder, capture_output=True, text=True, timeout=60
    )
    assert out.returncode != 0
    assert "make PYTHON_BOOT=/path/to/python3.12" in out.stdout and "Traceback" not in out.stdout + out.stderr
    assert (folder / ".venv").exists(), "nothing is removed before a usable Python is there"
