"""Start an adapter process and talk to it: commands to its stdin, its application log
(its stdout) into a file.

    cmd = adapter_command("python-sdk")           # or "typescript-sdk", or "cmd:<command>"
    with AdapterProcess(cmd, log_path, key=run_key) as adapter:
        ready = adapter.wait_ready()                # the `ready` record: implementation name, version
        adapter.send(Start("c1", url, None))
        ...
    records = read_app_log(log_path)

`adapter_command` refuses an adapter that cannot run here at once, with a message that
says what to do (`AdapterUnavailable`): no Node.js, or the TypeScript SDK not installed.
Safe under gevent (Locust) too: only the standard library's subprocess and a lock.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from lab.sut.protocol import Command, Stop, command_line, parse_record

BUILT_IN = ("python-sdk", "typescript-sdk")
TS_SDK = "@modelcontextprotocol/sdk"
NODE_DIR_ENV = "LAB_NODE_DIR"


class AdapterUnavailable(RuntimeError):
    """This adapter cannot run on this machine; the message says what to install."""


class AdapterFailed(RuntimeError):
    """The adapter process exited or never said `ready`; the message carries its stderr."""


@dataclass(frozen=True, slots=True)
class AdapterCommand:
    name: str
    """`python-sdk`, `typescript-sdk` or `cmd`."""
    argv: tuple[str, ...]


def node_dir() -> Path:
    """Where `make node-adapter` installs the TypeScript SDK: $LAB_NODE_DIR, else ./.node."""
    return Path(os.environ.get(NODE_DIR_ENV) or ".node").resolve()


def typescript_script() -> Path:
    """The Node adapter script, shipped as package data of `lab.sut`."""
    return Path(str(files("lab.sut") / "typescript" / "adapter.mjs"))


def adapter_command(spec: str) -> AdapterCommand:
    """The command line of the adapter a `--client` value names; AdapterUnavailable or
    ValueError (with the accepted values) when it cannot be had."""
    if spec == "python-sdk":
        return AdapterCommand(spec, (sys.executable, "-m", "lab.sut.python_sdk"))
    if spec == "typescript-sdk":
        node = shutil.which("node")
        if node is None:
            raise AdapterUnavailable(
                "--client typescript-sdk needs Node.js: no `node` on PATH "
                "(install Node.js 18 or newer, then run `make node-adapter`)"
            )
        where = node_dir()
        if not (where / "node_modules" / TS_SDK / "package.json").is_file():
            raise AdapterUnavailable(
                f"--client typescript-sdk needs {TS_SDK} installed in {where}: run `make node-adapter` "
                f"(or set {NODE_DIR_ENV} to the folder that holds its node_modules)"
            )
        return AdapterCommand(spec, (node, str(typescript_script()), "--modules", str(where)))
    if spec.startswith("cmd:"):
        argv = tuple(shlex.split(spec[4:]))
        if not argv:
            raise ValueError("--client cmd:<command> needs a command, e.g. cmd:'python my_adapter.py'")
        return AdapterCommand("cmd", argv)
    raise ValueError(f"--client must be one of lab, {', '.join(BUILT_IN)} or cmd:<command>; got {spec!r}")


def read_app_log(path: Path) -> list[dict[str, Any]]:
    """Every record of an application log; ValueError names the file and line of a bad one.
    A last line without its newline (the adapter was killed mid-write) is left out."""
    records = []
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    for n, line in enumerate(lines[:-1], 1):
        if line.strip():
            try:
                records.append(parse_record(line))
            except ValueError as e:
                raise ValueError(f"{path}:{n}: {e}") from None
    return records


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec function that has the kernel send the adapter SIGTERM (a `stop`) when the
    process that started it dies, whatever kills it (Linux; None elsewhere). Looked up
    before the fork: the child only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    parent = os.getpid()

    def tie() -> None:
        prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died between fork and prctl
            os._exit(1)

    return tie


class AdapterProcess:
    """One running adapter. `send` may be called from any thread or greenlet.

    `die_with_parent`: the adapter gets SIGTERM when the process that started it dies (a
    Locust worker killed by `lab run`), so no adapter outlives its host."""

    def __init__(
        self,
        cmd: AdapterCommand,
        log: Path,
        *,
        key: bytes,
        stderr: Path | None = None,
        cwd: Path | None = None,
        die_with_parent: bool = False,
    ) -> None:
        self.cmd = cmd
        self.log = log
        self.stderr = stderr or log.with_suffix(".stderr")
        self._lock = threading.Lock()
        env = {**os.environ, "LAB_LEDGER_KEY": key.hex()}
        log.parent.mkdir(parents=True, exist_ok=True)
        hook = _die_with_parent() if die_with_parent else None
        with log.open("ab") as out, self.stderr.open("ab") as err:
            try:
                self.proc = subprocess.Popen(
                    cmd.argv, stdin=subprocess.PIPE, stdout=out, stderr=err, env=env, cwd=cwd, preexec_fn=hook
                )
            except OSError as e:
                raise AdapterUnavailable(f"cannot start adapter {shlex.join(cmd.argv)}: {e}") from None
        assert self.proc.stdin is not None
        self._stdin: IO[bytes] = self.proc.stdin

    def _stderr_tail(self) -> str:
        text = self.stderr.read_text(errors="replace") if self.stderr.exists() else ""
        return text[-3000:]

    def wait_ready(self, timeout: float = 30.0) -> dict[str, Any]:
        """The adapter's `ready` record (it names the implementation and its version)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.log.exists():
                for line in self.log.read_text(encoding="utf-8", errors="replace").splitlines():
                    if '"ready"' in line:
                        rec = parse_record(line)
                        if rec["ev"] == "ready":
                            return rec
            if self.proc.poll() is not None:
                raise AdapterFailed(
                    f"adapter {self.cmd.name} exited with {self.proc.returncode} before `ready`:\n"
                    + self._stderr_tail()
                )
            time.sleep(0.05)
        raise AdapterFailed(
            f"adapter {self.cmd.name} said no `ready` within {timeout}s:\n" + self._stderr_tail()
        )

    def send(self, cmd: Command) -> None:
        self.send_raw(command_line(cmd))

    def send_raw(self, line: str) -> None:
        """One line as it is (a well-formed command comes from `send`; this is for testing
        what an adapter does with a bad one)."""
        data = (line if line.endswith("\n") else line + "\n").encode("utf-8")
        with self._lock:
            try:
                self._stdin.write(data)
                self._stdin.flush()
            except (BrokenPipeError, ValueError):
                raise AdapterFailed(
                    f"adapter {self.cmd.name} is gone (exit {self.proc.poll()}):\n" + self._stderr_tail()
                ) from None

    def stop(self, timeout: float = 20.0) -> int:
        """`stop`, end of input, then SIGTERM and SIGKILL by PID if it does not go; its exit code."""
        if self.proc.poll() is None:
            with contextlib.suppress(AdapterFailed):
                self.send(Stop())
            with self._lock, contextlib.suppress(OSError):
                self._stdin.close()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=5)
        return self.proc.returncode

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def implementation_of(ready: dict[str, Any]) -> str:
    """`name version` of a `ready` record, for run.json and the report."""
    impl = ready.get("implementation") or {}
    return f"{impl.get('name', '?')} {impl.get('version', '?')}"


__all__ = [
    "BUILT_IN",
    "AdapterCommand",
    "AdapterFailed",
    "AdapterProcess",
    "AdapterUnavailable",
    "adapter_command",
    "implementation_of",
    "node_dir",
    "read_app_log",
    "typescript_script",
]
