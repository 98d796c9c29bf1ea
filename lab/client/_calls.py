"""Tool calls: one logical operation per idempotency key, its attempts and its outcome.

- A call is sent at once if the session is active, else queued until it is.
- A dropped connection is not a cancellation: the call's stream is resumed, and a call
  that cannot be resumed is re-sent with the same idempotency key (a new JSON-RPC request
  ID, as JSON-RPC requires), never as a new operation. Cancelling means sending
  `notifications/cancelled`.
- In the modern era (2026-07-28) nothing is resumed: a broken stream *is* its request's
  cancellation, so the call is re-issued (the re-send above, a new request ID, the same
  key, within the retry rule), and cancelling is closing the stream.
- Every call ends with one outcome (ok, error, unknown, cancelled), one operations row
  and one `CallFinished` notice; a call the client leaves or stops still waiting for ends
  UNKNOWN, so a run's end cannot hide a hang.
"""

from __future__ import annotations

from typing import Any

from lab.client._client_state import ClientState
from lab.client._commands import CallFinished, CallHandle, CallOutcome, Purpose, SendRequest
from lab.client._config import ClientConfig
from lab.client._http import Connections
from lab.client._model import Call, Conn
from lab.client._reconnector import EndPath, Handler, Kind, Loss, Reconnector, Target
from lab.client._states import State, Trigger
from lab.client._stream_table import StreamTable
from lab.client._tools import ToolHints
from lab.wire import jsonrpc
from lab.wire.client_ledger import OperationRecord
from lab.wire.errors import LocalProtocolError
from lab.wire.event_ids import post_stream_id
from lab.wire.extensions import IDEMPOTENCY_META

_RETRY_STATUSES = frozenset({429, 503})
"""Refused before processing: re-send after the advised delay."""
_UNKNOWN_STATUSES = frozenset({502, 504})
"""May or may not have been processed: safe to re-send only because the idempotency key
travels with the new request."""


class Calling:
    """The calls of `ClientState.calls`. It opens and closes their streams through the
    `StreamTable`; what comes on them is `Streaming`'s (which is above, and ends a call
    here with `finish` or `lost`)."""

    __slots__ = ("config", "http", "reconnector", "state", "table", "tools")

    def __init__(
        self,
        state: ClientState,
        config: ClientConfig,
        *,
        http: Connections,
        reconnector: Reconnector,
        table: StreamTable,
        tools: ToolHints,
    ) -> None:
        self.state = state
        self.tools = tools
        self.config = config
        self.http = http
        self.reconnector = reconnector
        self.table = table

    def handler(self) -> Handler:
        return Handler(self._ready, self._attempt, self._exhausted)

    # ------------------------------------------------------------------ what the application does

    def start(
        self, name: str, arguments: jsonrpc.JsonObject, now: float, idempotency_key: str | None, write: bool
    ) -> CallHandle:
        c = self.state
        if c.leave_requested or c.stopped:
            raise LocalProtocolError("call_tool() after leave() or close_all()")
        key = idempotency_key or f"{self.config.client_id}/op/{len(c.calls) + 1}"
        if key in c.calls:
            raise LocalProtocolError(f"operation {key!r} already exists; use retry_call()")
        call = Call(CallHandle(key, name), dict(arguments), write, now, progress_at=now)
        c.calls[key] = call
        self.send(call, now)
        return call.handle

    def retry(self, handle: CallHandle, now: float) -> None:
        """Re-run an operation whose outcome was UNKNOWN (same idempotency key)."""
        c = self.state
        call = c.calls[handle.operation_key]
        if not call.done:
            raise LocalProtocolError(f"operation {handle.operation_key!r} is still running")
        if c.leave_requested or c.stopped:
            raise LocalProtocolError("retry_call() after leave() or close_all()")
        call.done = False
        call.progress_at = now
        self.send(call, now)

    def cancel(self, handle: CallHandle, now: float, reason: str) -> None:
        c = self.state
        call = c.calls[handle.operation_key]
        if call.done:
            return
        if self.http.modern:
            # 2026-07-28: closing the response stream is the cancellation (a posted
            # notifications/cancelled is not one), also before its answer's head came.
            for conn in [x for x in self.http.live.values() if x.call is call]:
                self.http.abort(conn, now, "cancelled")
        elif call.request_id is not None and not call.queued and c.session_usable():
            body = jsonrpc.notification(jsonrpc.CANCELLED, {"requestId": call.request_id, "reason": reason})
            self.http.open(Purpose.CANCEL, "POST", now, body=body)
        st = c.streams.get(call.stream_key or "")
        if st is not None and st.machine.can(Trigger.CANCELLED):
            st.machine.process(Trigger.CANCELLED)
            self.table.close_conn(st, now, "cancelled")
        self.finish(call, CallOutcome.CANCELLED, now, reason=reason, path=EndPath.CANCELLED)

    # ------------------------------------------------------------------ sending

    def send(self, call: Call, now: float) -> SendRequest | None:
        """Send an attempt of the call now if the session is active; else it stays queued."""
        c = self.state
        if c.session.state is not State.SESSION_ACTIVE or c.leave_requested:
            call.queued = True
            return None
        call.queued = False
        call.attempts += 1
        call.progress_at = now
        rid = c.new_request_id()
        call.request_id = rid
        call.stream_key = key = f"post:{rid}"
        meta: dict[str, Any] = {"progressToken": rid, IDEMPOTENCY_META: call.handle.operation_key}
        params = {"name": call.handle.tool, "arguments": call.arguments, "_meta": meta}
        body = jsonrpc.request(rid, "tools/call", params)
        return self.http.open(Purpose.CALL, "POST", now, body=body, stream_key=key, call=call)

    def head(self, conn: Conn, now: float) -> None:
        c = self.state
        call = conn.call
        assert call is not None
        status = conn.status or 0
        if call.done:
            self.http.abort(conn, now, "call_already_finished")  # cancelled before its answer came
            return
        if status == 200:
            if conn.sse:
                structured = c.structured_ids and c.tag is not None
                sid = post_stream_id(c.tag or "", call.request_id or 0) if structured else None
                st = self.table.new_stream(conn, call.request_id, call, sid)
                self.table.watch(st, now + self.config.stream_idle_s, "stream_idle")
            return
        self.http.abort(conn, now, f"http_{status}")
        if status in _RETRY_STATUSES or status in _UNKNOWN_STATUSES:
            self.lost(call, now, f"http_{status}", conn.retry_after)
        else:
            self.finish(call, CallOutcome.ERROR, now, reason=f"http_{status}")

    def lost(self, call: Call, now: float, cause: str, retry_after: float | None) -> None:
        """The call must be sent again (nothing of it can be resumed)."""
        key = call.handle.operation_key
        self.reconnector.lost(
            Target.CALL,
            key,
            now,
            cause,
            kind=Kind.RESEND,
            subject=call.stream_key or "",
            operation_key=key,
            retry_after=retry_after,
        )

    # ------------------------------------------------------------------ the re-send (a reconnect kind)

    def _ready(self, loss: Loss, now: float) -> bool:
        c = self.state
        call = c.calls[loss.name]
        if call.done or c.leave_requested or c.stopped:
            loss.at = None
            return False
        if self.config.retry_rule and not self.tools.may_resend(call.handle.tool, loss.cause):
            # The retry rule: the call may have run and the server did not say a repeat is
            # safe: its outcome is reported unknown, not re-sent.
            loss.at = None
            self.finish(
                call, CallOutcome.UNKNOWN, now, reason=f"not_resent_{loss.cause}", path=EndPath.ABANDONED
            )
            return False
        if c.session.state is not State.SESSION_ACTIVE:
            loss.at = None  # sent by the next handshake, still the same recovery
            call.queued = True
            return False
        return True

    def _attempt(self, loss: Loss, now: float) -> SendRequest:
        send = self.send(self.state.calls[loss.name], now)
        assert send is not None  # _ready checked the session
        return send

    def _exhausted(self, loss: Loss, now: float) -> None:
        call = self.state.calls[loss.name]
        self.finish(
            call, CallOutcome.UNKNOWN, now, reason=f"gave_up_after_{loss.cause}", path=EndPath.ABANDONED
        )

    # ------------------------------------------------------------------ the outcome

    def finish(
        self,
        call: Call,
        outcome: CallOutcome,
        now: float,
        *,
        result: jsonrpc.JsonObject | None = None,
        error: Any = None,
        reason: str = "",
        path: EndPath = EndPath.ABANDONED,
    ) -> None:
        """The call's one outcome. A recovery in progress ends with it: recovered if the
        call completed (ok or error), else never recovered, by `path`."""
        c = self.state
        if call.done:
            return
        call.done = True
        call.queued = False
        loss = self.reconnector.get(Target.CALL, call.handle.operation_key)
        if loss is not None:
            if outcome in (CallOutcome.OK, CallOutcome.ERROR):
                self.reconnector.recovered(loss, now)
            else:
                self.reconnector.end(loss, path)
        self.table.unwatch(call.stream_key)
        c.fx.records.append(
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
                c.generation,
            )
        )
        c.fx.notices.append(
            CallFinished(call.handle, outcome, now, result=result, error=error, reason=reason)
        )

    def give_up_waiting(self, now: float, reason: str, path: EndPath) -> None:
        """The client leaves or stops: every unfinished call ends UNKNOWN, and one still
        waiting without a recovery in progress is a loss that never recovered, from the
        last time it moved."""
        c = self.state
        for call in c.calls.values():
            if call.done:
                continue
            key = call.handle.operation_key
            self.reconnector.open(
                Target.CALL,
                key,
                now,
                reason,
                kind=Kind.RESEND if call.queued else Kind.RESUME,
                subject=call.stream_key or "",
                operation_key=key,
                lost_at=call.progress_at,
            )
            self.finish(call, CallOutcome.UNKNOWN, now, reason=reason, path=path)
