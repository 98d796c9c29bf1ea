"""The reference server's memory (RSS) under abuse, with and without its bounds, side by side.

    python bench/bench_server_resources.py [--conns 20] [--header-mib 8] [--seconds 6] [--workers 20]

1. Header flood: --conns connections each send an unfinished --header-mib MiB header and
   stay open. Against stock uvicorn + httptools, the same with `limit_concurrency` or a
   1 s `timeout_keep_alive`, stock
   uvicorn + h11 (its `h11_max_incomplete_event_size` defaults to 16 KiB), and `lab serve`
   (its protocol bounds the head: 431). Which of uvicorn's options bound memory, measured.
2. Session churn: --workers clients create sessions as fast as they can and never delete
   them, for --seconds; `lab serve` with its default bound vs --max-sessions effectively off.
3. Stream abandonment: --workers clients (one session each) open a standalone GET and walk
   away, then start a 2,000-event ticker and walk away, again and again; `lab serve` with
   its default per-session bounds vs those bounds effectively off.

Every server runs in a process of its own on 127.0.0.1, started and stopped by PID; RSS is
read from the server process (/proc). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAB = str(Path(sys.executable).with_name("lab"))
MIB = 1 << 20
UNBOUNDED = ["--max-sessions", "100000000", "--max-session-streams", "100000000"]
UNBOUNDED_BYTES = ["--max-session-event-bytes", str(1 << 40)]


# ---------------------------------------------------------------------- processes


def start(argv: list[str], prefix: str) -> tuple[subprocess.Popen[str], str, int]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    assert proc.stdout is not None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(prefix):
            url = line[len(prefix) :].strip()
            return proc, url, int(url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit(f"could not start {argv}")


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def rss_mib(pid: int) -> float:
    """Resident set size of `pid` (Linux /proc), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of `pid` (Linux /proc), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve_stock(kind: str) -> None:
    """A stock uvicorn with a trivial ASGI app (the comparison for part 1)."""
    import socket

    import uvicorn

    async def app(
        scope: dict[str, object], receive: object, send: Callable[[dict[str, object]], Awaitable[None]]
    ) -> None:
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    options: dict[str, object] = {"http": "h11" if kind == "h11" else "httptools"}
    if kind == "httptools-limit":
        options["limit_concurrency"] = 5
    if kind == "httptools-keepalive":
        options["timeout_keep_alive"] = 1

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            print(f"stock listening on http://127.0.0.1:{port}/", flush=True)

    Server(uvicorn.Config(app, loop="uvloop", log_level="error", **options)).run(sockets=[sock])  # type: ignore[arg-type]


# ---------------------------------------------------------------------- 1. header flood


async def flood_one(port: int, size: int, hold: asyncio.Event, settled: list[int]) -> str:
    """Send an endless header up to `size` bytes and keep the connection open until `hold`
    is set; how the server answered ("closed" if it cut without an answer we could read)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def send() -> None:
        writer.write(b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nx-big: ")
        chunk, sent = b"a" * 65536, 0
        while sent < size and not reader.at_eof():
            writer.write(chunk)
            await writer.drain()
            sent += len(chunk)

    try:
        await asyncio.wait_for(send(), timeout=120)
        answer = await asyncio.wait_for(reader.read(64), timeout=0.2)
        outcome = answer.split(b"\r\n", 1)[0].decode(errors="replace") or "closed"
    except TimeoutError:
        outcome = "held"  # nothing said: the server holds the connection (and what it read)
    except ConnectionError:
        outcome = "closed"
    settled[0] += 1
    await hold.wait()
    writer.close()
    return outcome


def settled_rss(pid: int, limit: float = 60.0) -> float:
    """RSS once the server has stopped working (CPU idle for a second), within `limit` s:
    bytes still in socket buffers are not in the server's memory yet."""
    deadline = time.monotonic() + limit
    last = cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = cpu_seconds(pid)
        if now - last < 0.02:
            break
        last = now
    return rss_mib(pid)


async def flood(port: int, conns: int, size: int, pid: int) -> tuple[float, list[str]]:
    hold, settled = asyncio.Event(), [0]
    tasks = [asyncio.ensure_future(flood_one(port, size, hold, settled)) for _ in range(conns)]
    deadline = time.monotonic() + 180
    while settled[0] < conns and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    rss = await asyncio.to_thread(settled_rss, pid)  # measured while the connections are open
    hold.set()
    return rss, list(await asyncio.gather(*tasks))


def part_header_flood(conns: int, header_mib: int) -> None:
    print(
        f"1. header flood: {conns} connections x an unfinished {header_mib} MiB header (RSS MiB of the server)"
    )
    size = header_mib * MIB
    variants: list[tuple[str, list[str], str]] = [
        (
            "uvicorn httptools",
            [sys.executable, __file__, "--serve-stock", "httptools"],
            "stock listening on ",
        ),
        (
            "uvicorn httptools limit_concurrency=5",
            [sys.executable, __file__, "--serve-stock", "httptools-limit"],
            "stock listening on ",
        ),
        (
            "uvicorn httptools timeout_keep_alive=1",
            [sys.executable, __file__, "--serve-stock", "httptools-keepalive"],
            "stock listening on ",
        ),
        (
            "uvicorn h11 (16 KiB incomplete-event max)",
            [sys.executable, __file__, "--serve-stock", "h11"],
            "stock listening on ",
        ),
        ("lab serve (bounded protocol)", [LAB, "serve", "--port", "0"], "lab-serve listening on "),
    ]
    for name, argv, prefix in variants:
        proc, _, port = start(argv, prefix)
        try:
            before = rss_mib(proc.pid)
            after, outcomes = asyncio.run(flood(port, conns, size, proc.pid))
            counts: dict[str, int] = {}
            for o in outcomes:
                counts[o] = counts.get(o, 0) + 1
            print(f"   {name:<42} {before:7.1f} -> {after:7.1f}  (+{after - before:6.1f})  answers: {counts}")
        finally:
            stop(proc)


# ---------------------------------------------------------------------- raw HTTP for parts 2, 3


def _post(port: int, body: dict[str, object], sid: str | None = None) -> bytes:
    data = json.dumps(body).encode()
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
        f"accept: application/json, text/event-stream\r\ncontent-length: {len(data)}\r\n"
    )
    if sid is not None:
        head += f"mcp-session-id: {sid}\r\nmcp-protocol-version: 2025-11-25\r\n"
    return (head + "\r\n").encode() + data


_INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "bench", "version": "1"},
    },
}


async def _answer(reader: asyncio.StreamReader) -> tuple[dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    headers = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return headers, body


async def churn_worker(port: int, until: float, created: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = _post(port, _INIT)
    while time.monotonic() < until:
        writer.write(request)
        headers, _ = await _answer(reader)
        if "mcp-session-id" in headers:
            created[0] += 1
    writer.close()


async def abandon_worker(port: int, until: float, started: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_post(port, _INIT))
    headers, _ = await _answer(reader)
    writer.close()
    sid = headers["mcp-session-id"]
    rid = 10
    while time.monotonic() < until:
        # A standalone GET: read its first bytes (the priming event), walk away.
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(
            f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\naccept: text/event-stream\r\n"
            f"mcp-session-id: {sid}\r\n\r\n".encode()
        )
        await r.read(256)
        w.close()
        # A 2,000-event ticker: read its first bytes, walk away; the tool goes on.
        rid += 1
        call = {
            "jsonrpc": "2.0",
            "id": rid,
            "method": "tools/call",
            "params": {
                "name": "ticker",
                "arguments": {"count": 2000, "interval_ms": 0},
                "_meta": {"progressToken": rid},
            },
        }
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(_post(port, call, sid))
        await r.read(256)
        w.close()
        started[0] += 1
        await asyncio.sleep(0.05)


async def drive(
    port: int,
    pid: int,
    workers: int,
    seconds: float,
    worker: Callable[[int, float, list[int]], Awaitable[None]],
) -> list[tuple[float, int, float]]:
    """Run `workers` copies of `worker` for `seconds`; (t, count, RSS MiB) once a second."""
    until = time.monotonic() + seconds
    count = [0]
    tasks = [asyncio.ensure_future(worker(port, until, count)) for _ in range(workers)]
    samples = []
    t0 = time.monotonic()
    while not all(t.done() for t in tasks):
        await asyncio.sleep(1.0)
        samples.append((time.monotonic() - t0, count[0], rss_mib(pid)))
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(1.0)
    samples.append((time.monotonic() - t0, count[0], rss_mib(pid)))
    return samples


def compare(
    title: str,
    unit: str,
    runs: list[tuple[str, list[str]]],
    workers: int,
    seconds: float,
    worker: Callable[[int, float, list[int]], Awaitable[None]],
) -> None:
    print(title)
    for name, extra in runs:
        proc, _, port = start(
            [LAB, "serve", "--port", "0", "--keepalive", "0", *extra], "lab-serve listening on "
        )
        try:
            before = rss_mib(proc.pid)
            samples = asyncio.run(drive(port, proc.pid, workers, seconds, worker))
            series = "  ".join(f"{c}:{r:.0f}" for _, c, r in samples)
            print(f"   {name:<36} start {before:6.1f} MiB; {unit}:RSS MiB each second -> {series}")
        finally:
            stop(proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conns", type=int, default=20)
    ap.add_argument("--header-mib", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--workers", type=int, default=20)
    ap.add_argument("--serve-stock", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve_stock:
        serve_stock(a.serve_stock)
        return
    part_header_flood(a.conns, a.header_mib)
    compare(
        f"2. session churn: {a.workers} clients create sessions for {a.seconds:g} s, never delete them",
        "sessions",
        [
            ("lab serve --max-sessions 2000", ["--max-sessions", "2000"]),
            ("lab serve, sessions unbounded", UNBOUNDED),
        ],
        a.workers,
        a.seconds,
        churn_worker,
    )
    compare(
        f"3. stream abandonment: {a.workers} sessions abandon a GET and a 2,000-event ticker, again and again",
        "tickers",
        [
            ("lab serve (default bounds)", []),
            ("lab serve, streams and bytes unbounded", UNBOUNDED + UNBOUNDED_BYTES),
        ],
        a.workers,
        a.seconds,
        abandon_worker,
    )


if __name__ == "__main__":
    main()
