"""Streams: every event through the one door, losses, resumption, and silent streams.

- Every SSE event goes through `accept_stream_event`; every event the client does not
  take gets an `events_rejected` row, including the rest of a chunk after the client
  stopped reading its connection (the stream's response came, or the connection could
  no longer be trusted).
- A lost stream is resumed with GET + `Last-Event-ID` = the inbox watermark of *that*
  stream, after checking the cursor belongs to this session and this stream. A stream
  without a valid cursor (or whose cursor the server refused) falls back to the next kind
  of the reconnector's table: its call is re-sent, or a fresh standalone stream opened.
- In the modern era (2026-07-28) a lost call stream is not resumed but re-issued
  (`Calling.lost`): its request was cancelled by the break.
- A resumed call stream that stays silent, or a call stream that only keeps itself alive,
  is lost like any other (`ClientConfig.resume_silence_s`, `stream_idle_s`; the deadlines
  are kept by `_stream_table`, which `_calls` shares, and `tick` acts on them here).
"""

from __future__ import annotations

from lab.client._acceptance import (
    Acceptance,
    InboxStore,
    Outcome,
    RejectReason,
    SessionView,
    StreamView,
    accept_stream_event,
)
from lab.client._calls import Calling
from lab.client._client_state import ClientState
from lab.client._commands import CallOutcome, Progress, Purpose, SendRequest
from lab.client._config import ClientConfig
from lab.client._http import Connections
from lab.client._model import Conn, Stream
from lab.client._reconnector import EndPath, Handler, Kind, Loss, Reconnector, Target
from lab.client._states import State, Trigger
from lab.client._stream_table import StreamTable
from lab.wire import jsonrpc
from lab.wire.client_ledger import EventRejected
from lab.wire.event_ids import (
    CursorVerdict,
    classify_opaque,
    classify_structured,
    message_digest,
    parse_event_id,
)
from lab.wire.sse import SseEvent

_CURSOR_REFUSED_STATUSES = frozenset({400, 405, 409, 410, 422})
_UNTRUSTED_CONNECTION = frozenset(
    {RejectReason.CURSOR_GAP, RejectReason.PROTOCOL_VERSION_MISMATCH, RejectReason.SUBJECT_MISMATCH}
)
DUPLICATE = "duplicate"
"""`events_rejected.reason` of an event already in the inbox (not an error, not taken twice)."""


class Streaming:
    """What comes on the streams of `ClientState.streams`, and getting a lost one back.
    The initialize stream and the DELETE's answer are not streams of the session: the
    core hands those to `Handshake` and `Leaving`, which sit above this part."""

    __slots__ = (
        "_next_standalone",
        "calling",
        "config",
        "http",
        "inbox",
        "reconnector",
        "standalone",
        "state",
        "table",
    )

    def __init__(
        self,
        state: ClientState,
        config: ClientConfig,
        *,
        inbox: InboxStore,
        http: Connections,
        reconnector: Reconnector,
        table: StreamTable,
        calling: Calling,
    ) -> None:
        self.state = state
        self.config = config
        self.inbox = inbox
        self.http = http
        self.reconnector = reconnector
        self.table = table
        self.calling = calling
        self.standalone: str | None = None
        """Key of the current standalone stream (also while it is being resumed)."""
        self._next_standalone = 1

    def resume_handler(self) -> Handler:
        return Handler(self._resume_ready, self._resume_attempt, self._resume_exhausted)

    def reopen_handler(self) -> Handler:
        return Handler(self._reopen_ready, self._reopen_attempt, self._reopen_exhausted)

    # ------------------------------------------------------------------ the door

    def on_event(self, conn: Conn, ev: SseEvent, now: float) -> None:
        """An event of a stream of the session (any connection but an initialize one)."""
        c = self.state
        st = c.streams.get(conn.stream_key or "")
        if st is not None and ev.retry is not None:
            st.retry_ms = ev.retry
        if ev.id is None and not ev.has_data:
            return  # a retry-only block: advice, not an event
        if st is None:
            self.reject_event(conn, conn.stream_key or "", ev, RejectReason.NO_STREAM, "no stream yet", now)
            return
        call = st.call
        result = accept_stream_event(
            self.inbox,
            client_id=self.config.client_id,
            session=SessionView(
                c.generation,
                c.session_usable(),
                c.protocol_version,
                self.config.auth_subject,
                c.tag,
                c.structured_ids,
                c.server_generation,
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
            event_id=self._event_id(conn, ev),
            now=now,
            checks=self.config.checks,
        )
        if result.outcome is not Outcome.ACCEPTED:
            self._not_accepted(conn, st, result, now)
            return
        if result.bound_server_stream_id is not None:
            st.server_stream_id = result.bound_server_stream_id
        if result.bound_server_generation is not None:
            c.server_generation = result.bound_server_generation
        msg = result.message
        loss = self._loss_of(st)
        if loss is not None and (msg is not None or call is None):
            self.reconnector.recovered(loss, now)  # the first message on the stream got back
        if msg is None or call is None:
            return
        call.progress_at = now
        self.table.watch(st, now + self.config.stream_idle_s, "stream_idle")
        if msg.method == jsonrpc.PROGRESS:
            p = msg.params.get("progress")
            c.fx.notices.append(Progress(call.handle, float(p) if isinstance(p, int | float) else None, now))
        if not result.ends_stream:
            return
        st.ended = True
        st.machine.process(Trigger.COMPLETED)
        st.conn_id = None
        self.table.unwatch(st.key)
        self.http.abort(conn, now, "", finished=True)
        if msg.kind is jsonrpc.MessageKind.RESPONSE:
            res = msg.body.get("result")
            self.calling.finish(call, CallOutcome.OK, now, result=res if isinstance(res, dict) else None)
        else:
            self.calling.finish(
                call, CallOutcome.ERROR, now, error=msg.body.get("error"), reason="jsonrpc_error"
            )

    def json_body(self, conn: Conn, now: float) -> None:
        """A call answered with `application/json`: one message, no event ID, no cursor,
        through the same door as the events of a stream."""
        call = conn.call
        assert call is not None
        self.table.new_stream(conn, call.request_id, call, None)
        self.on_event(conn, SseEvent(data=bytes(conn.body).decode("utf-8", errors="replace")), now)
        if conn.conn_id in self.http.live:
            self.connection_over(conn, now, "server_closed")

    def after_close(self, conn: Conn, events: list[SseEvent], now: float) -> None:
        """Events that came in the same chunk after the client stopped reading `conn`.
        After the stream's response they still go through the door (which refuses them:
        nothing comes after a response); after the client gave up on the connection
        they are refused unread."""
        st = self.state.streams.get(conn.stream_key or "")
        for ev in events:
            if ev.id is None and not ev.has_data:
                continue
            if st is not None and st.ended:
                self.on_event(conn, ev, now)
            else:
                self.reject_event(
                    conn,
                    conn.stream_key or "",
                    ev,
                    RejectReason.CONNECTION_ABANDONED,
                    "read after the close",
                    now,
                )

    def _event_id(self, conn: Conn, ev: SseEvent) -> str:
        if ev.id is not None:
            return ev.id
        conn.synthetic += 1
        return f"~{conn.conn_id}.{conn.synthetic}"

    def reject_event(
        self, conn: Conn, stream_key: str, ev: SseEvent, reason: RejectReason, detail: str, now: float
    ) -> None:
        self._reject_row(
            conn, stream_key, self._event_id(conn, ev), message_digest(ev.data), str(reason), detail, now
        )

    def _reject_row(
        self, conn: Conn, stream_key: str, event_id: str, digest: str, reason: str, detail: str, now: float
    ) -> None:
        c = self.state
        c.fx.records.append(
            EventRejected(
                self.config.client_id,
                conn.conn_id,
                c.generation,
                stream_key,
                event_id,
                digest,
                reason,
                detail,
                now,
            )
        )

    def _not_accepted(self, conn: Conn, st: Stream, result: Acceptance, now: float) -> None:
        reason = str(result.reason) if result.reason is not None else DUPLICATE
        self._reject_row(conn, st.key, result.event_id, result.digest, reason, result.detail, now)
        if result.reason not in _UNTRUSTED_CONNECTION or conn.conn_id not in self.http.live:
            return
        # Something between us and the server lost events or changed identity: this
        # connection cannot be trusted further; resume from the watermark on a new one.
        self.http.abort(conn, now, str(result.reason))
        st.conn_id = None
        self.table.unwatch(st.key)
        if st.machine.can(Trigger.CONNECTION_LOST):
            st.machine.process(Trigger.CONNECTION_LOST)
            self.stream_lost(st, now, str(result.reason))

    # ------------------------------------------------------------------ losses

    def _loss_of(self, st: Stream) -> Loss | None:
        rc = self.reconnector
        if st.call is not None:
            return rc.get(Target.CALL, st.call.handle.operation_key)
        return rc.get(Target.STANDALONE) if st.key == self.standalone else None

    def connection_over(self, conn: Conn, now: float, cause: str) -> None:
        """A connection ended (normally or not) while the core still held it (not an
        initialize or a DELETE: the core hands those to their parts)."""
        c = self.state
        self.http.over(conn, now, cause)
        st = c.streams.get(conn.stream_key or "")
        if st is not None and st.conn_id == conn.conn_id:
            st.conn_id = None
            self.table.unwatch(st.key)
            if st.state is State.STREAM_OPEN and not st.ended:
                st.machine.process(
                    Trigger.SERVER_CLOSED if cause == "server_closed" else Trigger.CONNECTION_LOST
                )
                self.stream_lost(st, now, cause)
            elif st.state is State.RESUME_PENDING:
                self._resume_failed(st, now, cause, None)  # the resumption failed before its answer
            return
        if conn.purpose is Purpose.CALL and conn.call is not None and st is None and conn.status is None:
            # Lost before any response head: the request may or may not have arrived.
            if not conn.call.done:
                self.calling.lost(conn.call, now, cause, None)
            return
        if conn.purpose is Purpose.STANDALONE and st is None and self.standalone == conn.stream_key:
            self.standalone = None
            self._reopen_lost(now, cause, None, conn.stream_key)

    def stream_lost(self, st: Stream, now: float, cause: str) -> None:
        """The stream is DISCONNECTED: resume it if a valid cursor exists, else fall back."""
        c = self.state
        if c.leave_requested or c.stopped or c.session.state is not State.SESSION_ACTIVE:
            st.machine.process(Trigger.ABANDONED)
            return
        if self.http.modern and st.call is not None:
            # 2026-07-28: no resumption; the close cancelled the request, so the call is
            # re-issued as a new request (its idempotency key kept, within the retry rule).
            st.machine.process(Trigger.REISSUED)
            self.calling.lost(st.call, now, cause, None)
            return
        target, name = (
            (Target.CALL, st.call.handle.operation_key) if st.call is not None else (Target.STANDALONE, "")
        )
        if self.valid_cursor(st) is None:
            st.machine.process(Trigger.NO_VALID_CURSOR)
            loss = self.reconnector.open(
                target, name, now, cause, kind=Kind.RESUME, subject=st.key, operation_key=name or None
            )
            self._unresumable(st, loss, now, "no_valid_cursor")
            return
        st.machine.process(Trigger.RESUME_SCHEDULED)
        self.reconnector.lost(
            target,
            name,
            now,
            cause,
            kind=Kind.RESUME,
            subject=st.key,
            operation_key=name or None,
            retry_ms=st.retry_ms,
        )

    def _unresumable(self, st: Stream, loss: Loss, now: float, reason: str) -> None:
        """No cursor to resume from (or the server refused it): the table's next kind."""
        if st.call is not None and st.call.done:
            self.reconnector.end(loss, EndPath.ABANDONED)
            return
        if st.call is None:
            if st.key != self.standalone:
                return
            self.standalone = None
        self.reconnector.fall_back(loss, now, reason, after=Kind.RESUME)

    def valid_cursor(self, st: Stream) -> str | None:
        """The stream's watermark, if it is a cursor of this session and of this stream."""
        c = self.state
        wm = self.inbox.watermark(st.generation, st.key)
        if wm is None or st.generation != c.generation:
            return None
        if c.structured_ids:
            parsed = parse_event_id(wm.event_id)
            if parsed is None:
                return None
            verdict = classify_structured(
                parsed, session_tag=c.tag or "", generation=c.server_generation, stream_id=st.server_stream_id
            )
        else:
            seen = self.inbox.seen(st.generation, wm.event_id)
            verdict = classify_opaque(st.key, None if seen is None else seen.stream_key)
        return wm.event_id if verdict is CursorVerdict.VALID else None

    # ------------------------------------------------------------------ resumption (a reconnect kind)

    def _stream_of(self, loss: Loss) -> Stream | None:
        c = self.state
        key = c.calls[loss.name].stream_key if loss.target is Target.CALL else self.standalone
        return c.streams.get(key or "")

    def _resume_ready(self, loss: Loss, now: float) -> bool:
        st = self._stream_of(loss)
        if st is None or st.state is not State.RESUME_PENDING or st.conn_id is not None:
            loss.at = None
            return False
        if self.valid_cursor(st) is None:
            st.machine.process(Trigger.CURSOR_REFUSED)
            self._unresumable(st, loss, now, "no_valid_cursor")
            return False
        return True

    def _resume_attempt(self, loss: Loss, now: float) -> SendRequest:
        st = self._stream_of(loss)
        assert st is not None
        send = self.http.open(
            Purpose.RESUME, "GET", now, stream_key=st.key, call=st.call, last_event_id=self.valid_cursor(st)
        )
        st.conn_id = send.conn_id
        return send

    def _resume_exhausted(self, loss: Loss, now: float) -> None:
        st = self._stream_of(loss)
        if st is not None:
            if st.machine.can(Trigger.ABANDONED):
                st.machine.process(Trigger.ABANDONED)
            self.table.close_conn(st, now, "gave_up_resuming")
            self._unresumable(st, loss, now, f"gave_up_resuming_after_{loss.cause}")

    def resume_head(self, conn: Conn, now: float) -> None:
        c = self.state
        st = c.streams.get(conn.stream_key or "")
        if st is None or st.conn_id != conn.conn_id or st.state is not State.RESUME_PENDING:
            self.http.abort(conn, now, "stale_resume")
            return
        if conn.sse:
            st.machine.process(Trigger.RESUMED)
            if st.call is None:
                # A standalone stream may stay silent: it has recovered once it is open again.
                loss = self._loss_of(st)
                if loss is not None:
                    self.reconnector.recovered(loss, now)
            else:
                self.table.watch(st, now + self.config.resume_silence_s, "resume_silent")
            return
        status = conn.status or 0
        self.http.abort(conn, now, f"http_{status}")
        st.conn_id = None
        if status in _CURSOR_REFUSED_STATUSES:
            st.machine.process(Trigger.CURSOR_REFUSED)
            loss = self._loss_of(st)
            if loss is not None:
                self._unresumable(st, loss, now, f"cursor_refused_http_{status}")
            return
        self._resume_failed(st, now, f"http_{status}", conn.retry_after)

    def _resume_failed(self, st: Stream, now: float, cause: str, retry_after: float | None) -> None:
        """A resumption got no stream (network error, 429, 503): try again later."""
        c = self.state
        st.machine.process(Trigger.RESUME_FAILED)
        if c.leave_requested or c.stopped:
            st.machine.process(Trigger.ABANDONED)
            return
        st.machine.process(Trigger.RESUME_SCHEDULED)
        target, name = (
            (Target.CALL, st.call.handle.operation_key) if st.call is not None else (Target.STANDALONE, "")
        )
        self.reconnector.lost(target, name, now, cause, kind=Kind.RESUME, retry_after=retry_after)

    # ------------------------------------------------------------------ silent streams

    def tick(self, now: float) -> None:
        c = self.state
        for key, cause in self.table.due(now):
            st = c.streams.get(key)
            if st is None or st.state is not State.STREAM_OPEN or st.ended:
                continue
            self.table.close_conn(st, now, cause)
            st.machine.process(Trigger.CONNECTION_LOST)
            self.stream_lost(st, now, cause)

    # ------------------------------------------------------------------ the standalone stream

    def open_standalone(self, now: float) -> SendRequest:
        key = f"get:{self._next_standalone}"
        self._next_standalone += 1
        self.standalone = key
        return self.http.open(Purpose.STANDALONE, "GET", now, stream_key=key)

    def standalone_head(self, conn: Conn, now: float) -> None:
        if conn.sse:
            self.table.new_stream(conn, None, None, None)
            loss = self.reconnector.get(Target.STANDALONE)
            if loss is not None:
                self.reconnector.recovered(loss, now)
            return
        self.http.abort(conn, now, f"http_{conn.status}")
        if self.standalone == conn.stream_key:
            self.standalone = None
        if conn.status != 405:
            self._reopen_lost(now, f"http_{conn.status}", conn.retry_after, conn.stream_key)
            return
        # 405: the server offers no GET stream. Fine for a first open; a stream that was
        # being got back will not come back.
        loss = self.reconnector.get(Target.STANDALONE)
        if loss is not None:
            self.reconnector.end(loss, EndPath.ABANDONED)

    def _reopen_lost(self, now: float, cause: str, retry_after: float | None, subject: str | None) -> None:
        c = self.state
        if c.session.state is not State.SESSION_ACTIVE or c.leave_requested or c.stopped:
            return
        self.reconnector.lost(
            Target.STANDALONE,
            "",
            now,
            cause,
            kind=Kind.REOPEN,
            subject=subject or "",
            retry_after=retry_after,
        )

    def _reopen_ready(self, loss: Loss, now: float) -> bool:
        c = self.state
        if c.session.state is not State.SESSION_ACTIVE or c.leave_requested or c.stopped:
            loss.at = None
            return False
        if self.standalone is not None:
            loss.at = None  # one is being opened already: its answer ends this recovery
            return False
        return True

    def _reopen_attempt(self, loss: Loss, now: float) -> SendRequest:
        return self.open_standalone(now)

    def _reopen_exhausted(self, loss: Loss, now: float) -> None:
        self.reconnector.end(loss, EndPath.ABANDONED)
