"""One selftest case, end to end, in black-box mode: the lab sees the reference server as
it would see anyone's.

1. `lab serve --port 0 --event-ids seq|uuid [--defect NAME]`, with its ledger and log in
   the selftest folder's `servers/<case>/`, away from the run folder: the checker gets no
   server ledger, and no admin token exists (the server is started without one).
2. `lab run SCENARIO --target URL --out runs/<case> --quiet`: the lab's whole chain
   (proxy and tap, nemesis, Locust) against that URL; its exit code and its report.json
   are the case's result.
3. The server is stopped by PID (SIGTERM, then SIGKILL), whatever happened.

Both children run in sessions of their own (a Ctrl-C at the terminal reaches only
`lab selftest`, which passes it on, so that `lab run` stops cleanly and keeps its
evidence) and are tied to this process by the kernel: they die with it, even after a
`kill -9`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab import topology
from lab.selftest.cases import Case

SERVER_READY_S = 30.0
STOP_GRACE_S = 10.0
RUN_SLACK_S = 120.0
"""How long past the scenario's hard timeout a `lab run` may take (start, stop, report)
before it is stopped as hung."""
PR_SET_PDEATHSIG = 1
HEARTBEAT_MS = 500
"""The server's heartbeat on standalone streams (a declared `notifications/message`): the
session's other streams then always have something sent after a resumption's cursor,
which a defect that replays other streams, or another session's standalone stream, shows."""


@dataclass(frozen=True, slots=True)
class CaseRun:
    """What one case produced."""

    case: Case
    exit_code: int | None
    """`lab run`'s exit code (None: it was never started)."""
    seconds: float
    """Wall time of the case: server start to server stop."""
    run_dir: Path | None
    """The run folder `lab run` made (None if it made none)."""
    report: dict[str, Any] | None
    """Its report.json (None when missing or unreadable)."""
    error: str | None = None
    """Why the case could not be made or judged (the server did not start, no report...)."""
    server_log: Path | None = None
    run_log: Path | None = None


class Children:
    """The processes of the cases now running, so that a signal can be passed on to them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self.stopping = threading.Event()

    def add(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._procs[proc.pid] = proc

    def remove(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._procs.pop(proc.pid, None)

    def send(self, sig: int) -> None:
        with self._lock:
            procs = list(self._procs.values())
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(sig)


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec function asking the kernel to SIGTERM the child when we die (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    parent = os.getpid()

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # we died between fork and prctl
            os._exit(1)

    return hook


def _start(argv: list[str], log: Path, children: Children) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent(),
        )
    children.add(proc)
    return proc


def _stop(proc: subprocess.Popen[bytes], children: Children) -> int | None:
    """SIGTERM by PID, then SIGKILL; its exit status."""
    try:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_GRACE_S)
        return proc.returncode
    finally:
        children.remove(proc)


def _wait_ready(proc: subprocess.Popen[bytes], log: Path, prefix: str, seconds: float) -> str:
    """The rest of the log line starting with `prefix` (the address); RuntimeError with the
    log's tail if it does not come."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    tail = " | ".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-3:])
    state = f"exited with {proc.returncode}" if proc.poll() is not None else f"not ready in {seconds:g} s"
    raise RuntimeError(f"lab serve {state}: {tail or 'no output'}")


def server_argv(case: Case, ledger: Path, event_ids: str) -> list[str]:
    """The reference server of a case: opaque IDs, no admin control, its ledger where the
    checker will not look."""
    argv = [topology.LOCAL.program("lab"), "serve", "--host", "127.0.0.1", "--port", "0"]
    argv += ["--event-ids", event_ids, "--ledger", str(ledger), "--heartbeat-ms", str(HEARTBEAT_MS)]
    if case.defect is not None:
        argv += ["--defect", case.defect]
    return argv + list(case.server_args)


def run_argv(scenario: Path, url: str, out: Path, *, figures: bool = True) -> list[str]:
    return [
        topology.LOCAL.program("lab"),
        "run",
        str(scenario),
        "--target",
        url,
        "--out",
        str(out),
        "--quiet",
        *([] if figures else ["--no-figures"]),
    ]


def run_case(
    case: Case,
    folder: Path,
    scenario: Path,
    *,
    event_ids: str,
    hard_timeout_s: float,
    children: Children,
    figures: bool = True,
    attempt: int = 1,
) -> CaseRun:
    """Run one case (its `attempt`-th try: `runs/<case>.<attempt>` after the first); never
    raises for what a child did (that is in the CaseRun)."""
    started = time.monotonic()
    name = case.name if attempt == 1 else f"{case.name}.{attempt}"
    servers = folder / "servers" / name
    runs = folder / "runs" / name
    servers.mkdir(parents=True)
    runs.mkdir(parents=True)
    server_log, run_log = servers / "serve.log", runs / "lab-run.log"
    server = _start(server_argv(case, servers / "ledger.sqlite", event_ids), server_log, children)
    code: int | None = None
    error: str | None = None
    try:
        url = _wait_ready(server, server_log, topology.SERVE_READY, SERVER_READY_S)
        if not children.stopping.is_set():
            run = _start(run_argv(scenario, url, runs, figures=figures), run_log, children)
            try:
                code = run.wait(hard_timeout_s + RUN_SLACK_S)
            except subprocess.TimeoutExpired:
                error = f"lab run did not end within {hard_timeout_s + RUN_SLACK_S:g} s: stopped"
            finally:
                _stop(run, children)
                if code is None and error is None:
                    code = run.returncode
    except RuntimeError as e:
        error = str(e)
    finally:
        server_code = _stop(server, children)
    if code is not None and server_code not in (0, None) and error is None:
        error = f"lab serve exited with {server_code} (see {server_log})"
    run_dir = _run_folder(runs)
    report = _read_report(run_dir)
    if report is None and error is None and code is not None:
        error = f"lab run exited {code} without a readable report.json (see {run_log})"
    return CaseRun(case, code, time.monotonic() - started, run_dir, report, error, server_log, run_log)


def _run_folder(root: Path) -> Path | None:
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    return folders[-1] if folders else None


def _read_report(run_dir: Path | None) -> dict[str, Any] | None:
    if run_dir is None:
        return None
    try:
        doc = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
