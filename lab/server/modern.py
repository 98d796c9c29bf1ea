"""The reference server's modern era (2026-07-28), beside the handshake era on one endpoint,
as the official SDK servers serve both (docs/eras.md).

A request is of the modern era when its `MCP-Protocol-Version` header names a modern
revision the server serves (an unknown revision is answered 400 with the revisions it
serves, -32022, whatever the era: lab.server.app). Then, in this order (the first failing
answers):

    method not POST                              405 (Allow: POST)
    Content-Type not JSON 415, Accept lacks JSON+SSE 406, body too large 413
    bad JSON 400 (-32700), not Unicode 400 (-32600), a batch 400 (-32600)
    a notification                               202, and nothing else
    `_meta` without protocolVersion or clientCapabilities      400 (-32602)
    MCP-Protocol-Version not `_meta`'s, Mcp-Method not the method,
      Mcp-Name not the tool's name (tools/call)  400 (-32020, HeaderMismatch)
    a revision this server does not serve        400 (-32022, data: supported, requested)
    a method the era does not have (initialize, ping, logging/setLevel, ...)  404 (-32601)
    server/discover, tools/list                  200, JSON, `resultType: "complete"`, `ttlMs`, `cacheScope`
    tools/call of an unknown tool                400 (-32602)
    tools/call                                   200, an SSE stream of the call's messages

No session ID is minted or read (an `Mcp-Session-Id` is ignored, as is `Last-Event-ID`);
SSE events carry no ID and no `retry`, and there is no priming event. Closing the response
stream is the call's cancellation: the tool's task is cancelled and nothing more is sent
for it. A write (ledger.append) keeps its idempotency key across both eras: the receipts
are the server's, per token subject, whichever era asked.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from lab.server.defects import Defect
from lab.server.http import (
    Receive,
    Refused,
    Request,
    Send,
    read_json_post,
    send_empty,
    send_json,
)
from lab.server.model import LiveConn
from lab.server.sse_out import SSE_HEADERS, serve_live
from lab.server.tools import MODERN_PSEUDONYM, TOOL_LIST, TOOLS, ToolCall, ToolError
from lab.wire import jsonrpc
from lab.wire.errors import RemoteProtocolError
from lab.wire.revisions import (
    HEADER_MISMATCH,
    MCP_METHOD_HEADER,
    MCP_NAME_HEADER,
    META_CLIENT_CAPABILITIES,
    META_PROTOCOL_VERSION,
    META_SERVER_INFO,
    MODERN_REVISIONS,
    PROTOCOL_VERSION_HEADER,
    SESSION_HEADER,
    UNSUPPORTED_VERSION,
)
from lab.wire.sse import encode_event

if TYPE_CHECKING:
    from lab.server.app import McpApp

COMPLETE = {"resultType": "complete"}
CACHE = {"ttlMs": 0, "cacheScope": "private"}
"""A list's or discovery's caching directives, which 2026-07-28 requires on those results
(the official SDK client refuses a tools/list without them): immediately stale, never
shared."""
NOT_IN_ERA = ("initialize", "ping", "logging/setLevel")
"""Methods 2026-07-28 removed: answered as unknown methods."""


def _refused(
    status: int, reason: str, code: int, message: str, mid: jsonrpc.JsonRpcId | None, data: Any = None
) -> Refused:
    """A refusal with its JSON-RPC error code (and data), as 2026-07-28 names them."""
    return Refused(status, reason, message, code=code, mid=mid, data=data)


class ModernSite:
    """A tool call of the modern era: its messages go on its own response, without IDs.

    `elsewhere` (only with the defect `modern-sends-after-close`): once that response has
    ended, where its messages go instead (another open response of the subject)."""

    __slots__ = ("_subject", "elsewhere", "live")

    def __init__(
        self, live: LiveConn, subject: str | None, elsewhere: Callable[[], LiveConn | None] | None = None
    ) -> None:
        self.live = live
        self._subject = subject
        self.elsewhere = elsewhere

    def _out(self) -> LiveConn:
        if self.live.ended and self.elsewhere is not None:
            other = self.elsewhere()  # defect: a cancelled call's messages sent on another response
            if other is not None:
                return other
        return self.live

    @property
    def subject(self) -> str | None:
        return self._subject

    @property
    def pseudonym(self) -> str:
        return MODERN_PSEUDONYM

    def emit(self, data: str, kind: str) -> None:
        self._out().push(encode_event(data))  # (pushing to an ended response sends nothing)

    def progress_sent(self, data: str) -> None:
        self._out().push(encode_event(data))

    def log(self, level: str, logger: str, data: Any) -> None:
        note = jsonrpc.notification("notifications/message", {"level": level, "logger": logger, "data": data})
        self._out().push(encode_event(jsonrpc.dumps(note)))

    def poll(self, close_after: int, retry_ms: int) -> None:
        raise ToolError(
            jsonrpc.INVALID_PARAMS, "close_after needs resumption, which the 2026-07-28 revision removed"
        )


def _minted(app: McpApp) -> list[tuple[bytes, bytes]]:
    """No session header in this era; with the defect `modern-mints-session`, a fresh one."""
    if Defect.MODERN_MINTS_SESSION not in app.defects:
        return []
    return [(SESSION_HEADER.encode(), secrets.token_hex(16).encode())]  # defect: a session ID minted


def served(app: McpApp) -> tuple[str, ...]:
    """The modern revisions this server serves (none: it answers the handshake era only)."""
    return tuple(v for v in app.config.protocol_versions if v in MODERN_REVISIONS)


async def handle(app: McpApp, req: Request, receive: Receive, send: Send, subject: str | None) -> None:
    """Answer one modern-era request (module docstring); Refused for the refusals, which the app logs and answers."""
    if req.method != "POST":
        raise Refused(
            405, "method_not_allowed", "the 2026-07-28 revision has POST only", [(b"allow", b"POST")]
        )
    _, body = await read_json_post(req, receive, app.config.max_body)
    if isinstance(body, list):
        raise Refused(400, "batch_not_allowed", "JSON-RPC batches are not allowed in 2026-07-28")
    try:
        msg = jsonrpc.classify(body)
    except RemoteProtocolError as e:
        raise Refused(400, "invalid_message", str(e)) from None
    if msg.kind is jsonrpc.MessageKind.NOTIFICATION:
        app.log_request(req, 202, None)  # (a posted notifications/cancelled changes nothing here)
        await send_empty(send, 202)
        return
    if msg.kind is not jsonrpc.MessageKind.REQUEST or msg.id is None or msg.method is None:
        raise Refused(400, "invalid_message", "expected a request or a notification")
    _check(app, req, msg)
    if msg.method == "server/discover":
        await _answer(app, req, send, msg.id, _discover(app))
    elif msg.method == "tools/list":
        await _answer(app, req, send, msg.id, {"tools": TOOL_LIST, **COMPLETE, **CACHE})
    elif msg.method == "tools/call":
        await _call(app, req, receive, send, msg, subject)
    else:
        era = " (the 2026-07-28 revision removed it)" if msg.method in NOT_IN_ERA else ""
        raise _refused(
            404, "method_not_found", jsonrpc.METHOD_NOT_FOUND, f"method not found: {msg.method}{era}", msg.id
        )


def _check(app: McpApp, req: Request, msg: jsonrpc.Message) -> None:
    """`_meta`, then the headers against the body, then the revision (the spec's order)."""
    mid = msg.id
    meta = msg.params.get("_meta")
    version = meta.get(META_PROTOCOL_VERSION) if isinstance(meta, dict) else None
    if not isinstance(meta, dict) or not isinstance(version, str) or META_CLIENT_CAPABILITIES not in meta:
        raise _refused(
            400,
            "missing_meta",
            jsonrpc.INVALID_PARAMS,
            f"params._meta must carry {META_PROTOCOL_VERSION} and {META_CLIENT_CAPABILITIES}",
            mid,
        )
    header = req.header(PROTOCOL_VERSION_HEADER)
    if header != version:
        raise _refused(
            400,
            "header_mismatch",
            HEADER_MISMATCH,
            f"MCP-Protocol-Version {header!r} is not _meta's {version!r}",
            mid,
        )
    mirrored = Defect.MODERN_HEADERS_UNCHECKED not in app.defects  # defect: Mcp-Method/-Name not compared
    if mirrored and (method := req.header(MCP_METHOD_HEADER)) != msg.method:
        raise _refused(
            400,
            "header_mismatch",
            HEADER_MISMATCH,
            f"Mcp-Method {method!r} is not the method {msg.method!r}",
            mid,
        )
    if mirrored and msg.method == "tools/call":
        name, sent = msg.params.get("name"), req.header(MCP_NAME_HEADER)
        if sent is None or sent != name:
            raise _refused(
                400,
                "header_mismatch",
                HEADER_MISMATCH,
                f"Mcp-Name {sent!r} is not the tool's name {name!r}",
                mid,
            )
    if version not in served(app):
        raise _refused(
            400,
            "bad_version",
            UNSUPPORTED_VERSION,
            f"unsupported protocol version {version!r}",
            mid,
            {"supported": list(app.config.protocol_versions), "requested": version},
        )


def _discover(app: McpApp) -> jsonrpc.JsonObject:
    from lab.server.app import SERVER_INFO

    return {
        **COMPLETE,
        **CACHE,
        # Both eras: a client of either can tell what it may speak here.
        "supportedVersions": list(app.config.protocol_versions),
        "capabilities": app.capabilities(),
        "_meta": {META_SERVER_INFO: SERVER_INFO},
    }


async def _answer(
    app: McpApp, req: Request, send: Send, mid: jsonrpc.JsonRpcId, result: jsonrpc.JsonObject
) -> None:
    app.log_request(req, 200, None)
    await send_json(send, 200, jsonrpc.result(mid, result), _minted(app))


async def _call(
    app: McpApp, req: Request, receive: Receive, send: Send, msg: jsonrpc.Message, subject: str | None
) -> None:
    """A tool call on an SSE response of its own; its close cancels the call."""
    assert msg.id is not None
    params = msg.params
    name = params.get("name")
    tool = TOOLS.get(name) if isinstance(name, str) else None
    args, meta = params.get("arguments") or {}, params.get("_meta") or {}
    if tool is None or not isinstance(args, dict) or not isinstance(meta, dict):
        # Invalid params, 400 (2026-07-28 answers its errors of the request itself so).
        why = f"unknown tool {name!r}" if tool is None else "arguments and _meta must be objects"
        raise _refused(400, "invalid_params", jsonrpc.INVALID_PARAMS, why, msg.id)
    if app.open_sse >= app.config.max_streams:
        raise Refused(503, "overloaded", "too many concurrent streams", app.retry_after())
    live = LiveConn(req.conn, app.config.max_session_event_bytes)
    runs_on = Defect.MODERN_SENDS_AFTER_CLOSE in app.defects
    elsewhere = partial(_other_open, app.modern_open, subject, live) if runs_on else None
    site = ModernSite(live, subject, elsewhere)
    call = ToolCall(app.state, site, msg.id, args, meta)
    task = asyncio.ensure_future(_run(call, tool, site))
    app.log_request(req, 200, None)
    app.open_sse += 1
    if runs_on:  # (kept for the defect only: the pristine path pays nothing for it)
        app.modern_open.setdefault(subject, []).append(live)
    try:
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS + _minted(app)})
        await serve_live(receive, send, live, app.config.keepalive_s)
    except OSError:
        live.end("client_gone")
    finally:
        app.open_sse -= 1
        if runs_on:
            _forget(app.modern_open, subject, live)
        if not task.done() and not runs_on:
            # The stream closed before the answer: that is the call's cancellation. The
            # tool stops, and nothing more is sent for it (`live` has ended).
            task.cancel()


def _forget(open_by: dict[str | None, list[LiveConn]], subject: str | None, live: LiveConn) -> None:
    mine = open_by.get(subject, [])
    if live in mine:
        mine.remove(live)
    if not mine:
        open_by.pop(subject, None)


def _other_open(
    open_by: dict[str | None, list[LiveConn]], subject: str | None, mine: LiveConn
) -> LiveConn | None:
    """The subject's newest open response other than `mine` (the defect's misrouting)."""
    for other in reversed(open_by.get(subject, [])):
        if other is not mine and not other.ended:
            return other
    return None


async def _run(call: ToolCall, tool: Any, site: ModernSite) -> None:
    """Run the tool, send its answer (or its error) last, end the response. (`site` sends
    the answer: on its own response, or, with the defect `modern-sends-after-close` once
    that has ended, elsewhere.)"""
    try:
        result = await tool(call)
        data = jsonrpc.dumps(jsonrpc.result(call.request_id, {**result, **COMPLETE}))
    except ToolError as e:
        data = jsonrpc.dumps(jsonrpc.error(call.request_id, e.code, e.message))
    except asyncio.CancelledError:
        return
    site.emit(data, "response")
    site.live.end("completed")
