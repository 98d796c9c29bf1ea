"""A scripted MCP target that answers with garbage a real server might send: event IDs that
are not valid UTF-8 (and not ASCII), a NUL in an ID, invalid UTF-8 inside a message's
text and in a response header, a cut in the middle of a call's stream. For the tests
that the lab's client and proxy take it without crashing or leaking a secret.

    python -m tests.helpers.garbage_target   # prints "garbage target listening on http://127.0.0.1:PORT/mcp"

Raw HTTP/1.1 on asyncio (one request per connection, `Connection: close`), so that it can
send bytes no HTTP library would. Its session IDs start with `sess-RAW-`, for a test to
look for them. It stops by itself after `LIFETIME_S`.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
from typing import Any

LIFETIME_S = 300.0
PROTOCOL = "2025-11-25"

BAD_ID = b"\xff\xfe\xe2\x9c\x93-"
"""The start of every event ID: two bytes that are not UTF-8, then a check mark (non-ASCII)."""


def _head(status: str, headers: list[tuple[bytes, bytes]]) -> bytes:
    lines = [f"HTTP/1.1 {status}".encode()] + [k + b": " + v for k, v in headers]
    return b"\r\n".join([*lines, b"Connection: close", b"", b""])


def _sse_event(event_id: bytes, data: bytes) -> bytes:
    return b"id: " + event_id + b"\ndata: " + data + b"\n\n"


class Target:
    def __init__(self) -> None:
        self.sessions: set[str] = set()
        self.pending: dict[str, Any] = {}
        """Session -> the JSON-RPC id of the call whose stream was cut (answered on resume)."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            lines = head.split(b"\r\n")
            method = lines[0].split(b" ")[0].decode("latin-1")
            headers = {}
            for line in lines[1:]:
                if b":" in line:
                    k, _, v = line.partition(b":")
                    headers[k.strip().lower().decode("latin-1")] = v.strip()
            body = b""
            if "content-length" in headers:
                body = await reader.readexactly(int(headers["content-length"]))
            writer.write(await self.answer(method, headers, body))
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    async def answer(self, method: str, headers: dict[str, bytes], body: bytes) -> bytes:
        session = headers.get("mcp-session-id", b"").decode("latin-1")
        if method == "DELETE":
            self.sessions.discard(session)
            return _head("200 OK", [(b"Content-Length", b"0")])
        if method == "GET":
            # (A standalone GET, without Last-Event-ID, must not take the cut call's answer.)
            call_id = self.pending.pop(session, None) if "last-event-id" in headers else None
            if call_id is None:
                return _head("405 Method Not Allowed", [(b"Content-Length", b"0")])
            result = json.dumps({"jsonrpc": "2.0", "id": call_id, "result": {"content": []}}).encode()
            return _head("200 OK", [(b"Content-Type", b"text/event-stream")]) + _sse_event(
                BAD_ID + b"3", result
            )
        try:
            msg = json.loads(body)
        except ValueError:
            return _head("400 Bad Request", [(b"Content-Length", b"0")])
        if not isinstance(msg, dict):
            return _head("400 Bad Request", [(b"Content-Length", b"0")])
        if msg.get("method") == "initialize":
            sid = "sess-RAW-" + secrets.token_hex(8)
            self.sessions.add(sid)
            answer: dict[str, Any] = {
                "jsonrpc": "2.0",
                "id": msg.get("id"),
                "result": {
                    "protocolVersion": PROTOCOL,
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "garbage", "version": "0"},
                },
            }
            payload = json.dumps(answer).encode()
            return (
                _head(
                    "200 OK",
                    [
                        (b"Content-Type", b"application/json"),
                        (b"Mcp-Session-Id", sid.encode()),
                        (b"X-Garbage", b"\xff\xfe\x00"[:2] + b"\xc3("),  # not UTF-8
                        (b"Content-Length", str(len(payload)).encode()),
                    ],
                )
                + payload
            )
        if "id" not in msg:  # a notification
            return _head("202 Accepted", [(b"Content-Length", b"0")])
        if session not in self.sessions:
            return _head("404 Not Found", [(b"Content-Length", b"0")])
        if msg.get("method") != "tools/call":  # tools/list, ping: a plain JSON answer
            tools = [
                {"name": n, "inputSchema": {"type": "object"}}
                for n in ("echo", "clock", "ticker", "ledger.append")
            ]
            res = {"tools": tools} if msg.get("method") == "tools/list" else {}
            payload = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": res}).encode()
            return (
                _head(
                    "200 OK",
                    [(b"Content-Type", b"application/json"), (b"Content-Length", str(len(payload)).encode())],
                )
                + payload
            )
        # A call: a priming event with a NUL in its ID (an ID the SSE rules ignore), a
        # progress notification whose text is not UTF-8, then the stream is cut before the
        # response: the client resumes with the (non-ASCII) ID of the last event.
        self.pending[session] = msg["id"]
        token = (msg.get("params") or {}).get("_meta", {}).get("progressToken")
        note: dict[str, Any] = {"jsonrpc": "2.0", "method": "notifications/progress"}
        note["params"] = {"progressToken": token, "progress": 1, "message": "\x00"}
        data = json.dumps(note).encode().replace(b"\\u0000", b"\xff\xfe")
        return (
            _head("200 OK", [(b"Content-Type", b"text/event-stream")])
            + _sse_event(BAD_ID + b"0\x00", b"")
            + (_sse_event(BAD_ID + b"1", data) if token is not None else b"")
            + _sse_event(BAD_ID + b"2", b"")
        )


async def main() -> None:
    target = Target()
    server = await asyncio.start_server(target.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(f"garbage target listening on http://127.0.0.1:{port}/mcp", flush=True)
    async with server:
        await asyncio.sleep(LIFETIME_S)


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
