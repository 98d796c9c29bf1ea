"""Locust's side of an MCP client: `McpClient` wraps ClientCore + SyncDriver, `McpUser`
builds one per simulated user.

Locust `request` events are fired for what a person running the load wants to see in
Locust's table: handshakes, tool calls, resumptions (with the resume latency as the
response time) and errors — not one per SSE event, which would cost a quarter of the
CPU (measured).
"""

from __future__ import annotations

import itertools
import logging
import ssl
import time
from pathlib import Path
from typing import Any

import httpx
from locust import User
from locust.env import Environment

from lab.client import (
    BackoffPolicy,
    CallFinished,
    CallHandle,
    CallOutcome,
    ClientConfig,
    ClientCore,
    LeaveFinished,
    Notice,
    ReconnectBudget,
    SessionEstablished,
    State,
)
from lab.drivers.sync import SyncDriver, default_client
from lab.inbox import InboxDatabase
from lab.load.clock import LoadZero, ScriptBook
from lab.load.settings import LoadSettings, client_revision, rng_for, run_tag, script_counters, token_for
from lab.wire.client_ledger import EventRejected, ReconnectAttempt, Record, Recovery
from lab.wire.redact import Redactor

REQUEST_TYPE = "MCP"
INJECTED_TYPE = "MCP injected fault"
"""The Locust request type of a call that failed after a response the lab's proxy marked as
its own injected fault (`x-lab-fault`): shown in Locust's table as an intended outcome,
not among its failures."""
TOOLS_WAIT_S = 5.0
"""How long a new client waits for the server's tools (the retry rule's tools/list) before
its first call."""
log = logging.getLogger(__name__)


class WorkerContext:
    """What all users of one worker process share: settings, the inbox/ledger file, the
    reconnect budget, the HTTP client, counters for progress."""

    def __init__(
        self, settings: LoadSettings, db: InboxDatabase, budget: ReconnectBudget, key: bytes, name: str
    ):
        self.settings = settings
        self.db = db
        self.budget = budget
        self.redactor = Redactor(key)
        # One TLS context for the process (building one per client costs milliseconds and
        # memory); one small connection pool per client, because httpcore scans its pool on
        # every request and a shared pool of thousands of open streams makes that quadratic.
        self.ssl = ssl.create_default_context()
        self.name = name
        self.run_tag = run_tag(key)
        """In every idempotency key (`<client>/<run_tag>/k<n>`): the run's own
        (lab.load.settings.run_tag), so a server that outlives a run does not take the
        next run's writes for retries of the last run's."""
        self._ids = itertools.count(1)
        self.clients: dict[str, McpClient] = {}
        """Every whole client of this worker that has not left, so that quitting can stop
        them all. A client is registered only once it is built (`McpClient.__init__`)."""
        self.counters: dict[str, int] = {
            "users": 0,
            "calls_ok": 0,
            "calls_failed": 0,
            "calls_unknown": 0,
            "calls_injected": 0,
            "reconnects": 0,
            "rejected": 0,
            "duplicates": 0,
            "recoveries": 0,
        }
        self.scripts = ScriptBook(settings.clients, LoadZero(Path(settings.run_dir), time.time()))
        if settings.clients:
            # The watcher ends the run once every script is done (lab.run.watch), and
            # does not take scripted clients waiting for their next `at` for a stall.
            self.counters.update(script_counters(len(settings.clients)))

    def http_client(self) -> httpx.Client:
        return default_client(verify=self.ssl, read_timeout=self.settings.read_timeout)

    def stop_all(self) -> None:
        """Stop every client (each writes its last records); one that fails to stop is
        logged and does not keep the others from stopping."""
        for c in list(self.clients.values()):
            try:
                c.stop()
            except Exception:
                log.exception("stopping client %s failed", c.client_id)

    def next_client_id(self) -> str:
        return f"w{self.name}-u{next(self._ids)}"


class McpClient:
    def __init__(self, environment: Environment, ctx: WorkerContext, client_id: str | None = None) -> None:
        """`client_id`: the ID to use verbatim (a scripted client's); by default the
        worker's next (`w<worker>-u<n>`)."""
        self.environment = environment
        self.ctx = ctx
        s = ctx.settings
        self.client_id = client_id if client_id is not None else ctx.next_client_id()
        token, subject = token_for(s, self.client_id)
        self.core = ClientCore(
            ClientConfig(
                client_id=self.client_id,
                protocol_version=client_revision(s, self.client_id),
                origin=s.origin,
                token=token,
                auth_subject=subject,
                open_standalone_stream=s.open_standalone_stream,
                backoff=BackoffPolicy(s.backoff_base, s.backoff_cap),
                max_attempts=s.max_attempts,
                resume_silence_s=s.resume_silence,
                stream_idle_s=s.stream_idle,
                retry_rule=True,  # re-send an unknown outcome only where the server says it is safe
            ),
            inbox=ctx.db.inbox(self.client_id),
            budget=ctx.budget,
            redactor=ctx.redactor,
            rng=rng_for(s, self.client_id),
        )
        self.finished: dict[str, CallFinished] = {}
        self.sessions = 0
        self.left: LeaveFinished | None = None
        self.http = ctx.http_client()
        self.driver = SyncDriver(
            self.core, s.url, self.http, on_records=self._records, on_notice=self._notice
        )
        self._keys = itertools.count(1)
        self.stopped = False
        """Stopped (after leaving, or at the worker's quit): it sends nothing more."""
        # Last: only a whole client is registered (nothing above yields to another
        # greenlet, and the driver starts nothing until it is first used).
        ctx.clients[self.client_id] = self

    # -- callbacks (under the driver's lock) -------------------------------------------

    def _records(self, records: list[Record]) -> None:
        self.ctx.db.record(records)
        c = self.ctx.counters
        for r in records:
            if isinstance(r, ReconnectAttempt):
                c["reconnects"] += 1
            elif isinstance(r, EventRejected):
                c["duplicates" if r.reason == "duplicate" else "rejected"] += 1
            elif isinstance(r, Recovery):
                c["recoveries"] += 1
                ok = r.recovered_at is not None
                self._fire(
                    f"resume ({r.path})",
                    ((r.recovered_at or time.time()) - r.lost_at) * 1000,
                    None if ok else RuntimeError(f"not recovered: {r.cause}"),
                )

    def _notice(self, notice: Notice) -> None:
        if isinstance(notice, CallFinished):
            self.finished[notice.call.operation_key] = notice
        elif isinstance(notice, SessionEstablished):
            self.sessions += 1
        elif isinstance(notice, LeaveFinished):
            self.left = notice

    def _fire(
        self, name: str, ms: float, error: BaseException | None, request_type: str = REQUEST_TYPE
    ) -> None:
        self.environment.events.request.fire(  # type: ignore[no-untyped-call]
            request_type=request_type,
            name=name,
            response_time=ms,
            response_length=0,
            exception=error,
            context={},
        )

    # -- what users do -----------------------------------------------------------------

    def connect(self) -> bool:
        t0 = time.time()
        self.driver.call(self.core.connect)
        ok = self.driver.wait_for(lambda: self.sessions > 0, self.ctx.settings.call_timeout)
        self._fire("initialize", (time.time() - t0) * 1000, None if ok else TimeoutError("no session"))
        if ok:
            # As clients do, the tools are known before the first call: a call lost before
            # they are is not re-sent (the retry rule: nothing is known safe), and the
            # lab's own client would report its outcome unknown for want of an answer it
            # had asked for. Bounded: a tools/list that never answers stops no one.
            self.driver.wait_for(lambda: not self.core.tools_pending, TOOLS_WAIT_S)
        return ok

    def call(self, tool: str, arguments: dict[str, Any], *, write: bool = False) -> CallFinished | None:
        if self.driver.stopped:
            return None  # the worker is quitting
        key = f"{self.client_id}/{self.ctx.run_tag}/k{next(self._keys)}" if write else None
        t0 = time.time()
        injected_before = self.driver.injected_responses
        handle: CallHandle = self.driver.call(
            self.core.call_tool, tool, arguments, idempotency_key=key, write=write
        )
        done = self._wait(handle)
        retries = 0
        # A write whose outcome is unknown is re-run explicitly, with the same key: the
        # server deduplicates it. (Reads are not retried: nothing depends on them.)
        while (
            write
            and done is not None
            and done.outcome is CallOutcome.UNKNOWN
            and retries < self.ctx.settings.write_retries
        ):
            retries += 1
            self.finished.pop(handle.operation_key, None)
            self.driver.call(self.core.retry_call, handle)
            done = self._wait(handle)
        c = self.ctx.counters
        ms = (time.time() - t0) * 1000
        if done is None:
            c["calls_unknown"] += 1
            self._fire(f"call {tool}", ms, TimeoutError("no outcome within the call timeout"))
        elif done.outcome is CallOutcome.OK:
            c["calls_ok"] += 1
            self._fire(f"call {tool}", ms, None)
        elif self.driver.injected_responses > injected_before:
            # The lab's proxy changed a response of this call on purpose (rewrote its
            # Origin, answered a storm's 429): the failure is the one the scenario asked
            # for. (Approximate, as a live count may be: any marked response of this client
            # during the call; the report joins each call to its own flows.)
            c["calls_injected"] += 1
            name = f"call {tool}: {done.outcome} {done.reason} ({self.driver.last_injected})"
            self._fire(name, ms, None, INJECTED_TYPE)
        else:
            c["calls_unknown" if done.outcome is CallOutcome.UNKNOWN else "calls_failed"] += 1
            self._fire(f"call {tool}", ms, RuntimeError(f"{done.outcome}: {done.reason}"))
        return done

    def _wait(self, handle: CallHandle) -> CallFinished | None:
        key = handle.operation_key
        self.driver.wait_for(lambda: key in self.finished, self.ctx.settings.call_timeout)
        return self.finished.get(key)

    def perform(self, op: str) -> CallFinished | None:
        """One operation of the task mix or of a script (`SCRIPT_OPS`): `read` calls
        `echo`, `stream` the `ticker` with the scenario's arguments, `write` the
        `ledger.append` with an idempotency key."""
        if op == "read":
            return self.call("echo", {"text": f"hello from {self.client_id}"})
        if op == "stream":
            return self.call("ticker", dict(self.ctx.settings.ticker))
        if op == "write":
            return self.call("ledger.append", {"entry": f"{self.client_id}@{time.time():.3f}"}, write=True)
        raise ValueError(f"unknown operation {op!r}: expected read, stream or write")

    def leave(self, timeout: float = 15.0) -> None:
        """DELETE the session (if there is one) and stop; a client that has stopped
        already does nothing (a scripted user leaves, then Locust's on_stop asks again)."""
        if self.stopped:
            return
        # The DELETE gets the patience a busy chain needs (at 6,000 clients leaving 25/s,
        # mitmdump passed some answers 5.6 s after the request): a client that gives up
        # sooner leaves an unanswered request behind and its session to the server's TTL.
        if self.core.state in (State.SESSION_ACTIVE,) and not self.driver.stopped:
            self.driver.call(self.core.leave)
            self.driver.wait_for(lambda: self.left is not None, timeout)
        self.stop()

    def stop(self) -> None:
        """Stop the driver (the core writes its last records) and close the HTTP pool (once)."""
        if self.stopped:
            return
        self.stopped = True
        try:
            self.driver.stop()
        finally:
            self.http.close()
            self.ctx.clients.pop(self.client_id, None)


WORKER: list[WorkerContext] = []
"""The worker's shared context, set by the locustfile's init hook (one per process)."""


class McpUser(User):
    """A Locust user that is a full MCP client; subclasses set tasks."""

    abstract = True

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        assert WORKER, "the locustfile must set the worker context in its init hook"
        self.client = self.new_client()

    def new_client(self) -> McpClient:
        """The user's client (a scripted user's uses its script's ID)."""
        return McpClient(self.environment, WORKER[0])

    def on_start(self) -> None:
        WORKER[0].counters["users"] += 1
        self.client.connect()

    def on_stop(self) -> None:
        WORKER[0].counters["users"] -= 1
        client: McpClient | None = getattr(self, "client", None)
        if client is not None:
            client.leave()

    def rejoin(self) -> None:
        """Leave (DELETE) and come back as a new client with a new session."""
        self.client.leave()
        self.client = self.new_client()
        self.client.connect()
