"""The processes of a run: started with logs, waited for, stopped by PID, accounted for.

Every child gets its own process group and log file (`<run>/logs/<name>.log`); stopping
is SIGTERM to the child's PID, then SIGKILL to its group after a grace period, so that
nothing a run started outlives it. What was started and how it ended goes into run.json.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class StartError(RuntimeError):
    """A child did not come up; the message holds the tail of its log."""


@dataclass
class Child:
    name: str
    argv: list[str]
    proc: subprocess.Popen[bytes]
    log: Path
    started_at: float
    ended_at: float | None = None
    exit_code: int | None = None
    ready: str = ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pid": self.pid,
            "argv": self.argv,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "exit_code": self.exit_code,
        }


@dataclass
class ProcessGroup:
    log_dir: Path
    env: dict[str, str]
    cwd: Path
    children: list[Child] = field(default_factory=list)

    def start(self, name: str, argv: list[str], *, extra_env: dict[str, str] | None = None) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.cwd,
                env={**self.env, **(extra_env or {})},
                start_new_session=True,  # its own process group: stop() can reach its children
            )
        child = Child(name, argv, proc, log, time.time())
        self.children.append(child)
        return child

    def wait_ready(self, child: Child, prefix: str, timeout: float = 30.0) -> str:
        """Wait for a line starting with `prefix` in the child's log; return the rest of it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                text = child.log.read_text(errors="replace")
            except OSError:
                text = ""
            for line in text.splitlines():
                if line.startswith(prefix):
                    child.ready = line[len(prefix) :].strip()
                    return child.ready
            if not child.alive():
                raise StartError(
                    f"{child.name} exited with {child.proc.returncode} before it was ready:\n{child.tail()}"
                )
            time.sleep(0.05)
        raise StartError(f"{child.name} was not ready within {timeout:.0f}s:\n{child.tail()}")

    def stop(self, child: Child, *, grace: float = 10.0, sig: int = signal.SIGTERM) -> int:
        """Stop one child by PID (SIGTERM, then SIGKILL of its process group)."""
        if child.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, sig)
            try:
                child.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self._kill_group(child)
                child.proc.wait(timeout=10)
        # Anything the child left in its group (e.g. a worker of its own) goes too.
        self._kill_group(child)
        child.exit_code = child.proc.returncode
        child.ended_at = child.ended_at or time.time()
        return child.exit_code

    @staticmethod
    def _kill_group(child: Child) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)

    def stop_all(self, grace: float = 10.0) -> None:
        """Stop every child, newest first (the load before the proxy before the server)."""
        for child in reversed(self.children):
            self.stop(child, grace=grace)
