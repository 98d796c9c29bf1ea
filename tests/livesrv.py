"""Start real processes for tests: the reference server under uvicorn, on 127.0.0.1.

Processes are started with a free port (the server picks it and prints its URL) and
stopped by PID; their output is kept for the failure message.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LAB = str(Path(sys.executable).with_name("lab"))
LEDGER_KEY = "ab" * 32


@dataclass
class LiveProcess:
    proc: subprocess.Popen[str]
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def wait_for_line(proc: subprocess.Popen[Any], log: Path, prefix: str, timeout: float = 20.0) -> str:
    """The rest of the first line of `log` starting with `prefix` (the process's ready line)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
        time.sleep(0.05)
    raise TimeoutError(
        f"no line starting with {prefix!r} within {timeout}s:\n{log.read_text(errors='replace')}"
    )


def stop(proc: subprocess.Popen[Any], timeout: float = 10.0) -> int:
    """SIGTERM by PID, then SIGKILL if it does not go."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)
    return proc.returncode


@contextmanager
def reference_server(tmp: Path, *args: str, ledger: bool = True) -> Iterator[LiveProcess]:
    log = tmp / f"server-{time.monotonic_ns()}.log"
    argv = [LAB, "serve", "--port", "0", *args]
    if ledger:
        argv += ["--ledger", str(tmp / "ledger.sqlite")]
    env = {**os.environ, "LAB_LEDGER_KEY": LEDGER_KEY}
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
    try:
        url = wait_for_line(proc, log, "lab-serve listening on ")
        yield LiveProcess(proc, url, log)
    finally:
        stop(proc)


def run_scenario(
    tmp: Path, name: str, text: str, *extra: str, timeout: float = 150
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`lab run` of the scenario `text` (written as `<tmp>/<name>.toml`), quiet and without
    figures, into `<tmp>/runs-<name>`: what it printed, and its one run folder."""
    path = tmp / f"{name}.toml"
    path.write_text(text)
    out = tmp / f"runs-{name}"
    done = subprocess.run(
        [LAB, "run", str(path), "--out", str(out), "--quiet", "--no-figures", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    return done, folder
