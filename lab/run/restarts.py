"""Restart faults (`[[restarts]]`): the target restarted mid-run, as deploys and crashes do.

    RestartDriver(thread) ─ at each restart's time ─► reference: stop the server by PID
                                                      (SIGTERM = how "stop", SIGKILL =
                                                      "crash"), wait `down`, start it again
                                                      on the same port with the same
                                                      settings and files
                                                   ─► URL target: run target.restart_command
                                                      (its output in logs/restart-N.log,
                                                      killed after restart_timeout)
                                                   ─► URL target without a command: not
                                                      applicable, said once

Each restart is one line of `restarts.jsonl` in the run folder (`mcpLabRestarts.v1`,
docs/ledgers.md), written when it is over; the checker's restart section reads it
beside the tap (lab.checker.timeline.restarts). A reference server that does not come back
ends the run as incomplete (`failure`), like any part that dies.

While the server is down the proxy answers its clients 502: that is the fault. The
server's `essential` mark is lifted for the planned stop only, so the run's watch loop
does not take a restart for a death.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

from lab.run.processes import Child, ProcessGroup, StartError, death_signal_hook
from lab.scenario import Restart

FILE: Final = "restarts.jsonl"
SCHEMA: Final = "mcpLabRestarts.v1"
STOP_GRACE_S: Final = 10.0
"""Seconds a stopped server has to exit on SIGTERM before its group is killed."""
READY_WAIT_S: Final = 30.0


class Say(Protocol):
    def __call__(self, text: str, *, err: bool = False) -> None: ...


class RestartDriver:
    """Runs a scenario's restarts on a thread of its own, each at its time."""

    def __init__(
        self,
        restarts: Sequence[Restart],
        run_dir: Path,
        run_start: float,
        *,
        say: Say,
        group: ProcessGroup | None = None,
        server: Child | None = None,
        start_server: Callable[[int], Child] | None = None,
        store: str = "volatile",
        command: Sequence[str] = (),
        command_timeout: float = 60.0,
        env: dict[str, str] | None = None,
    ) -> None:
        """`start_server(n)` starts the reference server for the n-th time (1 = the first
        restart) on its port and waits until it is ready; None: the target is a URL."""
        self.restarts = list(restarts)
        self.dir = run_dir
        self.run_start = run_start
        self.say = say
        self.group = group
        self.server = server
        self.start_server = start_server
        self.store = store
        self.command = list(command)
        self.command_timeout = command_timeout
        self.env = env
        self.failure: str | None = None
        """Why the run cannot go on (the server did not come back), once it is so."""
        self.done = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="restarts", daemon=True)

    def start(self) -> None:
        if self.restarts:
            self._thread.start()

    def stop(self) -> None:
        """No more restarts (the run is over); waits for one under way to end."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=STOP_GRACE_S + READY_WAIT_S + self.command_timeout)

    def _run(self) -> None:
        for n, r in enumerate(self.restarts, 1):
            if self._stop.wait(max(0.0, self.run_start + r.at - time.time())):
                return
            try:
                record = self._restart(n, r)
            except Exception as e:  # a bug of ours must not go unseen: the run ends incomplete
                record = {"n": n, "ok": False, "error": f"{type(e).__name__}: {e}"}
            self._write({"type": "restart", "n": n, "planned_at": self.run_start + r.at, **record})
            self.done = n
            if not record.get("ok", True) and self.start_server is not None:
                self.failure = f"restart {n}: {record.get('error')}"
                return
        # The thread lives on until the run ends: a child is sent its death signal
        # (PR_SET_PDEATHSIG) when the *thread* that started it exits, so the last server
        # this thread started would be stopped the moment it returned.
        self._stop.wait()

    def _restart(self, n: int, r: Restart) -> dict[str, Any]:
        if self.start_server is not None:
            return self._restart_reference(n, r)
        if not self.command:
            if n == 1:
                self.say(
                    "lab run: restarts are not applicable to this target: it is a URL and the scenario "
                    "gives no target.restart_command",
                    err=True,
                )
            return {
                "how": "command",
                "applicable": False,
                "why": "the target is a URL and the scenario gives no target.restart_command",
            }
        return self._restart_by_command(n)

    def _restart_reference(self, n: int, r: Restart) -> dict[str, Any]:
        assert self.group is not None and self.server is not None and self.start_server is not None
        old = self.server
        sig = signal.SIGTERM if r.how == "stop" else signal.SIGKILL
        self.say(f"restart {n}: {'stopping' if r.how == 'stop' else 'killing'} the server (PID {old.pid})")
        old.essential = False  # a planned stop, not a death
        stop_sent = time.time()
        code = self.group.stop(old, grace=STOP_GRACE_S, sig=sig)
        stopped = time.time()
        record: dict[str, Any] = {
            "how": r.how,
            "store": self.store,
            "applicable": True,
            "stop_sent": stop_sent,
            "stopped": stopped,
            "exit_code": code,
            "pid_before": old.pid,
        }
        if self._stop.wait(r.down):
            return {**record, "ok": False, "error": "the run ended while the server was down"}
        record["start_sent"] = time.time()
        try:
            new = self.start_server(n)
        except StartError as e:
            return {**record, "ok": False, "error": f"the server did not come back: {e}"}
        new.essential = True
        self.server = new
        self.say(f"restart {n}: the server is back (PID {new.pid}), down {time.time() - stop_sent:.1f} s")
        return {**record, "ready": time.time(), "pid_after": new.pid, "ok": True}

    def _restart_by_command(self, n: int) -> dict[str, Any]:
        log = self.dir / "logs" / f"restart-{n}.log"
        self.say(f"restart {n}: running the target's restart command (output: {log.name})")
        started = time.time()
        timed_out = False
        with log.open("wb") as out:
            proc = subprocess.Popen(
                self.command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.dir,
                env=self.env,
                start_new_session=True,
                preexec_fn=death_signal_hook(),
            )
            try:
                code = proc.wait(timeout=self.command_timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                # Its whole process group (it was started as one, by its PID): a shell's
                # children would otherwise outlive the run.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                code = proc.wait()
        ended = time.time()
        ok = code == 0 and not timed_out
        if not ok:
            why = f"timed out after {self.command_timeout:g} s" if timed_out else f"exited with {code}"
            self.say(f"lab run: restart {n}: the restart command {why} (see {log})", err=True)
        return {
            "how": "command",
            "applicable": True,
            "stop_sent": started,
            "ready": ended,
            "exit_code": code,
            "timed_out": timed_out,
            "log": f"logs/{log.name}",
            "ok": ok,
        }

    def _write(self, record: dict[str, Any]) -> None:
        with (self.dir / FILE).open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
