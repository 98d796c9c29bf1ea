"""Writing one SSE response: what a connection's buffer gets, as it gets it, with a
keep-alive comment after a silence, until the connection ends or the client goes away."""

from __future__ import annotations

import asyncio

from lab.server.http import Receive, Send
from lab.server.model import LiveConn

KEEPALIVE = b":\n\n"
"""An SSE comment: receivers dispatch nothing, but the bytes keep idle timeouts away."""
SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
]


async def serve_live(receive: Receive, send: Send, live: LiveConn, keepalive: float) -> None:
    """Send `live`'s buffer until it ends (the response start is sent already); a
    disconnect ends it; `keepalive` seconds of silence send a comment (0: never)."""
    watcher = asyncio.ensure_future(_watch_disconnect(receive, live))
    try:
        await _pump(send, live, keepalive)
    finally:
        watcher.cancel()


async def _pump(send: Send, live: LiveConn, keepalive: float) -> None:
    loop = asyncio.get_running_loop()
    while True:
        if live.pending:
            await send({"type": "http.response.body", "body": live.take(), "more_body": True})
            continue
        if live.ended:
            break
        timer = loop.call_later(keepalive, live.wake.set) if keepalive > 0 else None
        await live.wake.wait()
        if timer is not None:
            timer.cancel()
        if not live.pending and not live.ended:  # the keep-alive timer rang
            live.wake.clear()
            await send({"type": "http.response.body", "body": KEEPALIVE, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _watch_disconnect(receive: Receive, live: LiveConn) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            live.end("client_gone")
            return
