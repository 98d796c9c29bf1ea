"""The plain side of the nemesis (client, schedule, log, parsing, CLI registration) never
imports trio: the orchestrator uses it from threads, and Locust code must never meet trio.
Nor does it load toxiproxy-python: the lab's own client is on the standard library."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

PLAIN = ["lab.nemesis", "lab.nemesis.toxics", "lab.nemesis.proxyspec", "lab.nemesis.log",
         "lab.nemesis.client", "lab.nemesis.schedule", "lab.nemesis.cli"]  # fmt: skip


def _imported_after(modules: list[str]) -> set[str]:
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_the_plain_modules_import_no_trio() -> None:
    loaded = _imported_after(PLAIN)
    assert "lab.nemesis.client" in loaded, "the probe must see what it imported"
    assert not {m for m in loaded if m.split(".")[0] in {"trio", "gevent", "locust", "h11"}}
    # The lab's own client is the standard library's: toxiproxy-python (and the requests
    # session it would patch) is for people, never loaded by the lab's plain side.
    assert not {m for m in loaded if m.split(".")[0] in {"toxiproxy", "requests"}}


def test_the_server_side_does_import_trio() -> None:
    assert "trio" in _imported_after(["lab.nemesis.server"]), "the probe can see trio"


def test_lab_help_lists_the_nemesis_and_the_command_needs_a_log() -> None:
    lab = str(Path(sys.executable).with_name("lab"))
    assert "nemesis" in subprocess.run([lab, "--help"], capture_output=True, text=True, check=True).stdout
    missing = subprocess.run([lab, "nemesis", "--api-port", "0"], capture_output=True, text=True)
    assert missing.returncode == 3 and "--log" in missing.stderr  # a usage error: could not run


def test_a_taken_api_port_is_a_clear_error(tmp_path: Path) -> None:
    lab = str(Path(sys.executable).with_name("lab"))
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        out = subprocess.run(
            [lab, "nemesis", "--api-port", str(port), "--log", str(tmp_path / "n.jsonl")],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert out.returncode == 3 and "lab nemesis:" in out.stderr and "Traceback" not in out.stderr
