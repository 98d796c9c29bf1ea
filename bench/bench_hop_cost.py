"""CPU per request of each hop of the chain: the reference server, mitmdump with the fault
addon, and the TCP nemesis, on new and on kept-alive connections.

    .venv/bin/python bench/bench_hop_cost.py [--requests 2000] [--concurrency 20] [--rounds 2]
                                             [--all-addons] [--idle-streams N] [--idle-seconds S]
                                             [--keepalive SECONDS]

Starts `lab serve`, mitmdump with addons/mcp_faults.py (empty plan, tap on) in front of
it, and `lab nemesis` with one proxy in front of mitmdump. Then, for each entry point
(the server, mitmdump, the nemesis) and each connection kind, sends `--requests`
`initialize` POSTs, `--concurrency` at a time, from this process (raw asyncio sockets:
this process is not one of the measured ones), and prints the requests/s, the p50/p99
latency, and each process's CPU time per request (utime + stime from /proc, in ms). What a
hop costs is the CPU of its process when the requests pass through it: a request sent to
the nemesis costs the nemesis, mitmdump and the server.

`--all-addons` passes mitmdump an option the lab does not set (`anticache=true`, its
default value), which makes the addon keep mitmdump's default addons: the cost before
`mcp_faults_io.drop_inert_addons`, side by side with it when run twice.

`--idle-streams N` then opens N sessions, each with its standalone GET stream, through
the nemesis, holds them `--idle-seconds`, and prints each process's CPU per 1,000 idle
streams and per SSE keep-alive comment the server sent (`--keepalive`, the server's
seconds of silence before one; 0 sends none): what a mostly idle client costs the chain
when it does nothing at all. Prints figures only; these are what a capacity plan divides
the box's cores by (docs/architecture.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from lab.faults.launch import mitmdump_argv

BIN = Path(sys.executable).parent
BODY = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "b", "version": "1"},
        },
    }
).encode()


def start(argv: list[str], ready: str, env: dict[str, str], log: Path) -> tuple[subprocess.Popen[str], str]:
    """Start a part; returns it and the last word of its ready line (its address)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if ready in line:
            # Keep draining its output into a file, so that a chatty part never blocks on a full pipe.
            threading.Thread(
                target=shutil.copyfileobj, args=(proc.stdout, log.open("w")), daemon=True
            ).start()
            return proc, line.strip().split()[-1]
    proc.kill()
    raise SystemExit(f"{argv[0]} did not get ready: {''.join(lines)[-2000:]}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def http_head(port: int, first_line: str, *headers: str) -> bytes:
    lines = [first_line, f"host: 127.0.0.1:{port}", "origin: http://127.0.0.1:3000", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def request(port: int, keep_alive: bool) -> bytes:
    close = () if keep_alive else ("connection: close",)
    return (
        http_head(
            port,
            "POST /mcp HTTP/1.1",
            "content-type: application/json",
            "accept: application/json, text/event-stream",
            f"content-length: {len(BODY)}",
            *close,
        )
        + BODY
    )


async def one_client(port: int, count: int, keep_alive: bool, latencies: list[float]) -> None:
    reader = writer = None
    for _ in range(count):
        t0 = time.perf_counter()
        if writer is None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert reader is not None
        writer.write(request(port, keep_alive))
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        length = [h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")]
        if length:
            await reader.readexactly(int(length[0].split(b":")[1]))
        else:  # an SSE answer: its one event ends with a blank line
            await reader.readuntil(b"\n\n")
        latencies.append(time.perf_counter() - t0)
        if not keep_alive:
            writer.close()
            writer = None
    if writer is not None:
        writer.close()


def get_stream(port: int, session: str) -> bytes:
    return http_head(
        port,
        "GET /mcp HTTP/1.1",
        "accept: text/event-stream",
        f"mcp-session-id: {session}",
        "mcp-protocol-version: 2025-06-18",
    )


async def idle_stream(port: int, opened: list[int], comments: list[int], stop: asyncio.Event) -> None:
    """One session and its standalone GET stream, held open until `stop`; counts the
    keep-alive comments that arrive (an SSE comment line starts with ':')."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request(port, keep_alive=False))
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    session = next(
        h.split(":", 1)[1].strip() for h in head.split("\r\n") if h.lower().startswith("mcp-session-id:")
    )
    writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(get_stream(port, session))
    await reader.readuntil(b"\r\n\r\n")
    opened[0] += 1
    read = asyncio.ensure_future(reader.read(65536))
    halt = asyncio.ensure_future(stop.wait())
    while True:
        done, _ = await asyncio.wait({read, halt}, return_when=asyncio.FIRST_COMPLETED)
        if halt in done:
            read.cancel()
            break
        chunk = read.result()
        if not chunk:
            halt.cancel()
            break
        comments[0] += chunk.count(b"\n:")
        read = asyncio.ensure_future(reader.read(65536))
    writer.close()


async def hold_idle(port: int, n: int, seconds: float, pids: dict[str, int]) -> None:
    opened, comments, stop = [0], [0], asyncio.Event()
    tasks = []
    for i in range(n):  # 100 at a time: the handshakes are not what is measured
        tasks.append(asyncio.ensure_future(idle_stream(port, opened, comments, stop)))
        if i % 100 == 99:
            await asyncio.sleep(0.2)
    while opened[0] < n and not any(t.done() for t in tasks):
        await asyncio.sleep(0.2)
    await asyncio.sleep(2)  # the last handshakes' work settles
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    c0, t0 = comments[0], time.perf_counter()
    await asyncio.sleep(seconds)
    wall, sent = time.perf_counter() - t0, comments[0] - c0
    cost = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    print(
        f"{opened[0]} idle streams held {wall:.0f} s through the nemesis; {sent} keep-alive comments ({sent / wall:.0f}/s)"
    )
    print(f"{'process':9} {'cores':>6} {'cores per 1,000 streams':>24} {'ms per comment':>15}")
    for name, cpu in cost.items():
        per_comment = f"{cpu / sent * 1e3:15.3f}" if sent else f"{'-':>15}"
        print(f"{name:9} {cpu / wall:6.3f} {cpu / wall / opened[0] * 1000:24.3f} {per_comment}")


async def drive(port: int, total: int, concurrency: int, keep_alive: bool) -> list[float]:
    latencies: list[float] = []
    per = max(1, total // concurrency)
    await asyncio.gather(*(one_client(port, per, keep_alive, latencies) for _ in range(concurrency)))
    return latencies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--all-addons", action="store_true")
    ap.add_argument("--idle-streams", type=int, default=0, help="then hold this many idle streams (0: skip)")
    ap.add_argument("--idle-seconds", type=float, default=30.0)
    ap.add_argument("--keepalive", type=float, default=10.0, help="the server's keep-alive (s; 0: none)")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-hop-cost-"))
    env = {**os.environ, "LAB_LEDGER_KEY": "ab" * 32}
    (tmp / "plan.json").write_text('{"schema": "mcpLabFaultPlan.v1", "seed": 1, "rules": []}')
    parts: dict[str, subprocess.Popen[str]] = {}
    try:
        parts["server"], url = start(
            [
                str(BIN / "lab"),
                "serve",
                "--port",
                "0",
                "--ledger",
                str(tmp / "ledger.sqlite"),
                "--max-streams",
                "100000",
                "--keepalive",
                str(a.keepalive),
            ],
            "listening on",
            env,
            tmp / "server.log",
        )
        upstream = url.rsplit("/", 1)[0]
        argv = mitmdump_argv(
            upstream,
            options={"mcpfaults_plan": str(tmp / "plan.json"), "mcpfaults_tap": str(tmp / "tap.jsonl")},
        )
        if a.all_addons:
            argv += ["--set", "anticache=true"]
        parts["mitmdump"], proxy = start(argv, "listening on", env, tmp / "mitmdump.log")
        parts["nemesis"], api = start(
            [str(BIN / "lab"), "nemesis", "--api-port", "0", "--log", str(tmp / "nemesis.jsonl")],
            "lab-nemesis api",
            env,
            tmp / "nemesis.log",
        )
        proxy_port = int(proxy.rsplit(":", 1)[1])
        body = json.dumps(
            {"name": "bench", "listen": "127.0.0.1:0", "upstream": f"127.0.0.1:{proxy_port}"}
        ).encode()
        with urllib.request.urlopen(urllib.request.Request(f"{api}/proxies", data=body, method="POST")) as r:
            nemesis_port = int(json.load(r)["listen"].rsplit(":", 1)[1])
        entries = {"server": int(upstream.rsplit(":", 1)[1]), "mitmdump": proxy_port, "nemesis": nemesis_port}
        addons = "every default addon kept" if a.all_addons else "inert addons dropped"
        print(
            f"{a.requests} initialize requests, {a.concurrency} at a time, {a.rounds} round(s); mitmdump: {addons}"
        )
        print(f"{'entry':9} {'connection':10} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7}   CPU ms per request")
        for entry, port in entries.items():
            for keep_alive in (False, True):
                rows = []
                for _ in range(a.rounds):
                    before = {name: cpu_seconds(p.pid) for name, p in parts.items()}
                    t0 = time.perf_counter()
                    lat = sorted(asyncio.run(drive(port, a.requests, a.concurrency, keep_alive)))
                    wall = time.perf_counter() - t0
                    cost = {
                        name: (cpu_seconds(p.pid) - before[name]) / len(lat) * 1e3
                        for name, p in parts.items()
                    }
                    rows.append((len(lat) / wall, lat[len(lat) // 2], lat[int(len(lat) * 0.99)], cost))
                med = statistics.median
                costs = "  ".join(f"{name} {med(r[3][name] for r in rows):5.2f}" for name in parts)
                print(
                    f"{entry:9} {'kept' if keep_alive else 'new':10} {med(r[0] for r in rows):7.0f} "
                    f"{med(r[1] for r in rows) * 1e3:7.1f} {med(r[2] for r in rows) * 1e3:7.1f}   {costs}",
                    flush=True,
                )
        if a.idle_streams:
            asyncio.run(
                hold_idle(nemesis_port, a.idle_streams, a.idle_seconds, {n: p.pid for n, p in parts.items()})
            )
    finally:
        for p in parts.values():
            p.terminate()
        for p in parts.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
