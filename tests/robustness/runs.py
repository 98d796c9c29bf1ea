"""Helpers of the run-level robustness tests: start `lab run` in the background, watch
its folder, find its processes by PID, and wait for them to be gone."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.livesrv import LAB

HERE = Path(__file__).resolve().parent
SCENARIOS = HERE.parent / "run"


def pid_alive(pid: int) -> bool:
    """Running, and not a zombie (a zombie is dead for our purposes: its parent just has
    not reaped it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def group_members(pgid: int) -> list[int]:
    """PIDs of the live processes in process group `pgid` (a child and what it started)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text()
        except OSError:
            continue
        rest = fields[fields.rfind(")") + 2 :].split()
        if int(rest[2]) == pgid and rest[0] != "Z":
            out.append(int(entry.name))
    return out


def survivors(pids: list[int]) -> list[int]:
    """Which of `pids` (and their process groups) still have a live process."""
    return sorted({p for pid in pids for p in [pid, *group_members(pid)] if pid_alive(p)})


def wait_gone(pids: list[int], within: float) -> list[int]:
    deadline = time.monotonic() + within
    left = survivors(pids)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = survivors(pids)
    return left


def kill_all(pids: list[int]) -> None:
    """Clean up after a failed test: SIGKILL whatever is left, by PID."""
    for pid in survivors(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class Background:
    """A `lab run` started in the background, its output in a file."""

    proc: subprocess.Popen[bytes]
    out: Path
    results: Path

    def folder(self) -> Path | None:
        """This run's folder: the one `lab run` names on its `results:` line (a results
        root may hold other runs' folders)."""
        for line in self.out.read_text(errors="replace").splitlines():
            if line.startswith("results: "):
                return Path(line.removeprefix("results: ").strip())
        return None

    def run_json(self) -> dict[str, Any]:
        folder = self.folder()
        assert folder is not None
        doc: dict[str, Any] = json.loads((folder / "run.json").read_text())
        return doc

    def pids(self) -> dict[str, int]:
        return {p["name"]: p["pid"] for p in self.run_json().get("processes", [])}

    def wait_for_traffic(self, accepted: int = 20, within: float = 90) -> None:
        """Until the clients accepted `accepted` events and run.json lists the processes."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            folder = self.folder()
            if folder is not None and (folder / "progress.json").exists():
                try:
                    progress = json.loads((folder / "progress.json").read_text() or "{}")
                    listed = self.pids()
                except ValueError:
                    progress, listed = {}, {}
                if progress.get("accepted", 0) >= accepted and "master" in listed:
                    return
            if self.proc.poll() is not None:
                raise AssertionError(f"lab run ended early ({self.proc.returncode}):\n{self.output()}")
            time.sleep(0.3)
        raise AssertionError(f"the run did not get going:\n{self.output()}")

    def output(self) -> str:
        return self.out.read_text(errors="replace")[-4000:]

    def wait(self, timeout: float = 120) -> int:
        return self.proc.wait(timeout=timeout)


def start_run(tmp: Path, scenario: str | Path, *args: str, results: Path | None = None) -> Background:
    results = results or tmp / "results"
    out = tmp / f"lab-run-{time.monotonic_ns()}.out"
    path = scenario if isinstance(scenario, Path) else SCENARIOS / scenario
    with out.open("wb") as f:
        proc = subprocess.Popen(
            [LAB, "run", str(path), "--out", str(results), "--no-figures", *args],
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=tmp,
        )
    return Background(proc, out, results)
