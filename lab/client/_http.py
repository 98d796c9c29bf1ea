"""Requests: their headers, the connections in flight, and one exchange record each.

The layer just above `ClientState`: every part opens and ends its connections here, and
this part needs no other (only the session facts that go into headers and records).
"""

from __future__ import annotations

from lab.client._acceptance import ConnectionView
from lab.client._client_state import ClientState
from lab.client._commands import CloseConnection, Headers, Purpose, SendRequest
from lab.client._config import ClientConfig
from lab.client._model import Call, Conn
from lab.wire import jsonrpc
from lab.wire.client_ledger import HttpExchange
from lab.wire.extensions import LAB_CONN_HEADER
from lab.wire.revisions import (
    LAST_EVENT_ID_HEADER,
    PROTOCOL_VERSION_HEADER,
    SESSION_HEADER,
    modern_stamp,
    revision,
)


class Connections:
    __slots__ = ("_next", "config", "live", "modern", "state")

    def __init__(self, state: ClientState, config: ClientConfig) -> None:
        self.state = state
        self.config = config
        self.live: dict[int, Conn] = {}
        self._next = 1
        self.modern = revision(config.protocol_version).modern
        """The client speaks the modern era (2026-07-28): every request names its revision
        and method in headers and `_meta`; there is no session to carry."""

    def headers(
        self, conn_id: int, purpose: Purpose, *, with_session: bool, last_event_id: str | None
    ) -> Headers:
        c, cfg = self.state, self.config
        # x-lab-conn names the connection in every ledger (tap, server, client), so the
        # checker can join them; servers ignore headers they do not know.
        h: list[tuple[str, str]] = [(LAB_CONN_HEADER, f"{cfg.client_id}:{conn_id}")]
        if purpose in (Purpose.STANDALONE, Purpose.RESUME):
            h.append(("accept", "text/event-stream"))
        elif purpose is not Purpose.DELETE:
            h.append(("accept", "application/json, text/event-stream"))
            h.append(("content-type", "application/json"))
        if cfg.origin is not None:
            h.append(("origin", cfg.origin))
        if cfg.token is not None:
            h.append(("authorization", f"Bearer {cfg.token}"))
        if with_session and c.session_id is not None:
            h.append((SESSION_HEADER, c.session_id))
        if (
            purpose is not Purpose.INITIALIZE
            and not self.modern
            and revision(c.protocol_version).version_header
        ):
            h.append((PROTOCOL_VERSION_HEADER, c.protocol_version))
        if last_event_id is not None:
            h.append((LAST_EVENT_ID_HEADER, last_event_id))
        return tuple(h)

    def open(
        self,
        purpose: Purpose,
        method: str,
        now: float,
        *,
        body: jsonrpc.JsonObject | None = None,
        stream_key: str | None = None,
        call: Call | None = None,
        last_event_id: str | None = None,
    ) -> SendRequest:
        """A new connection: its command goes out with the core's output."""
        c = self.state
        conn_id = self._next
        self._next += 1
        with_session = purpose is not Purpose.INITIALIZE and not self.modern
        headers = self.headers(conn_id, purpose, with_session=with_session, last_event_id=last_event_id)
        if self.modern and body is not None:
            body, mirrored = modern_stamp(body, self.config.protocol_version, self.config.client_name)
            headers += mirrored
        view = ConnectionView(conn_id, c.generation, c.protocol_version, self.config.auth_subject)
        carried = with_session and c.session_id is not None
        self.live[conn_id] = Conn(
            conn_id,
            purpose,
            method,
            view,
            now,
            stream_key,
            call,
            carried,
            last_event_id,
            session=c.session_pseudonym if carried else None,
        )
        data = None if body is None else jsonrpc.dumps(body).encode("utf-8")
        send = SendRequest(conn_id, purpose, method, headers, data)
        c.fx.commands.append(send)
        return send

    def end(self, conn: Conn, now: float, error: str) -> None:
        """Forget a connection and write its exchange record (exactly once per connection)."""
        if self.live.pop(conn.conn_id, None) is None:
            return
        self.state.fx.records.append(
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

    def over(self, conn: Conn, now: float, cause: str) -> None:
        """The response ended, by `cause` (`server_closed`: normally, so no error)."""
        self.end(conn, now, "" if cause == "server_closed" else cause)

    def abort(self, conn: Conn, now: float, reason: str, *, finished: bool = False) -> None:
        """End a connection and tell the driver to close it (`finished`: the response
        is complete, the driver may let the message end and keep the connection)."""
        self.end(conn, now, reason)
        self.state.fx.commands.append(CloseConnection(conn.conn_id, finished))

    def abort_id(self, conn_id: int | None, now: float, reason: str) -> None:
        conn = None if conn_id is None else self.live.get(conn_id)
        if conn is not None:
            self.abort(conn, now, reason)
