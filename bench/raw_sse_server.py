"""The physical baseline: a minimal SSE server on the same stack (uvicorn, uvloop, httptools).

It answers `initialize` with a session header and `tools/call` with `count` events of the
same size as the reference server's (ID, progress payload), then a final event, with no
state, no checks and no ledger. Run: python bench/raw_sse_server.py (prints its URL).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

type Scope = MutableMapping[str, Any]
type Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
type Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

_ID = "e1.AAAAAAAAAAA.0.pAAAAAAAAAAAA.{n}.000000000000.AAAAAAAAAAAAAAAA"


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    req = json.loads(body or b"{}")
    if req.get("method") == "initialize":
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"mcp-session-id", b"raw")],
            }
        )
        await send({"type": "http.response.body", "body": b'{"jsonrpc":"2.0","id":1,"result":{}}'})
        return
    args = req.get("params", {}).get("arguments", {})
    count, interval = int(args.get("count", 10)), int(args.get("interval_ms", 0)) / 1000
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
    )
    for i in range(count + 1):
        data = json.dumps(
            {
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {"progressToken": 2, "progress": i, "total": count, "t": round(time.time(), 6)},
            },
            separators=(",", ":"),
        )
        await send(
            {
                "type": "http.response.body",
                "body": f"id: {_ID.format(n=i)}\ndata: {data}\n\n".encode(),
                "more_body": True,
            }
        )
        if interval:
            await asyncio.sleep(interval)
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def main() -> None:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            print(f"raw-sse listening on {url}", flush=True)  # only once it accepts

    config = uvicorn.Config(
        app, loop="uvloop", http="httptools", log_level="warning", access_log=False, backlog=4096
    )
    Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
