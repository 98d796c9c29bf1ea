"""The MCP Streamable HTTP client, with no I/O: facts in, one output out.

`ClientCore` is one client: one session (re-established when lost), the standalone GET
stream, one POST stream per tool call, and the reconnects. It never touches a socket or
a clock: its driver passes the time (`now`, Unix epoch seconds) with every call, and
every public method returns one `Output` (commands for the driver, ledger records,
notices for the application), which is all it says.

    driver / application                     ClientCore
    --------------------                     ----------
    connect(now)                      ->     Output(commands=[SendRequest(initialize)])
    response_head(conn, status, hdrs) ->     Output(...)
    response_data(conn, bytes)        ->     Output(...)   every SSE event goes through
    response_end(conn) / connection_failed(conn)            accept_stream_event()
    tick(now) when now >= next_wakeup()  ->  Output(commands=[SendRequest(resume ...)])
    call_tool / retry_call / cancel / leave / close_all -> Output (call_tool: with its handle)

The parts, one module each: `_http` (requests and their exchange records), `_handshake`
(the session), `_calls` (tool calls and their outcomes), `_streams` (the one door,
losses, resumption, silent streams), `_leaving` (DELETE, stopping), `_reconnector` (every
kind of reconnect, one table, one set of steps, the only place Recovery rows are built).
Every transition of a session or a stream is in `_states`.
"""

from __future__ import annotations

from lab.client._acceptance import ConnectionView, InboxStore
from lab.client._calls import Calling
from lab.client._commands import CallHandle, Effects, Headers, Output, Purpose
from lab.client._config import ClientConfig
from lab.client._handshake import Handshake
from lab.client._http import Connections
from lab.client._leaving import Leaving
from lab.client._model import Call, Stream
from lab.client._reconnect import RandomSource, ReconnectBudget, parse_retry_after
from lab.client._reconnector import Handler, Kind, Reconnector, Target
from lab.client._states import Machine, Role, State
from lab.client._streams import Streaming
from lab.wire import jsonrpc
from lab.wire.errors import LocalProtocolError
from lab.wire.redact import Redactor
from lab.wire.revisions import PROTOCOL_VERSION_HEADER, SESSION_HEADER
from lab.wire.sse import SseDecoder


class ClientCore:
    """One MCP client, sans-IO. See the module docstring for the protocol with the driver."""

    def __init__(
        self,
        config: ClientConfig,
        *,
        inbox: InboxStore,
        budget: ReconnectBudget,
        redactor: Redactor,
        rng: RandomSource,
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
        self.tag: str | None = None
        self.calls: dict[str, Call] = {}
        self.streams: dict[str, Stream] = {}
        self.leave_requested = False
        self.stopped = False
        self._next_request = 1
        self.fx = Effects()
        self.http = Connections(self)
        self.reconnector = Reconnector(self)
        self.handshake = Handshake(self)
        self.calling = Calling(self)
        self.streaming = Streaming(self)
        self.leaving = Leaving(self)

    # ------------------------------------------------------------------ what the application does

    @property
    def state(self) -> State:
        return self.session.state

    @property
    def session_pseudonym(self) -> str | None:
        return self.redactor.session(self.session_id)

    def stream_key_of(self, conn_id: int) -> str | None:
        """The client's name of the stream a connection carries (None if none, or unknown)."""
        conn = self.http.live.get(conn_id)
        return None if conn is None else conn.stream_key

    def connect(self, now: float) -> Output:
        """Start the first handshake."""
        if (
            self.session.state is not State.REINITIALIZE_REQUIRED
            or self.reconnector.get(Target.SESSION) is not None
        ):
            raise LocalProtocolError(f"connect() in {self.session.state}")
        self.handshake.send_initialize(now)
        return self.fx.take()

    def call_tool(
        self,
        name: str,
        arguments: jsonrpc.JsonObject,
        now: float,
        *,
        idempotency_key: str | None = None,
        write: bool = False,
    ) -> tuple[CallHandle, Output]:
        """Start a logical operation. It is sent now if the session is active, else queued."""
        handle = self.calling.start(name, arguments, now, idempotency_key, write)
        return handle, self.fx.take()

    def retry_call(self, handle: CallHandle, now: float) -> Output:
        """Explicitly re-run an operation whose outcome was UNKNOWN (same idempotency key)."""
        self.calling.retry(handle, now)
        return self.fx.take()

    def cancel(self, handle: CallHandle, now: float, reason: str = "cancelled by user") -> Output:
        """Cancel = `notifications/cancelled`, never just a dropped connection."""
        self.calling.cancel(handle, now, reason)
        return self.fx.take()

    def leave(self, now: float) -> Output:
        """Stop waiting for anything, close the streams and DELETE the session."""
        self.leaving.leave(now)
        return self.fx.take()

    def close_all(self, now: float, reason: str = "client_stopped") -> Output:
        """The client stops (its process is quitting): every unfinished call gets its
        outcome, every recovery its end, every open connection its exchange record."""
        self.leaving.close_all(now, reason)
        return self.fx.take()

    def next_wakeup(self) -> float | None:
        times = [t for t in (self.reconnector.next_wakeup(), self.streaming.next_deadline()) if t is not None]
        return min(times) if times else None

    def tick(self, now: float) -> Output:
        """Run whatever is due at `now`: reconnects held by backoff or the budget, and
        streams that stayed silent too long."""
        self.reconnector.tick(now)
        self.streaming.tick(now)
        return self.fx.take()

    # ------------------------------------------------------------------ what the driver reports

    def response_head(
        self, conn_id: int, status: int, headers: Headers | list[tuple[str, str]], now: float
    ) -> Output:
        conn = self.http.live.get(conn_id)
        if conn is None:
            return self.fx.take()
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
                self.handshake.pending_session_id = h.get(SESSION_HEADER)
            else:
                self.handshake.failed(conn, now, f"http_{status}")
        elif status == 404 and conn.carried_session:
            self.handshake.session_not_found(conn, now)
        elif conn.purpose is Purpose.CALL:
            self.calling.head(conn, now)
        elif conn.purpose is Purpose.STANDALONE:
            self.streaming.standalone_head(conn, now)
        elif conn.purpose is Purpose.RESUME:
            self.streaming.resume_head(conn, now)
        elif conn.purpose is Purpose.DELETE:
            self.leaving.delete_head(conn, now)
        else:  # initialized / cancel notifications: 202 expected, nothing to do
            self.http.end(conn, now, "")
        return self.fx.take()

    def response_data(self, conn_id: int, data: bytes, now: float) -> Output:
        conn = self.http.live.get(conn_id)
        if conn is None:
            return self.fx.take()
        if conn.decoder is None:
            conn.body += data
            return self.fx.take()
        events = conn.decoder.feed(data)
        for i, ev in enumerate(events):
            if conn_id not in self.http.live:
                self.streaming.after_close(conn, events[i:], now)
                break
            self.streaming.on_event(conn, ev, now)
        return self.fx.take()

    def response_end(self, conn_id: int, now: float) -> Output:
        """The server ended the response normally."""
        conn = self.http.live.get(conn_id)
        if conn is None:
            return self.fx.take()
        if conn.decoder is not None:
            cut = conn.decoder.end_of_stream()
            self.streaming.connection_over(conn, now, "cut_mid_event" if cut else "server_closed")
        elif conn.purpose is Purpose.INITIALIZE:
            self.handshake.body(conn, now)
        elif conn.purpose is Purpose.CALL and conn.status == 200:
            self.calling.json_body(conn, now)
        else:
            self.http.end(conn, now, "")
        return self.fx.take()

    def connection_failed(self, conn_id: int, now: float, error: str = "connection_lost") -> Output:
        """The connection broke (reset, timeout, refused) before or during the response.
        `error` names the cause (the driver maps its transport's exceptions to the lab's
        cause names)."""
        conn = self.http.live.get(conn_id)
        if conn is None:
            return self.fx.take()
        if conn.decoder is not None:
            conn.decoder.end_of_stream()
        self.streaming.connection_over(conn, now, error or "connection_lost")
        return self.fx.take()

    # ------------------------------------------------------------------ shared by the parts

    def reconnect_handlers(self) -> dict[Kind, Handler]:
        """What each kind of reconnect does, for the reconnector (it asks on first use)."""
        return {
            Kind.RESUME: self.streaming.resume_handler(),
            Kind.RESEND: self.calling.handler(),
            Kind.REOPEN: self.streaming.reopen_handler(),
            Kind.REINITIALIZE: self.handshake.handler(),
            Kind.DELETE: self.leaving.handler(),
        }

    def session_usable(self) -> bool:
        return self.session.state in (State.SESSION_ACTIVE, State.DELETE_REQUESTED)

    def new_request_id(self) -> int:
        rid = self._next_request
        self._next_request += 1
        return rid
