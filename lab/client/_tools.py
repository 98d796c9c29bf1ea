"""What the server says of its tools, for the retry rule: which calls may be re-sent.

A call whose outcome is unknown (it may have run, its answer was lost) may be re-sent
only if the server said that is safe: the tool annotated `readOnlyHint` or
`idempotentHint` in `tools/list`, or its entry saying the server honours the call's
idempotency key (`_meta["mcp-lab/idempotency-key"]: true`, lab.wire.extensions). So the
client lists the tools once, after its first handshake (one request per client, not per
session: the tools are the server's, not the session's), and `Calling` asks
`may_resend` before every re-send of an ambiguous loss. Until the answer comes, or if
it never does, nothing is safe to re-send: such a call ends with outcome UNKNOWN.
"""

from __future__ import annotations

from lab.client._client_state import ClientState
from lab.client._commands import Purpose
from lab.client._http import Connections
from lab.client._model import Conn
from lab.wire import jsonrpc
from lab.wire.errors import RemoteProtocolError
from lab.wire.extensions import IDEMPOTENCY_META
from lab.wire.sse import SseEvent

TOOLS_LIST = "tools/list"
SAFE_HINTS = ("readOnlyHint", "idempotentHint")
REFUSED_UNPROCESSED = frozenset({"http_429", "http_503"})
"""Losses of a request the server refused before processing it: a re-send is always safe."""


def safe_to_resend(result: object) -> frozenset[str] | None:
    """The tools a `tools/list` result says may be re-sent; None if it is not one."""
    tools = result.get("tools") if isinstance(result, dict) else None
    if not isinstance(tools, list):
        return None
    safe = set()
    for tool in tools:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            continue
        hints = tool.get("annotations")
        meta = tool.get("_meta")
        if (isinstance(hints, dict) and any(hints.get(k) is True for k in SAFE_HINTS)) or (
            isinstance(meta, dict) and meta.get(IDEMPOTENCY_META) is True
        ):
            safe.add(tool["name"])
    return frozenset(safe)


class ToolHints:
    """The `tools/list` request and its answer (JSON or a one-message SSE stream)."""

    __slots__ = ("http", "state")

    def __init__(self, state: ClientState, http: Connections) -> None:
        self.state = state
        self.http = http

    def send(self, now: float) -> None:
        """List the tools, unless told already or asked already (one request at a time)."""
        c = self.state
        if c.resend_safe is not None or any(x.purpose is Purpose.TOOLS_LIST for x in self.http.live.values()):
            return
        self.http.open(
            Purpose.TOOLS_LIST, "POST", now, body=jsonrpc.request(c.new_request_id(), TOOLS_LIST, {})
        )

    def pending(self) -> bool:
        """The tools are not known yet and their `tools/list` is on its way."""
        return self.state.resend_safe is None and any(
            x.purpose is Purpose.TOOLS_LIST for x in self.http.live.values()
        )

    def may_resend(self, tool: str, cause: str) -> bool:
        """May a call of `tool`, lost by `cause`, be sent again?"""
        if cause in REFUSED_UNPROCESSED:
            return True
        safe = self.state.resend_safe
        return safe is not None and tool in safe

    def head(self, conn: Conn, now: float) -> None:
        if conn.status != 200:
            self.http.abort(conn, now, f"http_{conn.status}")

    def body(self, conn: Conn, now: float) -> None:
        """An `application/json` answer."""
        self.http.end(conn, now, "")
        try:
            self._learn(jsonrpc.parse_message(bytes(conn.body)))
        except RemoteProtocolError:
            return  # not told: nothing is safe to re-send

    def event(self, conn: Conn, ev: SseEvent, now: float) -> None:
        """An event of the answer's stream: the result ends it; anything else is passed
        over (this is no call of the application's)."""
        if not ev.is_message:
            return
        try:
            msg = jsonrpc.parse_message(ev.data)
        except RemoteProtocolError:
            return
        if msg.kind.is_response:
            self.http.abort(conn, now, "", finished=True)
            self._learn(msg)

    def _learn(self, msg: jsonrpc.Message) -> None:
        if msg.kind is jsonrpc.MessageKind.RESPONSE:
            safe = safe_to_resend(msg.body.get("result"))
            if safe is not None:
                self.state.resend_safe = safe
