"""The adapter loop for Python implementations: commands in, application log out.

`serve(driver)` reads commands (`lab.sut.protocol`) from stdin, runs every client of the
process on one anyio event loop (asyncio, uvloop when installed), and writes the
application log. A driver only knows its implementation: how to open a client (an async
context manager whose exit is the implementation's own way of leaving) and how to call a
tool. Everything the protocol promises — outcomes for every call, `cancelled` only when
the application asked, lifecycle lines, pseudonyms instead of raw session IDs — is kept
here, once, for every driver.

Exit codes (`lab.exitcodes`): 0 after `stop` or end of input, 3 when the adapter cannot
run (no `LAB_LEDGER_KEY`, a log file it cannot open), 4 when the adapter itself crashed.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, suppress
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

import anyio
import anyio.abc
import anyio.from_thread
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from lab.exitcodes import ExitCode
from lab.logscrub import scrub_stderr
from lab.sut.applog import AppLog, ClientContext, current_client
from lab.sut.protocol import (
    SCHEMA,
    Call,
    Cancel,
    CommandError,
    Leave,
    Start,
    Stop,
    parse_command,
    secrets_of_headers,
)
from lab.wire.redact import Redactor

STOP_GRACE_S = 10.0
"""How long `stop` waits for clients to leave before it abandons them."""


class CallFailed(Exception):
    """The implementation handed the application a JSON-RPC error for the call."""

    def __init__(self, code: int | None, message: str) -> None:
        super().__init__(message)
        self.code = code


class Connected(Protocol):
    """A started client of the implementation."""

    @property
    def protocol_version(self) -> str | None: ...

    async def call(self, call: Call) -> None:
        """Run the tool call; return on a result, raise CallFailed on a JSON-RPC error."""


class Driver(Protocol):
    adapter: str
    """The adapter's name in the `ready` line (`python-sdk`)."""
    implementation: tuple[str, str]
    """(name, version) of the implementation, e.g. ("mcp", "2.3.0")."""

    def open(self, start: Start, ctx: ClientContext) -> AbstractAsyncContextManager[Connected]:
        """Start a client; leaving the context is the implementation's way of leaving (DELETE)."""
        ...


@dataclass
class _CallState:
    cmd: Call
    t0: float
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    cancel_asked: bool = False
    done: bool = False


@dataclass
class _ClientState:
    start: Start
    ctx: ClientContext
    keys: dict[str, str]
    leave: anyio.Event = field(default_factory=anyio.Event)
    tg: anyio.abc.TaskGroup | None = None
    conn: Connected | None = None
    queued: list[Call] = field(default_factory=list)
    calls: dict[str, _CallState] = field(default_factory=dict)
    leaving: bool = False
    ended: anyio.Event = field(default_factory=anyio.Event)
    end_reason: str = ""


def _error_text(e: BaseException) -> str:
    if isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
        return _error_text(e.exceptions[0])
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class Adapter:
    def __init__(self, driver: Driver, log: AppLog, redactor: Redactor) -> None:
        self.driver = driver
        self.log = log
        self.redactor = redactor
        self.clients: dict[str, _ClientState] = {}
        self.calls: dict[str, _ClientState] = {}

    # -- commands --------------------------------------------------------------------------

    def handle(self, line: bytes, lineno: int, tg: anyio.abc.TaskGroup) -> bool:
        """Carry out one command line; False after `stop`."""
        try:
            cmd = parse_command(line)
        except CommandError as e:
            self.log.write("rejected", flush=True, line=lineno, error=str(e))
            return True
        match cmd:
            case Start():
                if cmd.client in self.clients:
                    self.log.write("rejected", line=lineno, error=f"start: client {cmd.client!r} exists")
                    return True
                keys: dict[str, str] = {}
                cl = _ClientState(cmd, ClientContext(cmd.client, self.log, self.redactor, keys), keys)
                for secret in secrets_of_headers(cmd.headers):
                    cl.ctx.scrub.add(secret, "<credential>")
                self.clients[cmd.client] = cl
                tg.start_soon(self._run_client, cl, name=f"client {cmd.client}")
            case Call():
                cl_or_none = self.clients.get(cmd.client)
                if cl_or_none is None or cmd.call in self.calls:
                    why = "unknown client" if cl_or_none is None else "call ID already used"
                    self.log.write("rejected", line=lineno, error=f"call {cmd.call!r}: {why}")
                    return True
                cl = cl_or_none
                self.calls[cmd.call] = cl
                cl.keys[cmd.idempotency_key] = cmd.call
                if cl.ended.is_set():
                    gone = _CallState(cmd, time.time())
                    self._outcome(cl, gone, "exception", f"client ended: {cl.end_reason}", None)
                elif cl.tg is None or cl.conn is None:
                    cl.queued.append(cmd)  # the application called before the client was up
                else:
                    self._spawn_call(cl, cmd)
            case Cancel():
                owner = self.calls.get(cmd.call)
                running = owner.calls.get(cmd.call) if owner is not None else None
                if running is None or running.done:
                    self.log.write("rejected", line=lineno, error=f"cancel: no running call {cmd.call!r}")
                    return True
                running.cancel_asked = True
                running.scope.cancel()
            case Leave():
                leaving = self.clients.get(cmd.client)
                if leaving is None:
                    self.log.write("rejected", line=lineno, error=f"leave: unknown client {cmd.client!r}")
                    return True
                leaving.leaving = True
                leaving.leave.set()
            case Stop():
                return False
        return True

    # -- clients ---------------------------------------------------------------------------

    async def _run_client(self, cl: _ClientState) -> None:
        ctx, t0 = cl.ctx, time.time()
        current_client.set(ctx)
        started = False
        failure: str | None = None
        try:
            async with self.driver.open(cl.start, ctx) as conn:
                started = True
                self.log.write(
                    "started",
                    flush=True,
                    client=ctx.client,
                    session=ctx.session,
                    protocolVersion=conn.protocol_version,
                    elapsed_s=round(time.time() - t0, 6),
                )
                async with anyio.create_task_group() as calls_tg:
                    cl.tg, cl.conn = calls_tg, conn
                    for queued in cl.queued:
                        self._spawn_call(cl, queued)
                    cl.queued.clear()
                    await cl.leave.wait()
                    cl.leaving = True
                    calls_tg.cancel_scope.cancel()
        except Exception as e:
            failure = ctx.scrub(_error_text(e))
        except anyio.get_cancelled_exc_class():
            failure = "abandoned: it did not leave within the stop grace period"
            raise
        finally:
            cl.tg = cl.conn = None
            reason = failure or ("left" if started else "client did not start")
            for st in cl.calls.values():
                if not st.done:
                    self._outcome(cl, st, "exception", f"client ended: {reason}", None)
            for queued in cl.queued:
                st = _CallState(queued, time.time())
                self._outcome(cl, st, "exception", f"client ended: {reason}", None)
            cl.queued.clear()
            cl.end_reason = reason
            if failure is None:
                self.log.write("left", flush=True, client=ctx.client, session=ctx.session)
            elif started:
                self.log.write(
                    "client_failed", flush=True, client=ctx.client, session=ctx.session, error=failure
                )
            else:
                self.log.write("start_failed", flush=True, client=ctx.client, error=failure)
            cl.ended.set()

    def _spawn_call(self, cl: _ClientState, cmd: Call) -> None:
        assert cl.tg is not None and cl.conn is not None
        st = _CallState(cmd, time.time())
        cl.calls[cmd.call] = st
        cl.tg.start_soon(self._run_call, cl, st, cl.conn, name=f"call {cmd.call}")

    async def _run_call(self, cl: _ClientState, st: _CallState, conn: Connected) -> None:
        try:
            with st.scope:
                await conn.call(st.cmd)
                self._outcome(cl, st, "ok", None, None)
                return
        except CallFailed as e:
            self._outcome(cl, st, "error", cl.ctx.scrub(str(e)), e.code)
            return
        except anyio.get_cancelled_exc_class():
            if st.cancel_asked or cl.leaving:
                self._outcome(cl, st, "cancelled", "cancel" if st.cancel_asked else "leave", None)
            raise  # otherwise the client is failing: _run_client records the outcome with its cause
        except Exception as e:
            self._outcome(cl, st, "exception", cl.ctx.scrub(_error_text(e)), None)
            return
        if st.cancel_asked:  # the scope swallowed the cancellation the application asked for
            self._outcome(cl, st, "cancelled", "cancel", None)

    def _outcome(
        self, cl: _ClientState, st: _CallState, status: str, error: str | None, code: int | None
    ) -> None:
        if st.done:
            return
        st.done = True
        self.log.write(
            "outcome",
            flush=True,  # a host waits for it (Locust users do): never hold it back
            client=cl.ctx.client,
            session=cl.ctx.session,
            call=st.cmd.call,
            id=cl.ctx.call_rpc.get(st.cmd.call),
            status=status,
            error=error,
            code=code,
            elapsed_s=round(time.time() - st.t0, 6),
        )

    async def stop(self) -> None:
        for cl in self.clients.values():
            cl.leaving = True
            cl.leave.set()
        with anyio.move_on_after(STOP_GRACE_S):
            for cl in list(self.clients.values()):
                await cl.ended.wait()


def _stdin_lines() -> MemoryObjectReceiveStream[list[bytes] | None]:
    """Lines of stdin in batches (whatever one read returned), read by a daemon thread: works
    for pipes, files and terminals, never holds the loop up at exit, and costs the loop one
    wake-up per batch, not per line. None at end of input. Call from the event loop."""
    send: MemoryObjectSendStream[list[bytes] | None]
    recv: MemoryObjectReceiveStream[list[bytes] | None]
    send, recv = anyio.create_memory_object_stream[list[bytes] | None](100)
    token = anyio.lowlevel.current_token()

    def pump() -> None:
        # os.read on the descriptor, not sys.stdin.buffer: a daemon thread blocked inside the
        # buffered reader's lock makes the interpreter abort at exit.
        fd, pending = sys.stdin.fileno(), b""
        with suppress(Exception):  # the loop is gone: nobody is listening any more
            while chunk := os.read(fd, 1 << 16):
                *lines, pending = (pending + chunk).split(b"\n")
                if lines:
                    anyio.from_thread.run(send.send, lines, token=token)
            if pending:
                anyio.from_thread.run(send.send, [pending], token=token)
            anyio.from_thread.run(send.send, None, token=token)

    threading.Thread(target=pump, name="stdin", daemon=True).start()
    return recv


async def _serve(driver: Driver, log: AppLog, redactor: Redactor) -> None:
    adapter = Adapter(driver, log, redactor)
    name, version = driver.implementation
    log.write(
        "ready",
        flush=True,
        schema=SCHEMA,
        adapter=driver.adapter,
        implementation={"name": name, "version": version},
        pid=os.getpid(),
    )

    async def flusher() -> None:
        while True:
            await anyio.sleep(0.2)
            log.flush()

    reading = anyio.CancelScope()

    async def on_signal() -> None:
        # SIGTERM/SIGINT is a `stop`: clients leave their way, the log ends with `stopped`.
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                reading.cancel()
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(flusher)
        tg.start_soon(on_signal)
        with reading, _stdin_lines() as batches:
            lineno = 0
            async for batch in batches:
                if batch is None:
                    break
                for line in batch:
                    lineno += 1
                    if line.strip() and not adapter.handle(line, lineno, tg):
                        reading.cancel()
                        break
        await adapter.stop()
        log.write("stopped", flush=True, clients=len(adapter.clients))
        tg.cancel_scope.cancel()


def serve(make_driver: Callable[[], Driver], argv: list[str] | None = None, *, prog: str) -> int:
    """The adapter's `main`: parse the command line, run until `stop`, return the exit code."""
    parser = argparse.ArgumentParser(prog=prog, description="An MCP client adapter (docs/clients.md).")
    parser.add_argument("--log", help="write the application log to this file instead of stdout")
    args = parser.parse_args(argv)
    scrub_stderr()  # no token or session ID in its log, whoever prints it (a library's traceback)
    key_hex = os.environ.get("LAB_LEDGER_KEY", "")
    try:
        redactor = Redactor(bytes.fromhex(key_hex))
    except ValueError:
        print(f"{prog}: LAB_LEDGER_KEY must be the run's pseudonym key (hex, >= 16 bytes)", file=sys.stderr)
        return ExitCode.CANNOT_RUN
    try:
        out: IO[str] = open(args.log, "a", encoding="utf-8") if args.log else sys.stdout  # noqa: SIM115
    except OSError as e:
        print(f"{prog}: cannot open the application log {args.log}: {e}", file=sys.stderr)
        return ExitCode.CANNOT_RUN
    log = AppLog(out)
    with suppress(ValueError, OSError):  # each client holds a few sockets: allow what the system allows
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        driver = make_driver()
        try:
            import uvloop  # noqa: F401  (the event loop is the adapter's budget: use the fast one)

            options: dict[str, Any] = {"use_uvloop": True}
        except ImportError:
            options = {}
        anyio.run(_serve, driver, log, redactor, backend="asyncio", backend_options=options)
    except Exception as e:
        traceback.print_exc()
        log.write("crashed", flush=True, error=_error_text(e))
        return ExitCode.LAB_FAILED
    finally:
        log.flush()
        if out is not sys.stdout:
            out.close()
    return ExitCode.PASS
