"""The session: the handshake, a lost session (404) and the new handshake after it.

- The session ID from the response that carries the InitializeResult goes on every later
  request.
- A 404 to a request that carried it ends the session: calls in flight are reported
  outcome-UNKNOWN (never moved into the new session as if nothing happened) and a new
  initialize *without* a session ID is the very next request.
"""

from __future__ import annotations

from lab.client._acceptance import RejectReason
from lab.client._calls import Calling
from lab.client._client_state import ClientState
from lab.client._commands import (
    HANDSHAKES,
    CallHandle,
    CallOutcome,
    LeaveFinished,
    LeaveReceipt,
    Purpose,
    SendRequest,
    SessionEstablished,
    SessionLost,
)
from lab.client._config import ClientConfig
from lab.client._http import Connections
from lab.client._leaving import Leaving
from lab.client._model import Conn
from lab.client._reconnector import EndPath, Handler, Kind, Loss, Reconnector, Target
from lab.client._states import State, Trigger
from lab.client._stream_table import StreamTable
from lab.client._streams import Streaming
from lab.client._tools import ToolHints
from lab.wire import jsonrpc
from lab.wire.client_ledger import SessionEvent
from lab.wire.errors import LocalProtocolError, RemoteProtocolError
from lab.wire.event_ids import session_tag
from lab.wire.extensions import EVENT_ID_CAPABILITY
from lab.wire.revisions import SUPPORTED_REVISIONS
from lab.wire.sse import SseEvent


class Handshake:
    """The session of `ClientState`: made, lost, made again. The top part: a new session
    re-sends the queued calls and opens the standalone stream, a lost one ends them, and
    a 404 while leaving is the end of the leaving, so it is given every other part."""

    __slots__ = (
        "calling",
        "config",
        "http",
        "leaving",
        "pending_session_id",
        "reconnector",
        "state",
        "streaming",
        "table",
        "tools",
    )

    def __init__(
        self,
        state: ClientState,
        config: ClientConfig,
        *,
        http: Connections,
        reconnector: Reconnector,
        table: StreamTable,
        calling: Calling,
        streaming: Streaming,
        leaving: Leaving,
        tools: ToolHints,
    ) -> None:
        self.state = state
        self.config = config
        self.http = http
        self.reconnector = reconnector
        self.table = table
        self.calling = calling
        self.streaming = streaming
        self.leaving = leaving
        self.tools = tools
        self.pending_session_id: str | None = None
        """The session ID of the initialize response in progress, until its result is read."""

    def handler(self) -> Handler:
        return Handler(self._ready, self._attempt, self._never_exhausted)

    # ------------------------------------------------------------------ handshake

    def send_initialize(self, now: float) -> SendRequest:
        """The handshake's first request: `initialize`, or in the modern era `server/discover`
        (no session comes of it; it tells whether the server speaks the client's revision)."""
        c = self.state
        c.session.process(Trigger.INITIALIZE_SENT)
        c.session_id = None
        self.pending_session_id = None
        if self.http.modern:
            body = jsonrpc.request(c.new_request_id(), jsonrpc.DISCOVER, {})
            return self.http.open(Purpose.DISCOVER, "POST", now, body=body)
        params = {
            "protocolVersion": self.config.protocol_version,
            "capabilities": {},
            "clientInfo": {"name": self.config.client_name, "version": "1"},
        }
        body = jsonrpc.request(c.new_request_id(), jsonrpc.INITIALIZE, params)
        return self.http.open(Purpose.INITIALIZE, "POST", now, body=body)

    def body(self, conn: Conn, now: float) -> None:
        """An `application/json` answer to initialize."""
        self.http.end(conn, now, "")
        try:
            msg = jsonrpc.parse_message(bytes(conn.body))
        except RemoteProtocolError as e:
            self.failed(conn, now, f"bad_initialize_result: {e}", ended=True)
            return
        self.result(conn, msg, now)

    def event(self, conn: Conn, ev: SseEvent, now: float) -> None:
        """An event of the initialize stream. The InitializeResult creates the session, so
        it cannot go through the session's door; anything else is refused (with a row)."""
        if not ev.is_message:
            return  # priming: nothing to resume on a handshake
        try:
            init = jsonrpc.parse_message(ev.data)
        except RemoteProtocolError as e:
            self.streaming.reject_event(conn, "", ev, RejectReason.MALFORMED_MESSAGE, str(e), now)
            return
        if not init.kind.is_response:
            self.streaming.reject_event(
                conn,
                "",
                ev,
                RejectReason.NOT_INITIALIZE_RESULT,
                "no session yet: only the result is taken",
                now,
            )
            return
        self.http.abort(conn, now, "", finished=True)
        self.result(conn, init, now)

    def result(self, conn: Conn, msg: jsonrpc.Message, now: float) -> None:
        c = self.state
        result = msg.body.get("result")
        if msg.kind is not jsonrpc.MessageKind.RESPONSE or not isinstance(result, dict):
            self.failed(conn, now, "initialize_error", ended=True)
            return
        if self.http.modern:
            # server/discover: the revisions the server serves must include the client's.
            listed = result.get("supportedVersions")
            version: object = self.config.protocol_version
            if not isinstance(listed, list) or version not in listed:
                self.failed(conn, now, f"unsupported_version:{listed}", ended=True)
                return
            ids = None
        else:
            version = result.get("protocolVersion")
            if version not in SUPPORTED_REVISIONS:
                self.failed(conn, now, f"unsupported_version:{version}", ended=True)
                return
            caps = result.get("capabilities")
            exp = caps.get("experimental") if isinstance(caps, dict) else None
            ids = exp.get(EVENT_ID_CAPABILITY) if isinstance(exp, dict) else None
        c.session.process(Trigger.INITIALIZE_OK)
        c.generation += 1
        c.session_id = None if self.http.modern else self.pending_session_id
        c.tag = None if c.session_id is None else session_tag(c.session_id)
        c.protocol_version = str(version)
        c.structured_ids = isinstance(ids, dict) and ids.get("scheme") == "e1" and c.tag is not None
        c.server_generation = None
        reinit = self.reconnector.get(Target.SESSION)
        if reinit is not None:
            self.reconnector.session_reestablished()
            self.reconnector.recovered(reinit, now)
        c.session_event("established", now, version=c.protocol_version)
        c.fx.notices.append(SessionEstablished(c.generation, c.protocol_version, now))
        if not self.http.modern:  # (the modern era has no initialized notification, no GET stream)
            self.http.open(Purpose.INITIALIZED, "POST", now, body=jsonrpc.notification(jsonrpc.INITIALIZED))
        if self.config.retry_rule:
            self.tools.send(now)  # once per client: what may be re-sent after an unknown outcome
        if self.config.open_standalone_stream and not c.leave_requested and not self.http.modern:
            self.streaming.open_standalone(now)
        for call in c.calls.values():
            loss = self.reconnector.get(Target.CALL, call.handle.operation_key)
            if call.queued and not call.done and (loss is None or loss.at is None):
                self.calling.send(call, now)

    def failed(self, conn: Conn, now: float, cause: str, *, ended: bool = False) -> None:
        c = self.state
        if not ended:
            self.http.abort(conn, now, cause)
        if c.session.state is State.INITIALIZING:
            c.session.process(Trigger.INITIALIZE_FAILED)
        c.fx.records.append(
            SessionEvent(self.config.client_id, None, c.generation, "initialize_failed", None, now)
        )
        if c.stopped:
            return
        self.reconnector.lost(
            Target.SESSION, "", now, cause, kind=Kind.REINITIALIZE, retry_after=conn.retry_after
        )

    # ------------------------------------------------------------------ the new handshake (a reconnect kind)

    def _ready(self, loss: Loss, now: float) -> bool:
        c = self.state
        if c.session.state is not State.REINITIALIZE_REQUIRED or c.stopped:
            loss.at = None
            return False
        return True

    def _attempt(self, loss: Loss, now: float) -> SendRequest:
        return self.send_initialize(now)

    def _never_exhausted(self, loss: Loss, now: float) -> None:
        raise LocalProtocolError("a new handshake never gives up")  # KINDS sets no limit

    # ------------------------------------------------------------------ a lost session

    def session_not_found(self, conn: Conn, now: float) -> None:
        """404 to a request that carried the session ID: the session is gone."""
        c = self.state
        self.http.abort(conn, now, "session_not_found")
        if conn.view.session_generation != c.generation:
            return  # a straggler of an older session: already handled
        if c.session.state is State.DELETE_REQUESTED:
            # Leaving, and any 404 (to the DELETE or to a request still in flight) says the
            # session is gone: that is the end we asked for, not a reason for a new handshake.
            self.leaving.done(LeaveReceipt.ALREADY_GONE, now, "terminated")
            return
        if c.session.state is not State.SESSION_ACTIVE:
            return
        c.session.process(Trigger.SESSION_NOT_FOUND)
        c.session_event("expired", now)
        self.drop_session(now, "session_not_found")
        c.session.process(Trigger.REINITIALIZE)
        if c.leave_requested:
            c.fx.notices.append(LeaveFinished(LeaveReceipt.ALREADY_GONE, now))
            return
        # The new handshake is the very next request: at once, but as a reconnect it still
        # waits for the budget (nothing else is sent meanwhile: the session is not active).
        loss = self.reconnector.lost(
            Target.SESSION, "", now, "session_not_found", kind=Kind.REINITIALIZE, immediate=True
        )
        self.reconnector.attempt(loss, now)

    def drop_session(self, now: float, reason: str) -> None:
        """End every stream of the lost session; calls in flight become outcome-UNKNOWN."""
        c = self.state
        for st in list(c.streams.values()):
            if st.machine.can(Trigger.SESSION_GONE):
                st.machine.process(Trigger.SESSION_GONE)
            self.table.close_conn(st, now, reason)
        for conn in list(self.http.live.values()):
            if conn.view.session_generation == c.generation and conn.purpose not in HANDSHAKES:
                self.http.abort(conn, now, reason)
        unknown: list[CallHandle] = []
        for call in c.calls.values():
            if call.done:
                continue
            loss = self.reconnector.get(Target.CALL, call.handle.operation_key)
            if loss is not None and loss.kind is Kind.RESEND and loss.at is not None:
                # A re-send held back (429/503) was never processed: it waits for the new session.
                loss.at = None
                call.queued = True
            elif not call.queued:
                unknown.append(call.handle)
                self.calling.finish(call, CallOutcome.UNKNOWN, now, reason=reason, path=EndPath.SESSION_LOST)
        self.streaming.standalone = None
        standalone = self.reconnector.get(Target.STANDALONE)
        if standalone is not None:
            # A standalone stream owes nothing a cursor could replay: the one the next
            # handshake opens brings it back (a call in flight, by contrast, is lost).
            self.reconnector.park(standalone, Kind.REOPEN, reason)
        c.fx.notices.append(SessionLost(c.generation, now, reason, tuple(unknown)))
