"""A lean SSE load client for benchmarks: raw asyncio sockets, counting events as they come.

It speaks just enough HTTP/1.1 to initialize an MCP session and read a chunked SSE
response, and counts events by their blank-line terminator; it does no parsing beyond
that, so that on one core it can read faster than the server under test can write.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field


@dataclass
class LoadResult:
    clients: int
    events: int = 0
    failed: int = 0
    started: float = field(default_factory=time.perf_counter)
    finished: float = 0.0
    peak_open: int = 0

    @property
    def seconds(self) -> float:
        return self.finished - self.started

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


def _request(method: str, host: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"host: {host}:{port}", f"content-length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *rest = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in rest:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return int(status_line.split()[1]), headers


async def _drain_body(reader: asyncio.StreamReader, headers: dict[str, str], count: list[int]) -> None:
    """Read the body to its end, counting SSE events (blank-line terminators)."""
    if "content-length" in headers:
        data = await reader.readexactly(int(headers["content-length"]))
        count[0] += data.count(b"\n\n")
        return
    tail = b""
    while True:
        data = await reader.read(65536)
        if not data:
            return
        count[0] += (tail[-1:] + data).count(b"\n\n")
        tail = (tail + data)[-8:]
        if tail.endswith(b"0\r\n\r\n"):
            return


async def one_client(
    host: str,
    port: int,
    path: str,
    tool_args: dict[str, object],
    result: LoadResult,
    open_now: list[int],
    setup: asyncio.Semaphore,
) -> None:
    post = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    try:
        await setup.acquire()  # connect and initialize in waves: the accept backlog never overflows
        try:
            reader, writer = await asyncio.open_connection(host, port)
            init = json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": {"protocolVersion": "2025-11-25", "capabilities": {}},
                }
            ).encode()
            writer.write(_request("POST", host, port, path, init, post))
            status, headers = await _read_head(reader)
            await _drain_body(reader, headers, [0])
        finally:
            setup.release()
        sid = headers.get("mcp-session-id", "")
        call = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "ticker", "arguments": tool_args, "_meta": {"progressToken": 2}},
            }
        ).encode()
        h = {**post, "mcp-session-id": sid, "mcp-protocol-version": "2025-11-25"}
        writer.write(_request("POST", host, port, path, call, h))
        status, headers = await _read_head(reader)
        if status != 200:
            result.failed += 1
            return
        open_now[0] += 1
        result.peak_open = max(result.peak_open, open_now[0])
        count = [0]
        try:
            await _drain_body(reader, headers, count)
        finally:
            open_now[0] -= 1
        result.events += count[0]
        writer.close()
    except (OSError, asyncio.IncompleteReadError, ValueError):
        result.failed += 1


async def run_load(host: str, port: int, path: str, clients: int, tool_args: dict[str, object]) -> LoadResult:
    result = LoadResult(clients)
    open_now = [0]
    setup = asyncio.Semaphore(128)
    result.started = time.perf_counter()
    await asyncio.gather(
        *(one_client(host, port, path, tool_args, result, open_now, setup) for _ in range(clients))
    )
    result.finished = time.perf_counter()
    return result
