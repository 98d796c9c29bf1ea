"""The adapter for the official MCP Python SDK (`mcp`): `python -m lab.sut.python_sdk`.

Each client is the SDK's own stack, unchanged: `streamable_http_client` (its Streamable
HTTP transport, with its resumption and reconnect logic) under a `ClientSession`, opened
with the initialize handshake of a session-era revision (2025-11-25 unless the start
command names 2025-06-18 or 2025-03-26), so sessions and resumption exist. mcp 2.x's
`Client` defaults to the 2026-07-28 revision, which has neither; `Client(mode="legacy")`
is the SDK's switch to the handshake, and this adapter uses the same handshake through
`ClientSession` because it also needs to see the SDK's streams. Asked for 2026-07-28 (a
run of the modern era, docs/eras.md), it connects as `Client`'s default `mode="auto"`
does, with the SDK's own `negotiate_auto`: `server/discover` first, and `initialize` only
if the server does not speak the modern era.

What the adapter adds sits at the SDK's public seams and changes no behaviour:
- an httpx2 client of its own (the SDK's documented default timeouts, the start
  command's headers, one shared TLS context for all clients) whose event hooks see each
  request's session ID and every GET that resumes (`Last-Event-ID`) or re-opens a stream,
  and number each request's `x-lab-conn` header when the start headers carry one;
- a tap on the read stream between the transport and the session: every message the
  transport hands up is logged as `deliver`, and every exception it hands up as `notice`;
- a tap on the write stream that joins a tools/call's JSON-RPC id to the call's
  idempotency key;
- a logging handler that turns the SDK's warnings and its reconnect log lines into
  `notice` lines of the client that wrote them.

All clients share one event loop (anyio on asyncio, uvloop when installed). Never import
this module in a gevent-patched (Locust) process: it runs as its own process.
"""

from __future__ import annotations

import logging
import ssl
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import version
from types import TracebackType
from typing import Any, Final, Self, cast

import httpx2
from mcp import ClientSession
from mcp import types as mcp_types
from mcp.client._probe import negotiate_auto
from mcp.client._transport import ReadStream, WriteStream
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCMessage, JSONRPCRequest, RequestParamsMeta
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION

from lab.sut.applog import ClientContext, current_client
from lab.sut.protocol import Call, Start
from lab.sut.runtime import CallFailed, serve
from lab.wire.extensions import IDEMPOTENCY_META, LAB_CONN_HEADER
from lab.wire.revisions import MODERN_REVISIONS, SUPPORTED_REVISIONS

ADAPTER: Final = "python-sdk"
SESSION_ERA: Final = SUPPORTED_REVISIONS
"""The handshake era's revisions this adapter accepts in `start.protocolVersion`."""
MODERN_ERA: Final = MODERN_REVISIONS
"""The modern era's: the SDK connects as `Client(mode="auto")` does (`negotiate_auto`:
`server/discover` first, `initialize` only if the server does not speak the modern era)."""

TIMEOUT: Final = httpx2.Timeout(30.0, read=300.0)
"""The SDK's own default (`create_mcp_http_client`): 30 s, and 300 s to read a stream."""


def _dump(message: JSONRPCMessage) -> dict[str, Any]:
    # exclude_unset: exactly the members the server sent, so the digest matches its event's
    out: dict[str, Any] = message.model_dump(by_alias=True, mode="json", exclude_unset=True)
    return out


class _ReadTap:
    """The transport's read stream as the session sees it, logging what passes."""

    def __init__(self, inner: ReadStream[SessionMessage | Exception], ctx: ClientContext) -> None:
        self._inner = inner
        self._ctx = ctx

    @property
    def last_context(self) -> Any:  # the SDK's dispatcher reads the sender's context here
        return getattr(self._inner, "last_context", None)

    def _seen(self, item: SessionMessage | Exception) -> SessionMessage | Exception:
        if isinstance(item, SessionMessage):
            self._ctx.deliver(_dump(item.message))
        else:
            self._ctx.notice(f"transport: {type(item).__name__}: {item}")
        return item

    async def receive(self) -> SessionMessage | Exception:
        return self._seen(await self._inner.receive())

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        return self._seen(await self._inner.__anext__())

    async def __aenter__(self) -> Self:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        return await self._inner.__aexit__(et, ev, tb)


class _WriteTap:
    """The session's write stream: joins each tools/call's JSON-RPC id to its call."""

    def __init__(self, inner: WriteStream[SessionMessage], ctx: ClientContext) -> None:
        self._inner = inner
        self._ctx = ctx

    async def send(self, item: SessionMessage, /) -> None:
        msg = item.message
        if isinstance(msg, JSONRPCRequest) and msg.method == "tools/call":
            meta = (msg.params or {}).get("_meta") or {}
            key = meta.get(IDEMPOTENCY_META) if isinstance(meta, dict) else None
            self._ctx.request_sent(msg.id, key if isinstance(key, str) else None)
        await self._inner.send(item)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Self:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        return await self._inner.__aexit__(et, ev, tb)


class _HttpWatch:
    """httpx2 event hooks: the session ID in use, and the requests that get a stream back."""

    def __init__(self, ctx: ClientContext) -> None:
        self._ctx = ctx
        self._gets = 0
        self._had_session = False
        self._requests = 0

    async def on_request(self, request: httpx2.Request) -> None:
        conn = request.headers.get(LAB_CONN_HEADER)
        if conn is not None:  # number each request, as the lab's own clients do (docs/clients.md)
            self._requests += 1
            request.headers[LAB_CONN_HEADER] = f"{conn.rpartition(':')[0] or conn}:{self._requests}"
        sid = request.headers.get("mcp-session-id")
        if sid is not None:
            self._ctx.set_session_id(sid)
            self._had_session = True
        if request.method == "GET":
            if "last-event-id" in request.headers:
                self._ctx.reconnect("resume")
            elif self._gets:
                self._ctx.reconnect("reopen")
            self._gets += 1
        elif request.method == "POST" and sid is None and self._had_session:
            self._ctx.reconnect("reinitialize")
            self._gets = 0

    async def on_response(self, response: httpx2.Response) -> None:
        sid = response.headers.get("mcp-session-id")
        if sid is not None:
            self._ctx.set_session_id(sid)


class _SdkLog(logging.Handler):
    """The SDK's warnings, and its lines about reconnecting, as `notice` lines of their client."""

    def emit(self, record: logging.LogRecord) -> None:
        ctx = current_client.get()
        if ctx is None:
            return
        text = record.getMessage()
        if record.levelno >= logging.WARNING or "reconnect" in text.lower():
            ctx.notice(f"{record.levelname} {record.name}: {text}")


async def _ignore_progress(progress: float, total: float | None, message: str | None) -> None:
    """Asking for progress makes the SDK send a progressToken; the tap logs each one."""


class _Connected:
    def __init__(self, session: ClientSession, protocol_version: str) -> None:
        self._session = session
        self._protocol_version = protocol_version

    @property
    def protocol_version(self) -> str | None:
        return self._protocol_version

    async def call(self, call: Call) -> None:
        try:
            await self._session.call_tool(
                call.tool,
                call.arguments,
                progress_callback=_ignore_progress,
                # RequestParamsMeta is an open TypedDict (PEP 728) that mypy cannot yet see as one
                meta=cast(RequestParamsMeta, {IDEMPOTENCY_META: call.idempotency_key}),
            )
        except MCPError as e:
            raise CallFailed(e.code, e.message) from None


async def _initialize(session: ClientSession, protocol_version: str | None) -> str:
    """The SDK's initialize handshake; a revision other than its newest is asked for the way
    `ClientSession.initialize` asks for that one (same request, `adopt`, initialized)."""
    if protocol_version in (None, LATEST_HANDSHAKE_VERSION):
        return (await session.initialize()).protocol_version
    result = await session.send_request(
        mcp_types.InitializeRequest(
            params=mcp_types.InitializeRequestParams(
                protocol_version=protocol_version,
                capabilities=mcp_types.ClientCapabilities(),
                client_info=mcp_types.Implementation(name="mcp-lab", version="0"),
            )
        ),
        mcp_types.InitializeResult,
    )
    if result.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS:
        raise RuntimeError(f"the server answered protocol version {result.protocol_version!r}")
    session.adopt(result)
    await session.send_notification(mcp_types.InitializedNotification())
    return result.protocol_version


async def _auto(session: ClientSession) -> str:
    """The SDK's `mode="auto"` connect, as `Client` runs it: the revision it settled on."""
    await negotiate_auto(session)
    if session.protocol_version is None:
        raise RuntimeError("the SDK's auto connect settled on no protocol revision")
    return session.protocol_version


class PythonSdkDriver:
    adapter = ADAPTER

    def __init__(self) -> None:
        self.implementation = ("mcp", version("mcp"))
        # One TLS context for every client: building one per httpx client costs ~ms and
        # hundreds of KB each, which would cap how many clients one process holds.
        self._tls = ssl.create_default_context()
        sdk_log = logging.getLogger("mcp")
        sdk_log.setLevel(logging.INFO)
        sdk_log.propagate = False
        sdk_log.addHandler(_SdkLog())

    @asynccontextmanager
    async def open(self, start: Start, ctx: ClientContext) -> AsyncIterator[_Connected]:
        if start.options:
            raise ValueError(f"the python-sdk adapter takes no options; got {sorted(start.options)}")
        if start.protocol_version not in (None, *SESSION_ERA, *MODERN_ERA):
            raise ValueError(
                f"protocolVersion must be one of {', '.join((*SESSION_ERA, *MODERN_ERA))}; "
                f"got {start.protocol_version!r}"
            )
        watch = _HttpWatch(ctx)
        http = httpx2.AsyncClient(
            headers=start.headers,
            timeout=TIMEOUT,
            verify=self._tls,
            event_hooks={"request": [watch.on_request], "response": [watch.on_response]},
        )
        async with (
            http,
            streamable_http_client(start.url, http_client=http) as (read, write),
            ClientSession(_ReadTap(read, ctx), _WriteTap(write, ctx)) as session,
        ):
            if start.protocol_version in MODERN_ERA:
                negotiated = await _auto(session)
            else:
                negotiated = await _initialize(session, start.protocol_version)
            yield _Connected(session, negotiated)


def main(argv: list[str] | None = None) -> int:
    return serve(PythonSdkDriver, argv, prog="python -m lab.sut.python_sdk")


if __name__ == "__main__":
    sys.exit(main())
