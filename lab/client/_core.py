"""The MCP Streamable HTTP client, with no I/O: facts in, commands out.

`ClientCore` is one client: one session (re-established when lost), the standalone GET
stream, one POST stream per tool call, and the reconnect logic. It never touches a
socket or a clock: its driver passes the time (`now`, Unix epoch seconds) with every
call and carries out the `SendRequest` / `CloseConnection` commands it returns.

    driver                                   ClientCore
    ------                                   ----------
    connect(now)                      ->     [SendRequest(initialize)]
    response_head(conn, status, hdrs) ->     [...]
    response_data(conn, bytes)        ->     [...]   every SSE event goes through
    response_end(conn) / connection_failed(conn)      accept_stream_event()
    tick(now) when now >= next_wakeup()  ->  [SendRequest(resume ...)]

Rules it keeps (docs/spec.md):
- the session ID from the InitializeResult goes on every later request; a 404 to a request
  that carried it ends the session: calls in flight are reported outcome-UNKNOWN (never
  re-sent silently) and a new initialize *without* a session ID is the next request;
- a dropped connection is not a cancellation; `cancel` sends `notifications/cancelled`;
- a lost stream is resumed with GET + `Last-Event-ID` = the inbox watermark of *that*
  stream, after checking the cursor belongs to this session and stream; never earlier
  than the server's `retry` / `Retry-After`, with backoff and jitter otherwise, and only
  when the shared `ReconnectBudget` grants a token. A call whose stream cannot be resumed
  (no cursor, or the server refused it) is re-sent with the same idempotency key;
- DELETE on leave; 405 means "termination unsupported", never a deletion receipt.

Every reconnect — resume, new handshake, re-sent call, reopened standalone stream,
repeated DELETE — is a `PendingReconnect`: planned, then let through by the budget.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from lab.client._acceptance import (
    ALL_CHECKS,
    Acceptance,
    Check,
    ConnectionView,
    InboxStore,
    Outcome,
    RejectReason,
    SessionView,
    StreamView,
    accept_stream_event,
)
from lab.client._commands import (
    CallFinished,
    CallHandle,
    CallOutcome,
    CloseConnection,
    Command,
    Headers,
    LeaveFinished,
    LeaveReceipt,
    Notice,
    Progress,
    Purpose,
    SendRequest,
    SessionEstablished,
    SessionLost,
)
from lab.client._reconnect import BackoffPolicy, PendingReconnect, ReconnectBudget, parse_retry_after
from lab.client._states import Machine, Role, State, Trigger
from lab.wire import jsonrpc
from lab.wire.client_ledger import (
    EventRejected,
    HttpExchange,
    OperationRecord,
    ReconnectAttempt,
    Record,
    Recovery,
    SessionEvent,
)
from lab.wire.errors import LocalProtocolError, RemoteProtocolError
from lab.wire.event_ids import (
    CursorVerdict,
    classify_opaque,
    classify_structured,
    parse_event_id,
    post_stream_id,
    session_tag,
)
from lab.wire.extensions import EVENT_ID_CAPABILITY, IDEMPOTENCY_META, LAB_CONN_HEADER
from lab.wire.redact import Redactor
from lab.wire.revisions import (
    LAST_EVENT_ID_HEADER,
    PROTOCOL_VERSION_HEADER,
    SESSION_HEADER,
    SUPPORTED_REVISIONS,
    revision,
)
from lab.wire.sse import SseDecoder, SseEvent

_RETRY_STATUSES = frozenset({429, 503})
_UNKNOWN_STATUSES = frozenset({502, 504})
_CURSOR_REFUSED_STATUSES = frozenset({400, 405, 409, 410, 422})
_UNTRUSTED_CONNECTION = frozenset(
    {RejectReason.CURSOR_GAP, RejectReason.PROTOCOL_VERSION_MISMATCH, RejectReason.SUBJECT_MISMATCH}
)


@dataclass(frozen=True, slots=True)
class ClientConfig:
    client_id: str
    protocol_version: str = "2025-11-25"
    origin: str | None = "http://127.0.0.1"
    token: str | None = None
    auth_subject: str | None = None
    """Who the token belongs to (the client knows its own identity)."""
    open_standalone_stream: bool = True
    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)
    max_attempts: int = 12
    """Reconnect attempts per loss before giving up (the operation becomes UNKNOWN)."""
    max_delete_attempts: int = 3
    checks: frozenset[Check] = ALL_CHECKS
    """Acceptance checks; only tests switch some off to show what they stop."""
    client_name: str = "mcp-lab-client"

    def __post_init__(self) -> None:
        revision(self.protocol_version)  # KeyError naming what is supported
        if self.max_attempts < 1:
            raise LocalProtocolError("max_attempts must be >= 1")


@dataclass(slots=True)
class _Recovery:
    """A call's recovery, from its first loss to its next accepted message (or its end)."""

    stream_key: str
    cause: str
    lost_at: float
    attempts: int = 0
    reinitialized: bool = False


@dataclass(eq=False, slots=True)
class _Call:
    handle: CallHandle
    arguments: jsonrpc.JsonObject
    write: bool
    started_at: float
    attempts: int = 0
    request_id: int | None = None
    stream_key: str | None = None
    queued: bool = True
    done: bool = False
    resend: PendingReconnect = field(default_factory=PendingReconnect)
    recovery: _Recovery | None = None


@dataclass(eq=False, slots=True)
class _Stream:
    key: str
    machine: Machine
    generation: int
    request_id: int | None
    call: _Call | None
    server_stream_id: str | None
    conn_id: int | None
    ended: bool = False
    retry_ms: int | None = None
    resume: PendingReconnect = field(default_factory=PendingReconnect)

    @property
    def state(self) -> State:
        return self.machine.state


@dataclass(eq=False, slots=True)
class _Conn:
    conn_id: int
    purpose: Purpose
    method: str
    view: ConnectionView
    started_at: float
    stream_key: str | None
    call: _Call | None
    carried_session: bool
    last_event_id: str | None
    status: int | None = None
    sse: bool = False
    decoder: SseDecoder | None = None
    body: bytearray = field(default_factory=bytearray)
    synthetic: int = 0
    retry_after: float | None = None
    session: str | None = None
    """Pseudonym of the session ID the request carried (None if it carried none)."""


class ClientCore:
    """One MCP client, sans-IO. See the module docstring for the protocol with the driver."""

    def __init__(
        self,
        config: ClientConfig,
        *,
        inbox: InboxStore,
        budget: ReconnectBudget,
        redactor: Redactor,
        rng: random.Random,
    ) -> None:
        self.config = config
        self.inbox = inbox
        self.budget = budget
        self.redactor = redactor
        self.rng = rng
        self.session = Machine(Role.SESSION)
        self.session_id: str | None = None
        self.generation = 0
        self.protocol_version = config.protocol_version
        self.structured_ids = False
        self.server_generation: int | None = None
        self._tag: str | None = None
        self._token = config.token
        self._subject = config.auth_subject
        self.records: list[Record] = []
        self.notices: deque[Notice] = deque()
        self.calls: dict[str, _Call] = {}
        self.streams: dict[str, _Stream] = {}
        self._conns: dict[int, _Conn] = {}
        self._next_conn = 1
        self._next_request = 1
        self._next_standalone = 1
        self._standalone: str | None = None
        self._pending_session_id: str | None = None
        self._reinit = PendingReconnect()
        self._after_loss = False
        """The handshake in progress replaces a session that was lost (not the first one)."""
        self._reopen = PendingReconnect()
        self._reopen_from: str | None = None
        self._leaving = False
        self._delete = PendingReconnect()

    # ------------------------------------------------------------------ public API

    @property
    def state(self) -> State:
        return self.session.state

    @property
    def session_pseudonym(self) -> str | None:
        return self.redactor.session(self.session_id)

    def stream_key_of(self, conn_id: int) -> str | None:
        """The client's name of the stream a connection carries (None if none, or unknown)."""
        conn = self._conns.get(conn_id)
        return None if conn is None else conn.stream_key

    def set_token(self, token: str | None, subject: str | None) -> None:
        """Rotate the bearer token; connections opened before keep their old subject."""
        self._token, self._subject = token, subject

    def connect(self, now: float) -> list[Command]:
        """Start the first handshake."""
        if self.session.state is not State.REINITIALIZE_REQUIRED or self._reinit.at is not None:
            raise LocalProtocolError(f"connect() in {self.session.state}")
        return self._send_initialize(now)

    def call_tool(
        self,
        name: str,
        arguments: jsonrpc.JsonObject,
        now: float,
        *,
        idempotency_key: str | None = None,
        write: bool = False,
    ) -> tuple[CallHandle, list[Command]]:
        """Start a logical operation. It is sent now if the session is active, else queued."""
        if self._leaving:
            raise LocalProtocolError("call_tool() after leave()")
        key = idempotency_key or f"{self.config.client_id}/op/{len(self.calls) + 1}"
        if key in self.calls:
            raise LocalProtocolError(f"operation {key!r} already exists; use retry_call()")
        call = _Call(CallHandle(key, name), dict(arguments), write, now)
        self.calls[key] = call
        return call.handle, self._send_call(call, now)

    def retry_call(self, handle: CallHandle, now: float) -> list[Command]:
        """Explicitly re-run an operation whose outcome was UNKNOWN (same idempotency key)."""
        call = self.calls[handle.operation_key]
        if not call.done:
            raise LocalProtocolError(f"operation {handle.operation_key!r} is still running")
        call.done = False
        call.resend = PendingReconnect()
        return self._send_call(call, now)

    def cancel(self, handle: CallHandle, now: float, reason: str = "cancelled by user") -> list[Command]:
        """Cancel = `notifications/cancelled`, never just a dropped connection."""
        call = self.calls[handle.operation_key]
        if call.done:
            return []
        cmds: list[Command] = []
        if call.request_id is not None and not call.queued and self._session_usable():
            body = jsonrpc.notification(jsonrpc.CANCELLED, {"requestId": call.request_id, "reason": reason})
            cmds.append(self._open(Purpose.CANCEL, "POST", now, body=body))
        st = self.streams.get(call.stream_key or "")
        if st is not None and st.machine.can(Trigger.CANCELLED):
            st.machine.process(Trigger.CANCELLED)
            cmds += self._close_stream_conn(st, now, "cancelled")
        self._finish_call(call, CallOutcome.CANCELLED, now, reason=reason)
        return cmds

    def leave(self, now: float) -> list[Command]:
        """Close streams and DELETE the session."""
        self._leaving = True
        self._reopen.cancel()
        cmds: list[Command] = []
        for st in list(self.streams.values()):
            if st.call is None and st.machine.can(Trigger.CANCELLED):
                st.machine.process(Trigger.CANCELLED)
                cmds += self._close_stream_conn(st, now, "leaving")
        if self.session.state is State.SESSION_ACTIVE and self.session_id is not None:
            self.session.process(Trigger.DELETE_SENT)
            self._delete.lose(now, "leaving")
            cmds.append(self._open(Purpose.DELETE, "DELETE", now))
        elif self.session.state is State.SESSION_ACTIVE:
            self.notices.append(LeaveFinished(LeaveReceipt.NO_SESSION, now))
        return cmds

    def close_all(self, now: float, reason: str = "client_stopped") -> list[Command]:
        """The client stops (its process is quitting): end every open connection, so that
        each still has its exchange record, and cancel every pending reconnect."""
        for p in self._pendings():
            p.cancel()
        cmds: list[Command] = []
        for conn in list(self._conns.values()):
            cmds += self._abort(conn, now, reason)
        return cmds

    def _pendings(self) -> list[PendingReconnect]:
        out = [self._reinit, self._delete, self._reopen]
        out += [st.resume for st in self.streams.values()]
        out += [c.resend for c in self.calls.values()]
        return out

    def next_wakeup(self) -> float | None:
        times = [p.at for p in self._pendings() if p.at is not None]
        return min(times) if times else None

    def tick(self, now: float) -> list[Command]:
        """Run whatever is due at `now` (reconnects held by backoff or the budget)."""
        cmds: list[Command] = []
        if self._reinit.due(now):
            cmds += self._go_reinit(now)
        if self._delete.due(now):
            cmds += self._go_delete(now)
        if self._reopen.due(now):
            cmds += self._go_reopen(now)
        for st in list(self.streams.values()):
            if st.resume.due(now):
                cmds += self._go_resume(st, now)
        for call in list(self.calls.values()):
            if call.resend.due(now):
                cmds += self._go_resend(call, now)
        return cmds

    # ------------------------------------------------------------------ driver events

    def response_head(
        self, conn_id: int, status: int, headers: Headers | list[tuple[str, str]], now: float
    ) -> list[Command]:
        conn = self._conns.get(conn_id)
        if conn is None:
            return []
        conn.status = status
        h = {k.lower(): v for k, v in headers}
        ctype = h.get("content-type", "").split(";")[0].strip().lower()
        conn.sse = status == 200 and ctype == "text/event-stream"
        conn.retry_after = parse_retry_after(h.get("retry-after"), now)
        answered = h.get(PROTOCOL_VERSION_HEADER)
        if answered is not None:
            v = conn.view
            conn.view = ConnectionView(
                v.conn_id, v.session_generation, v.protocol_version, v.auth_subject, answered
            )
        if conn.sse:
            conn.decoder = SseDecoder()
        if conn.purpose is Purpose.INITIALIZE:
            if status == 200:
                self._pending_session_id = h.get(SESSION_HEADER)
                return []
            return self._initialize_failed(conn, now, f"http_{status}")
        if status == 404 and conn.carried_session:
            return self._session_not_found(conn, now)
        handler = {
            Purpose.CALL: self._call_head,
            Purpose.STANDALONE: self._standalone_head,
            Purpose.RESUME: self._resume_head,
            Purpose.DELETE: self._delete_head,
        }.get(conn.purpose)
        if handler is None:  # initialized / cancel notifications: 202 expected, nothing to do
            return self._end(conn, now, "")
        return handler(conn, now)

    def response_data(self, conn_id: int, data: bytes, now: float) -> list[Command]:
        conn = self._conns.get(conn_id)
        if conn is None:
            return []
        if conn.decoder is None:
            conn.body += data
            return []
        cmds: list[Command] = []
        for ev in conn.decoder.feed(data):
            cmds += self._on_event(conn, ev, now)
            if conn_id not in self._conns:
                break
        return cmds

    def response_end(self, conn_id: int, now: float) -> list[Command]:
        """The server ended the response normally."""
        conn = self._conns.get(conn_id)
        if conn is None:
            return []
        if conn.decoder is not None:
            cut = conn.decoder.end_of_stream()
            return self._connection_over(conn, now, "cut_mid_event" if cut else "server_closed")
        if conn.purpose is Purpose.INITIALIZE:
            return self._initialize_body(conn, now)
        if conn.purpose is Purpose.CALL and conn.status == 200:
            return self._json_call_body(conn, now)
        return self._end(conn, now, "")

    def connection_failed(self, conn_id: int, now: float, error: str = "connection_lost") -> list[Command]:
        """The connection broke (reset, timeout, refused) before or during the response."""
        conn = self._conns.get(conn_id)
        if conn is None:
            return []
        if conn.decoder is not None:
            conn.decoder.end_of_stream()
        return self._connection_over(conn, now, error or "connection_lost")

    # ------------------------------------------------------------------ requests

    def _session_usable(self) -> bool:
        return self.session.state in (State.SESSION_ACTIVE, State.DELETE_REQUESTED)

    def _headers(
        self, conn_id: int, purpose: Purpose, *, with_session: bool, last_event_id: str | None
    ) -> Headers:
        # x-lab-conn names the connection in every ledger (tap, server, client), so the
        # checker can join them; servers ignore headers they do not know.
        h: list[tuple[str, str]] = [(LAB_CONN_HEADER, f"{self.config.client_id}:{conn_id}")]
        if purpose in (Purpose.STANDALONE, Purpose.RESUME):
            h.append(("accept", "text/event-stream"))
        elif purpose is not Purpose.DELETE:
            h.append(("accept", "application/json, text/event-stream"))
            h.append(("content-type", "application/json"))
        if self.config.origin is not None:
            h.append(("origin", self.config.origin))
        if self._token is not None:
            h.append(("authorization", f"Bearer {self._token}"))
        if with_session and self.session_id is not None:
            h.append((SESSION_HEADER, self.session_id))
        if purpose is not Purpose.INITIALIZE and revision(self.protocol_version).version_header:
            h.append((PROTOCOL_VERSION_HEADER, self.protocol_version))
        if last_event_id is not None:
            h.append((LAST_EVENT_ID_HEADER, last_event_id))
        return tuple(h)

    def _open(
        self,
        purpose: Purpose,
        method: str,
        now: float,
        *,
        body: jsonrpc.JsonObject | None = None,
        stream_key: str | None = None,
        call: _Call | None = None,
        last_event_id: str | None = None,
    ) -> SendRequest:
        conn_id = self._next_conn
        self._next_conn += 1
        with_session = purpose is not Purpose.INITIALIZE
        headers = self._headers(conn_id, purpose, with_session=with_session, last_event_id=last_event_id)
        view = ConnectionView(conn_id, self.generation, self.protocol_version, self._subject)
        carried = with_session and self.session_id is not None
        self._conns[conn_id] = _Conn(
            conn_id,
            purpose,
            method,
            view,
            now,
            stream_key,
            call,
            carried,
            last_event_id,
            session=self.session_pseudonym if carried else None,
        )
        data = None if body is None else jsonrpc.dumps(body).encode("utf-8")
        return SendRequest(conn_id, purpose, method, headers, data)

    def _end(self, conn: _Conn, now: float, error: str) -> list[Command]:
        """Forget a connection and write its exchange record (exactly once per connection)."""
        if self._conns.pop(conn.conn_id, None) is None:
            return []
        self.records.append(
            HttpExchange(
                client_id=self.config.client_id,
                conn_id=conn.conn_id,
                purpose=str(conn.purpose),
                method=conn.method,
                stream_key=conn.stream_key,
                status=conn.status,
                session=conn.session,
                session_generation=conn.view.session_generation,
                carried_session=conn.carried_session,
                started_at=conn.started_at,
                ended_at=now,
                error=error,
                last_event_id=conn.last_event_id,
            )
        )
        return []

    def _abort(self, conn: _Conn, now: float, reason: str) -> list[Command]:
        self._end(conn, now, reason)
        return [CloseConnection(conn.conn_id)]

    def _attempted(
        self, kind: str, stream_key: str | None, p: PendingReconnect, now: float, conn_id: int
    ) -> None:
        """Write the reconnect that `p` just let through (before counting it)."""
        lost = p.lost_at if p.lost_at is not None else now
        self.records.append(
            ReconnectAttempt(
                self.config.client_id,
                kind,
                stream_key,
                p.cause,
                p.advised,
                p.planned,
                lost,
                now,
                now - lost,
                p.attempt,
                conn_id,
                self.generation,
            )
        )
        p.went(now)

    def _session_event(self, what: str, now: float, *, version: str | None = None) -> None:
        self.records.append(
            SessionEvent(self.config.client_id, self.session_pseudonym, self.generation, what, version, now)
        )

    # ------------------------------------------------------------------ handshake

    def _send_initialize(self, now: float) -> list[Command]:
        self.session.process(Trigger.INITIALIZE_SENT)
        self.session_id = None
        self._pending_session_id = None
        params = {
            "protocolVersion": self.config.protocol_version,
            "capabilities": {},
            "clientInfo": {"name": self.config.client_name, "version": "1"},
        }
        body = jsonrpc.request(self._new_request_id(), jsonrpc.INITIALIZE, params)
        return [self._open(Purpose.INITIALIZE, "POST", now, body=body)]

    def _initialize_body(self, conn: _Conn, now: float) -> list[Command]:
        self._end(conn, now, "")
        try:
            msg = jsonrpc.parse_message(bytes(conn.body))
        except RemoteProtocolError as e:
            return self._initialize_failed(conn, now, f"bad_initialize_result: {e}", ended=True)
        return self._initialize_result(conn, msg, now)

    def _initialize_event(self, conn: _Conn, ev: SseEvent, now: float) -> list[Command]:
        """The InitializeResult creates the session, so it cannot go through the session's door."""
        if not ev.is_message:
            return []
        try:
            init = jsonrpc.parse_message(ev.data)
        except RemoteProtocolError:
            return []
        if not init.kind.is_response:
            return []
        return self._abort(conn, now, "") + self._initialize_result(conn, init, now)

    def _initialize_result(self, conn: _Conn, msg: jsonrpc.Message, now: float) -> list[Command]:
        result = msg.body.get("result")
        if msg.kind is not jsonrpc.MessageKind.RESPONSE or not isinstance(result, dict):
            return self._initialize_failed(conn, now, "initialize_error", ended=True)
        version = result.get("protocolVersion")
        if version not in SUPPORTED_REVISIONS:
            return self._initialize_failed(conn, now, f"unsupported_version:{version}", ended=True)
        caps = result.get("capabilities")
        exp = caps.get("experimental") if isinstance(caps, dict) else None
        ids = exp.get(EVENT_ID_CAPABILITY) if isinstance(exp, dict) else None
        self.session.process(Trigger.INITIALIZE_OK)
        self.generation += 1
        self.session_id = self._pending_session_id
        self._tag = None if self.session_id is None else session_tag(self.session_id)
        self.protocol_version = str(version)
        self.structured_ids = isinstance(ids, dict) and ids.get("scheme") == "e1" and self._tag is not None
        self.server_generation = None
        after_loss, self._after_loss = self._after_loss, False
        self._reinit.recovered()
        self._session_event("established", now, version=self.protocol_version)
        self.notices.append(SessionEstablished(self.generation, self.protocol_version, now))
        initialized = jsonrpc.notification(jsonrpc.INITIALIZED)
        cmds: list[Command] = [self._open(Purpose.INITIALIZED, "POST", now, body=initialized)]
        if self.config.open_standalone_stream and not self._leaving:
            cmds.append(self._open_standalone(now))
        for call in self.calls.values():
            if after_loss and call.recovery is not None:
                call.recovery.reinitialized = True
            if call.queued and not call.done and call.resend.at is None:
                cmds += self._send_call(call, now)
        return cmds

    def _initialize_failed(
        self, conn: _Conn, now: float, cause: str, *, ended: bool = False
    ) -> list[Command]:
        cmds: list[Command] = [] if ended else self._abort(conn, now, cause)
        if self.session.state is State.INITIALIZING:
            self.session.process(Trigger.INITIALIZE_FAILED)
        self.records.append(
            SessionEvent(self.config.client_id, None, self.generation, "initialize_failed", None, now)
        )
        self._reinit.lose(now, cause)
        self._reinit.schedule(now, self.config.backoff, self.rng, retry_after=conn.retry_after)
        return cmds

    def _go_reinit(self, now: float) -> list[Command]:
        if not self._reinit.acquire(now, self.budget, self.rng):
            return []
        cmds = self._send_initialize(now)
        send = cmds[0]
        assert isinstance(send, SendRequest)
        self._attempted("reinitialize", None, self._reinit, now, send.conn_id)
        self._after_loss = True
        return cmds

    def _session_not_found(self, conn: _Conn, now: float) -> list[Command]:
        """404 to a request that carried the session ID: the session is gone."""
        cmds = self._abort(conn, now, "session_not_found")
        if conn.view.session_generation != self.generation:
            return cmds  # a straggler of an older session: already handled
        if self.session.state is State.DELETE_REQUESTED:
            # Leaving, and any 404 (to the DELETE or to a request still in flight) says the
            # session is gone: that is the end we asked for, not a reason for a new handshake.
            self._delete.cancel()
            return cmds + self._leave_done(LeaveReceipt.ALREADY_GONE, now, "terminated")
        if self.session.state is not State.SESSION_ACTIVE:
            return cmds
        self.session.process(Trigger.SESSION_NOT_FOUND)
        self._session_event("expired", now)
        cmds += self._drop_session_streams(now, "session_not_found")
        self.session.process(Trigger.REINITIALIZE)
        if self._leaving:
            self.notices.append(LeaveFinished(LeaveReceipt.ALREADY_GONE, now))
            return cmds
        # The new handshake is the very next request: at once, but as a reconnect it still
        # waits for the budget (nothing else is sent meanwhile: the session is not active).
        self._reinit.lose(now, "session_not_found")
        self._reinit.schedule(now, self.config.backoff, self.rng, immediate=True)
        return cmds + self._go_reinit(now)

    def _drop_session_streams(self, now: float, reason: str) -> list[Command]:
        """End every stream of the lost session; calls in flight become outcome-UNKNOWN."""
        cmds: list[Command] = []
        for st in list(self.streams.values()):
            if st.machine.can(Trigger.SESSION_GONE):
                st.machine.process(Trigger.SESSION_GONE)
            cmds += self._close_stream_conn(st, now, reason)
        for conn in list(self._conns.values()):
            if conn.view.session_generation == self.generation and conn.purpose is not Purpose.INITIALIZE:
                cmds += self._abort(conn, now, reason)
        unknown: list[CallHandle] = []
        for call in self.calls.values():
            if call.done:
                continue
            if call.resend.at is not None:
                # A re-send held back (429/503) was never processed: it waits for the new session.
                call.resend.cancel()
                call.queued = True
            elif not call.queued:
                unknown.append(call.handle)
                self._finish_call(call, CallOutcome.UNKNOWN, now, reason=reason)
        self._standalone = None
        self._reopen.recovered()
        self.notices.append(SessionLost(self.generation, now, reason, tuple(unknown)))
        return cmds

    # ------------------------------------------------------------------ calls

    def _new_request_id(self) -> int:
        rid = self._next_request
        self._next_request += 1
        return rid

    def _send_call(self, call: _Call, now: float) -> list[Command]:
        """Send an attempt of the call now if the session is active; else it stays queued."""
        if self.session.state is not State.SESSION_ACTIVE or self._leaving:
            call.queued = True
            return []
        call.queued = False
        call.attempts += 1
        rid = self._new_request_id()
        call.request_id = rid
        call.stream_key = key = f"post:{rid}"
        meta: dict[str, Any] = {"progressToken": rid, IDEMPOTENCY_META: call.handle.operation_key}
        params = {"name": call.handle.tool, "arguments": call.arguments, "_meta": meta}
        body = jsonrpc.request(rid, "tools/call", params)
        return [self._open(Purpose.CALL, "POST", now, body=body, stream_key=key, call=call)]

    def _new_stream(
        self, conn: _Conn, request_id: int | None, call: _Call | None, sid: str | None
    ) -> _Stream:
        assert conn.stream_key is not None
        st = _Stream(
            conn.stream_key, Machine(Role.STREAM), self.generation, request_id, call, sid, conn.conn_id
        )
        self.streams[st.key] = st
        return st

    def _call_head(self, conn: _Conn, now: float) -> list[Command]:
        call = conn.call
        assert call is not None
        status = conn.status or 0
        if status == 200:
            if conn.sse:
                structured = self.structured_ids and self._tag is not None
                sid = post_stream_id(self._tag or "", call.request_id or 0) if structured else None
                self._new_stream(conn, call.request_id, call, sid)
            return []
        cmds = self._abort(conn, now, f"http_{status}")
        if status in _RETRY_STATUSES or status in _UNKNOWN_STATUSES:
            # 429/503: refused before processing; 502/504: unknown, safe to re-send only
            # because the idempotency key travels with the new request.
            self._schedule_resend(call, now, f"http_{status}", conn.retry_after)
        else:
            self._finish_call(call, CallOutcome.ERROR, now, reason=f"http_{status}")
        return cmds

    def _json_call_body(self, conn: _Conn, now: float) -> list[Command]:
        """A request answered with `application/json`: one message, no event ID, no cursor."""
        call = conn.call
        assert call is not None
        self._new_stream(conn, call.request_id, call, None)
        cmds = self._on_event(conn, SseEvent(data=bytes(conn.body).decode("utf-8", errors="replace")), now)
        if conn.conn_id in self._conns:
            cmds += self._connection_over(conn, now, "server_closed")
        return cmds

    def _schedule_resend(self, call: _Call, now: float, cause: str, retry_after: float | None) -> None:
        if call.recovery is None:
            call.recovery = _Recovery(call.stream_key or "", cause, now)
        call.recovery.attempts += 1
        call.resend.lose(now, cause)
        if call.resend.attempt >= self.config.max_attempts:
            call.resend.cancel()
            self._finish_call(call, CallOutcome.UNKNOWN, now, reason=f"gave_up_after_{cause}")
            return
        call.resend.schedule(now, self.config.backoff, self.rng, retry_after=retry_after)

    def _go_resend(self, call: _Call, now: float) -> list[Command]:
        if self.session.state is not State.SESSION_ACTIVE:
            call.resend.cancel()
            call.queued = True
            return []
        if not call.resend.acquire(now, self.budget, self.rng):
            return []
        cmds = self._send_call(call, now)
        send = cmds[0]
        assert isinstance(send, SendRequest)
        self._attempted("resend", call.stream_key, call.resend, now, send.conn_id)
        return cmds

    def _finish_call(
        self,
        call: _Call,
        outcome: CallOutcome,
        now: float,
        *,
        result: jsonrpc.JsonObject | None = None,
        error: Any = None,
        reason: str = "",
    ) -> None:
        if call.done:
            return
        call.done = True
        call.queued = False
        call.resend.recovered()
        if call.recovery is not None:
            ok = outcome in (CallOutcome.OK, CallOutcome.ERROR)
            self._close_recovery(call, now if ok else None, "retried" if ok else "abandoned")
        self.records.append(
            OperationRecord(
                self.config.client_id,
                call.handle.operation_key,
                call.handle.tool,
                call.write,
                str(outcome),
                reason,
                call.attempts,
                call.started_at,
                now,
                self.generation,
            )
        )
        self.notices.append(
            CallFinished(call.handle, outcome, now, result=result, error=error, reason=reason)
        )

    def _close_recovery(self, call: _Call, recovered_at: float | None, path: str) -> None:
        r = call.recovery
        assert r is not None
        op = call.handle.operation_key
        self.records.append(
            Recovery(
                self.config.client_id,
                r.stream_key,
                op,
                r.cause,
                r.lost_at,
                recovered_at,
                path,
                r.attempts,
                r.reinitialized,
            )
        )
        call.recovery = None

    def _record_stream_recovery(self, st: _Stream, now: float | None, path: str) -> None:
        p = st.resume
        op = None if st.call is None else st.call.handle.operation_key
        assert p.lost_at is not None
        self.records.append(
            Recovery(self.config.client_id, st.key, op, p.first_cause, p.lost_at, now, path, p.attempt, False)
        )
        p.recovered()

    # ------------------------------------------------------------------ standalone stream

    def _open_standalone(self, now: float) -> SendRequest:
        key = f"get:{self._next_standalone}"
        self._next_standalone += 1
        self._standalone = key
        return self._open(Purpose.STANDALONE, "GET", now, stream_key=key)

    def _standalone_head(self, conn: _Conn, now: float) -> list[Command]:
        if conn.sse:
            st = self._new_stream(conn, None, None, None)
            p = self._reopen
            if p.lost_at is not None:
                self.records.append(
                    Recovery(
                        self.config.client_id,
                        self._reopen_from or st.key,
                        None,
                        p.first_cause,
                        p.lost_at,
                        now,
                        "reopened",
                        p.attempt,
                        False,
                    )
                )
            p.recovered()
            return []
        cmds = self._abort(conn, now, f"http_{conn.status}")
        self._standalone = None
        if conn.status != 405:  # 405: the server offers no GET stream; fine, not an error
            self._schedule_reopen(now, f"http_{conn.status}", conn.retry_after)
        return cmds

    def _schedule_reopen(self, now: float, cause: str, retry_after: float | None) -> None:
        """Plan a fresh standalone GET stream (the old one is gone and had no usable cursor)."""
        if self.session.state is not State.SESSION_ACTIVE or self._leaving:
            return
        p = self._reopen
        p.lose(now, cause)
        if p.attempt >= self.config.max_attempts:
            assert p.lost_at is not None
            self.records.append(
                Recovery(
                    self.config.client_id,
                    self._reopen_from or "get",
                    None,
                    p.first_cause,
                    p.lost_at,
                    None,
                    "abandoned",
                    p.attempt,
                    False,
                )
            )
            p.recovered()
            return
        p.schedule(now, self.config.backoff, self.rng, retry_after=retry_after)

    def _go_reopen(self, now: float) -> list[Command]:
        if self.session.state is not State.SESSION_ACTIVE or self._leaving or self._standalone is not None:
            self._reopen.cancel()
            return []
        if not self._reopen.acquire(now, self.budget, self.rng):
            return []
        send = self._open_standalone(now)
        self._attempted("reopen", self._standalone, self._reopen, now, send.conn_id)
        return [send]

    # ------------------------------------------------------------------ events

    def _on_event(self, conn: _Conn, ev: SseEvent, now: float) -> list[Command]:
        if conn.purpose is Purpose.INITIALIZE:
            return self._initialize_event(conn, ev, now)
        st = self.streams.get(conn.stream_key or "")
        if st is None:
            return []
        if ev.retry is not None:
            st.retry_ms = ev.retry
        if ev.id is None and not ev.has_data:
            return []  # a retry-only block
        if ev.id is not None:
            event_id = ev.id
        else:
            conn.synthetic += 1
            event_id = f"~{conn.conn_id}.{conn.synthetic}"
        call = st.call
        result = accept_stream_event(
            self.inbox,
            client_id=self.config.client_id,
            session=SessionView(
                self.generation,
                self._session_usable(),
                self.protocol_version,
                self._subject,
                self._tag,
                self.structured_ids,
                self.server_generation,
            ),
            conn=conn.view,
            stream=StreamView(
                st.key,
                st.request_id,
                st.request_id,
                None if call is None else call.handle.operation_key,
                st.server_stream_id,
                st.ended,
            ),
            event=ev,
            event_id=event_id,
            now=now,
            checks=self.config.checks,
        )
        if result.outcome is not Outcome.ACCEPTED:
            return self._not_accepted(conn, st, result, now)
        if result.bound_server_stream_id is not None:
            st.server_stream_id = result.bound_server_stream_id
        if result.bound_server_generation is not None:
            self.server_generation = result.bound_server_generation
        msg = result.message
        if st.resume.lost_at is not None and (msg is not None or call is None):
            self._record_stream_recovery(st, now, "resumed")
        elif call is not None and call.recovery is not None and msg is not None:
            self._close_recovery(call, now, "retried")  # the first message of a retry attempt
        if msg is None or call is None:
            return []
        if msg.method == jsonrpc.PROGRESS:
            p = msg.params.get("progress")
            self.notices.append(Progress(call.handle, float(p) if isinstance(p, int | float) else None, now))
        if not result.ends_stream:
            return []
        st.ended = True
        st.machine.process(Trigger.COMPLETED)
        st.conn_id = None
        cmds = self._abort(conn, now, "")
        if msg.kind is jsonrpc.MessageKind.RESPONSE:
            res = msg.body.get("result")
            self._finish_call(call, CallOutcome.OK, now, result=res if isinstance(res, dict) else None)
        else:
            self._finish_call(
                call, CallOutcome.ERROR, now, error=msg.body.get("error"), reason="jsonrpc_error"
            )
        return cmds

    def _not_accepted(self, conn: _Conn, st: _Stream, result: Acceptance, now: float) -> list[Command]:
        self.records.append(
            EventRejected(
                self.config.client_id,
                conn.conn_id,
                self.generation,
                st.key,
                result.event_id,
                result.digest,
                str(result.reason) if result.reason is not None else "duplicate",
                result.detail,
                now,
            )
        )
        if result.reason not in _UNTRUSTED_CONNECTION:
            return []
        # Something between us and the server lost events or changed identity: this
        # connection cannot be trusted further; resume from the watermark on a new one.
        cmds = self._abort(conn, now, str(result.reason))
        st.conn_id = None
        if st.machine.can(Trigger.CONNECTION_LOST):
            st.machine.process(Trigger.CONNECTION_LOST)
            cmds += self._stream_lost(st, now, str(result.reason))
        return cmds

    # ------------------------------------------------------------------ losses and resumption

    def _connection_over(self, conn: _Conn, now: float, cause: str) -> list[Command]:
        """A connection ended (normally or not) while the core still held it."""
        self._end(conn, now, "" if cause == "server_closed" else cause)
        if conn.purpose is Purpose.INITIALIZE:
            return self._initialize_failed(conn, now, cause, ended=True)
        if conn.purpose is Purpose.DELETE:
            return self._delete_unanswered(now, cause)
        st = self.streams.get(conn.stream_key or "")
        if st is not None and st.conn_id == conn.conn_id:
            st.conn_id = None
            if st.state is State.STREAM_OPEN and not st.ended:
                st.machine.process(
                    Trigger.SERVER_CLOSED if cause == "server_closed" else Trigger.CONNECTION_LOST
                )
                return self._stream_lost(st, now, cause)
            return []
        if conn.purpose is Purpose.CALL and conn.call is not None and st is None and conn.status is None:
            # Lost before any response head: the request may or may not have arrived.
            if not conn.call.done:
                self._schedule_resend(conn.call, now, cause, None)
            return []
        if conn.purpose is Purpose.STANDALONE and st is None and self._standalone == conn.stream_key:
            self._standalone = None
            self._schedule_reopen(now, cause, None)
        return []

    def _stream_lost(self, st: _Stream, now: float, cause: str) -> list[Command]:
        """The stream is DISCONNECTED: resume it if a valid cursor exists, else fall back."""
        st.resume.lose(now, cause)
        if self._leaving or self.session.state is not State.SESSION_ACTIVE:
            st.machine.process(Trigger.CANCELLED)
            return []
        if self._valid_cursor(st) is None:
            st.machine.process(Trigger.NO_VALID_CURSOR)
            return self._unresumable(st, now, "no_valid_cursor")
        st.resume.schedule(now, self.config.backoff, self.rng, retry_ms=st.retry_ms)
        st.machine.process(Trigger.RESUME_SCHEDULED)
        return []

    def _valid_cursor(self, st: _Stream) -> str | None:
        """The stream's watermark, if it is a cursor of this session and of this stream."""
        wm = self.inbox.watermark(st.generation, st.key)
        if wm is None or st.generation != self.generation:
            return None
        if self.structured_ids:
            parsed = parse_event_id(wm.event_id)
            if parsed is None:
                return None
            verdict = classify_structured(
                parsed,
                session_tag=self._tag or "",
                generation=self.server_generation,
                stream_id=st.server_stream_id,
            )
        else:
            seen = self.inbox.seen(st.generation, wm.event_id)
            verdict = classify_opaque(st.key, None if seen is None else seen.stream_key)
        return wm.event_id if verdict is CursorVerdict.VALID else None

    def _go_resume(self, st: _Stream, now: float) -> list[Command]:
        if st.state is not State.RESUME_PENDING or st.conn_id is not None:
            st.resume.cancel()
            return []
        if not st.resume.acquire(now, self.budget, self.rng):
            return []
        cursor = self._valid_cursor(st)
        if cursor is None:
            st.machine.process(Trigger.CURSOR_REFUSED)
            return self._unresumable(st, now, "no_valid_cursor")
        send = self._open(Purpose.RESUME, "GET", now, stream_key=st.key, call=st.call, last_event_id=cursor)
        st.conn_id = send.conn_id
        self._attempted("resume", st.key, st.resume, now, send.conn_id)
        return [send]

    def _resume_head(self, conn: _Conn, now: float) -> list[Command]:
        st = self.streams.get(conn.stream_key or "")
        if st is None or st.conn_id != conn.conn_id or st.state is not State.RESUME_PENDING:
            return self._abort(conn, now, "stale_resume")
        if conn.sse:
            st.machine.process(Trigger.RESUMED)
            if st.call is None and st.resume.lost_at is not None:
                # A standalone stream may stay silent: it has recovered once it is open again.
                self._record_stream_recovery(st, now, "resumed")
            return []
        status = conn.status or 0
        cmds = self._abort(conn, now, f"http_{status}")
        st.conn_id = None
        if status in _CURSOR_REFUSED_STATUSES:
            st.machine.process(Trigger.CURSOR_REFUSED)
            return cmds + self._unresumable(st, now, f"cursor_refused_http_{status}")
        st.machine.process(Trigger.RESUME_FAILED)
        st.resume.lose(now, f"http_{status}")
        if st.resume.attempt >= self.config.max_attempts:
            st.machine.process(Trigger.CANCELLED)
            if st.call is not None:
                self._finish_call(
                    st.call, CallOutcome.UNKNOWN, now, reason=f"gave_up_resuming_after_http_{status}"
                )
            elif st.resume.lost_at is not None:
                self._record_stream_recovery(st, None, "abandoned")
            return cmds
        st.resume.schedule(now, self.config.backoff, self.rng, retry_after=conn.retry_after)
        st.machine.process(Trigger.RESUME_SCHEDULED)
        return cmds

    def _unresumable(self, st: _Stream, now: float, reason: str) -> list[Command]:
        """No cursor to resume from (or the server refused it)."""
        call, p = st.call, st.resume
        st.resume = PendingReconnect()
        if call is not None:
            if not call.done:
                if call.recovery is None and p.lost_at is not None:
                    call.recovery = _Recovery(st.key, p.first_cause, p.lost_at, p.attempt)
                # The operation may have been performed: re-send it with the same idempotency
                # key (a new request ID, as JSON-RPC requires), never as a new operation.
                self._schedule_resend(call, now, reason, None)
            return []
        if st.key == self._standalone:
            # A standalone stream: open a fresh one (nothing is owed on it that a cursor could replay).
            self._standalone = None
            self._reopen_from = st.key
            self._reopen.lose(p.lost_at if p.lost_at is not None else now, p.first_cause or reason)
            self._reopen.attempt = p.attempt
            self._schedule_reopen(now, reason, None)
        return []

    def _close_stream_conn(self, st: _Stream, now: float, reason: str) -> list[Command]:
        st.resume.cancel()
        if st.conn_id is None:
            return []
        conn = self._conns.get(st.conn_id)
        st.conn_id = None
        return [] if conn is None else self._abort(conn, now, reason)

    # ------------------------------------------------------------------ leaving

    def _delete_head(self, conn: _Conn, now: float) -> list[Command]:
        status = conn.status or 0
        cmds = self._abort(conn, now, "")
        if 200 <= status < 300:
            return cmds + self._leave_done(LeaveReceipt.DELETED, now, "terminated")
        if status == 405:
            self.session.process(Trigger.DELETE_REFUSED)
            self._session_event("termination_unsupported", now, version=self.protocol_version)
            self.notices.append(LeaveFinished(LeaveReceipt.TERMINATION_UNSUPPORTED, now))
            return cmds
        return cmds + self._delete_unanswered(now, f"http_{status}", conn.retry_after)

    def _delete_unanswered(self, now: float, cause: str, retry_after: float | None = None) -> list[Command]:
        if self.session.state is not State.DELETE_REQUESTED:
            return []
        p = self._delete
        p.cause = cause
        if p.attempt + 1 >= self.config.max_delete_attempts:
            self.session.process(Trigger.DELETE_ABANDONED)
            self._session_event("delete_unconfirmed", now, version=self.protocol_version)
            self.notices.append(LeaveFinished(LeaveReceipt.UNCONFIRMED, now))
            return []
        p.schedule(now, self.config.backoff, self.rng, retry_after=retry_after)
        return []

    def _go_delete(self, now: float) -> list[Command]:
        if self.session.state is not State.DELETE_REQUESTED:
            self._delete.cancel()
            return []
        if not self._delete.acquire(now, self.budget, self.rng):
            return []
        send = self._open(Purpose.DELETE, "DELETE", now)
        self._attempted("delete", None, self._delete, now, send.conn_id)
        return [send]

    def _leave_done(self, receipt: LeaveReceipt, now: float, what: str) -> list[Command]:
        if self.session.state is State.DELETE_REQUESTED:
            self.session.process(
                Trigger.DELETE_CONFIRMED if receipt is LeaveReceipt.DELETED else Trigger.SESSION_NOT_FOUND
            )
        self._session_event(what, now, version=self.protocol_version)
        self.notices.append(LeaveFinished(receipt, now))
        return []
