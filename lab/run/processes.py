"""The processes of a run: started with logs, waited for, stopped by PID, accounted for.

Every child gets its own process group and log file (`<run>/logs/<name>.log`); stopping
is SIGTERM to the child's PID, then SIGKILL to its group after a grace period, so that
nothing a run started outlives it. What was started and how it ended goes into run.json,
with every secret in its command line replaced by a placeholder.

Children die with their parent, whatever kills it: on Linux each child asks the kernel
(`prctl(PR_SET_PDEATHSIG, sig)`) to be sent a signal when the `lab run` that started it
dies, even by `kill -9`, and exits at once if that parent is already gone. The signal is
SIGTERM by default, so a part can flush its ledger; a part whose graceful stop can take
long (a Locust worker's users leave one by one, through a chain that may be gone) gets
SIGKILL: its ledger commits every row as it goes, so nothing written is lost.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1
"""From <linux/prctl.h>."""


class StartError(RuntimeError):
    """A child did not come up; the message holds the tail of its log."""


def death_signal_hook(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A preexec function that has the child sent `sig` when this process dies (Linux),
    or None elsewhere. The libc function is looked up here, before any fork: the child
    only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    prctl = libc.prctl
    parent = os.getpid()

    def tie_to_parent() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died between fork and prctl
            os._exit(1)

    return tie_to_parent


def redact_argv(argv: Iterable[str], secrets: dict[str, str]) -> list[str]:
    """`argv` with every occurrence of a secret value replaced by `<name>` (secrets: value -> name)."""
    out = []
    for arg in argv:
        for value, name in secrets.items():
            if value:
                arg = arg.replace(value, f"<{name}>")
        out.append(arg)
    return out


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
    essential: bool = False
    """The run cannot go on without it: its death ends the run as incomplete."""
    exits_when_done: bool = False
    """Exit 0 is its normal end (a Locust worker quits when its master tells it to)."""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def died(self) -> bool:
        """Ended, and not the way it ends when its work is done."""
        code = self.proc.poll()
        return code is not None and not (self.exits_when_done and code == 0)

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def as_json(self) -> dict[str, Any]:
        """How it ran, for run.json (whose writer redacts the argv: `redact_argv`)."""
        return {
            "name": self.name,
            "pid": self.pid,
            "argv": list(self.argv),
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

    def start(
        self,
        name: str,
        argv: list[str],
        *,
        extra_env: dict[str, str] | None = None,
        essential: bool = False,
        exits_when_done: bool = False,
        death_signal: int = signal.SIGTERM,
    ) -> Child:
        """Start `argv` as child `name` (log: `<log_dir>/<name>.log`); it is sent
        `death_signal` if this process dies before it."""
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
                preexec_fn=death_signal_hook(death_signal),
            )
        child = Child(
            name, argv, proc, log, time.time(), essential=essential, exits_when_done=exits_when_done
        )
        self.children.append(child)
        return child

    def run(self, argv: list[str], *, timeout: float | None = None) -> int:
        """Run a command to its end (output to this process's), tied to this process like
        the children; its exit code. On timeout it is killed and the code is -9."""
        proc = subprocess.Popen(argv, cwd=self.cwd, env=self.env, preexec_fn=death_signal_hook())
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return -signal.SIGKILL
        except BaseException:
            proc.kill()
            proc.wait()
            raise

    def wait_ready(
        self,
        child: Child,
        prefix: str,
        timeout: float = 30.0,
        interrupted: Callable[[], bool] = lambda: False,
    ) -> str:
        """Wait for a line starting with `prefix` in the child's log; return the rest of it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not interrupted():
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
        if interrupted():
            raise StartError(f"interrupted while waiting for {child.name}")
        raise StartError(f"{child.name} was not ready within {timeout:.0f}s:\n{child.tail()}")

    def stop(self, child: Child, *, grace: float = 10.0, sig: int = signal.SIGTERM) -> int:
        """Stop one child by PID (SIGTERM, then SIGKILL of its process group)."""
        if child.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
                os.kill(child.pid, sig)
            try:
                child.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self._kill_group(child)
                child.proc.wait(timeout=10)
        # Anything the child left in its group (e.g. a worker of its own) goes too.
        self._kill_group(child)
        self.reap(child)
        return child.proc.returncode

    def reap(self, child: Child) -> None:
        """Note how a child that has ended ended (a no-op while it runs)."""
        if child.proc.poll() is not None:
            child.exit_code = child.proc.returncode
            child.ended_at = child.ended_at or time.time()

    def kill_all(self) -> None:
        """SIGKILL every child's group at once (the fast stop of a second Ctrl-C)."""
        for child in self.children:
            self._kill_group(child)
        for child in self.children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=5)
            self.reap(child)

    @staticmethod
    def _kill_group(child: Child) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)

    def stop_all(self, grace: float = 10.0) -> None:
        """Stop every child, newest first (the load before the proxy before the server)."""
        for child in reversed(self.children):
            self.stop(child, grace=grace)
