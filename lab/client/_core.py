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

The core owns one `ClientState` (`_client_state`: the session's facts, its calls and
streams, its flags, the effects sink) and six parts, one module each. Each part is given
the state and exactly the parts it calls, when it is made; none knows the core. The
modules are layered, each importing only those listed before it, so the imports form
no circle (tests/client/test_parts.py walks them):

    _client_state  the record every part reads and moves (it and all below use only the
                   vocabulary: `_model`, `_states`, `_commands`, `_config`,
                   `_acceptance`, `_reconnect`)
    _http          Connections: requests, their headers, one exchange record each
    _reconnector   Reconnector: every kind of reconnect, one table, one set of steps, the
                   only place Recovery rows are built; each kind's `Handler` comes from
                   the part that owns what it reconnects (`reconnect_handlers` below)
    _stream_table  StreamTable: streams made, their connections closed, silence deadlines
    _tools         ToolHints: the server's tools/list, what may be re-sent (the retry rule)
    _calls         Calling: tool calls, their attempts and their one outcome
    _streams       Streaming: the one door, losses, resumption, the standalone stream
    _leaving       Leaving: DELETE and stopping
    _handshake     Handshake: the session, a lost session (404), the new handshake
    _core          ClientCore: the public methods, and which part an answer is for

A part never calls one listed after it: where the answer to a request belongs to a later
part (the initialize stream, the end of an initialize or DELETE connection), the core
routes it there by the request's purpose, as `response_head` does. Every transition of a session or a stream is
in `_states`.
"""

from __future__ import annotations

from lab.client._acceptance import ConnectionView, InboxStore
from lab.client._calls import Calling
from lab.client._client_state import ClientState
from lab.client._commands import HANDSHAKES, CallHandle, CloseConnection, Effects, Headers, Output, Purpose
from lab.client._config import ClientConfig
from lab.client._handshake import Handshake
from lab.client._http import Connections
from lab.client._leaving import Leaving
from lab.client._model import Call, Conn, Stream
from lab.client._reconnect import RandomSource, ReconnectBudget, parse_retry_after
from lab.client._reconnector import Handler, Kind, Reconnector, Target
from lab.client._states import State
from lab.client._stream_table import StreamTable
from lab.client._streams import Streaming
from lab.client._tools import ToolHints
from lab.wire import jsonrpc
from lab.wire.errors import LocalProtocolError
from lab.wire.redact import Redactor
from lab.wire.revisions import PROTOCOL_VERSION_HEADER, SESSION_HEADER
from lab.wire.sse import SseDecoder

MESSAGE_TOO_LARGE = "message_too_large"
"""The cause of a connection the client closed because one message outgrew
`ClientConfig.max_message_bytes` (the exchange's `error`)."""


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
        self.redactor = redactor
        self.client_state = s = ClientState(config.client_id, redactor, config.protocol_version)
        # Made in layer order (see the module docstring): each part gets the parts below it.
        self.http = http = Connections(s, config)
        self.reconnector = rc = Reconnector(
            s, config, budget=budget, rng=rng, handlers=self.reconnect_handlers
        )
        self.table = table = StreamTable(s, http)
        self.tools = tools = ToolHints(s, http)
        self.calling = calling = Calling(s, config, http=http, reconnector=rc, table=table, tools=tools)
        self.streaming = streaming = Streaming(
            s, config, inbox=inbox, http=http, reconnector=rc, table=table, calling=calling
        )
        self.leaving = leaving = Leaving(s, http=http, reconnector=rc, calling=calling, table=table)
        self.handshake = Handshake(
            s,
            config,
            http=http,
            reconnector=rc,
            table=table,
            calling=calling,
            streaming=streaming,
            leaving=leaving,
            tools=tools,
        )

    # ------------------------------------------------------------------ what the application does

    # Read-only views of the client's state for drivers, Locust users and tests (the
    # parts move it; nothing outside the core should).

    @property
    def state(self) -> State:
        return self.client_state.session.state

    @property
    def session_id(self) -> str | None:
        return self.client_state.session_id

    @property
    def session_pseudonym(self) -> str | None:
        return self.client_state.session_pseudonym

    @property
    def generation(self) -> int:
        return self.client_state.generation

    @property
    def protocol_version(self) -> str:
        return self.client_state.protocol_version

    @property
    def structured_ids(self) -> bool:
        return self.client_state.structured_ids

    @property
    def calls(self) -> dict[str, Call]:
        return self.client_state.calls

    @property
    def streams(self) -> dict[str, Stream]:
        return self.client_state.streams

    @property
    def fx(self) -> Effects:
        return self.client_state.fx

    @property
    def tools_pending(self) -> bool:
        """The retry rule's `tools/list` is on its way (what may be re-sent is not known yet)."""
        return self.tools.pending()

    def stream_key_of(self, conn_id: int) -> str | None:
        """The client's name of the stream a connection carries (None if none, or unknown)."""
        conn = self.http.live.get(conn_id)
        return None if conn is None else conn.stream_key

    def connect(self, now: float) -> Output:
        """Start the first handshake."""
        if self.state is not State.REINITIALIZE_REQUIRED or self.reconnector.get(Target.SESSION) is not None:
            raise LocalProtocolError(f"connect() in {self.state}")
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
        """Cancel = `notifications/cancelled`, never just a dropped connection; in the
        modern era, where closing the call's stream is its cancellation, that close."""
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
        # Asked after every event a driver feeds: no list, no generator.
        a, b = self.reconnector.next_wakeup(), self.table.next_deadline()
        if a is None or b is None:
            return b if a is None else a
        return a if a < b else b

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
        if conn.purpose in HANDSHAKES:
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
        elif conn.purpose is Purpose.TOOLS_LIST:
            self.tools.head(conn, now)
        else:  # initialized / cancel notifications: 202 expected, nothing to do
            self.http.end(conn, now, "")
        return self.fx.take()

    def response_data(self, conn_id: int, data: bytes, now: float) -> Output:
        conn = self.http.live.get(conn_id)
        if conn is None:
            return self.fx.take()
        limit = self.config.max_message_bytes
        if conn.decoder is None:
            conn.body += data
            if len(conn.body) > limit:
                self._too_large(conn, now)
            return self.fx.take()
        events = conn.decoder.feed(data)
        for i, ev in enumerate(events):
            if conn_id not in self.http.live:
                self.streaming.after_close(conn, events[i:], now)
                break
            if conn.purpose in HANDSHAKES:
                self.handshake.event(conn, ev, now)  # no session yet: not the session's door
            elif conn.purpose is Purpose.TOOLS_LIST:
                self.tools.event(conn, ev, now)  # the client's own question, not a call's stream
            else:
                self.streaming.on_event(conn, ev, now)
        if conn.decoder.pending_chars > limit and conn_id in self.http.live:
            self._too_large(conn, now)
        return self.fx.take()

    def _too_large(self, conn: Conn, now: float) -> None:
        """A message grew past `max_message_bytes`: the connection is closed before it holds
        more, and ends as any lost one (a stream is resumed, within its attempts)."""
        conn.body = bytearray()
        if conn.decoder is not None:
            conn.decoder.end_of_stream()
        self.fx.commands.append(CloseConnection(conn.conn_id, False))
        self._connection_over(conn, now, MESSAGE_TOO_LARGE)

    def response_end(self, conn_id: int, now: float) -> Output:
        """The server ended the response normally."""
        conn = self.http.live.get(conn_id)
        if conn is None:
            return self.fx.take()
        if conn.decoder is not None:
            cut = conn.decoder.end_of_stream()
            self._connection_over(conn, now, "cut_mid_event" if cut else "server_closed")
        elif conn.purpose in HANDSHAKES:
            self.handshake.body(conn, now)
        elif conn.purpose is Purpose.CALL and conn.status == 200:
            self.streaming.json_body(conn, now)
        elif conn.purpose is Purpose.TOOLS_LIST:
            self.tools.body(conn, now)
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
        self._connection_over(conn, now, error or "connection_lost")
        return self.fx.take()

    def _connection_over(self, conn: Conn, now: float, cause: str) -> None:
        """A connection the core still held ended: its exchange record, then the part
        whose request it was."""
        if conn.purpose in HANDSHAKES:
            self.http.over(conn, now, cause)
            self.handshake.failed(conn, now, cause, ended=True)
        elif conn.purpose is Purpose.DELETE:
            self.http.over(conn, now, cause)
            self.leaving.unanswered(now, cause)
        elif conn.purpose is Purpose.TOOLS_LIST:
            self.http.over(conn, now, cause)  # not told: nothing is safe to re-send
        else:
            self.streaming.connection_over(conn, now, cause)

    # ------------------------------------------------------------------ for the parts

    def reconnect_handlers(self) -> dict[Kind, Handler]:
        """What each kind of reconnect does, for the reconnector (it asks on first use)."""
        return {
            Kind.RESUME: self.streaming.resume_handler(),
            Kind.RESEND: self.calling.handler(),
            Kind.REOPEN: self.streaming.reopen_handler(),
            Kind.REINITIALIZE: self.handshake.handler(),
            Kind.DELETE: self.leaving.handler(),
        }
