"""CPU per small chunk through the embedded nemesis (no toxics), the way SSE events cross it:
many connections, each a few hundred bytes every few milliseconds.

    .venv/bin/python bench/bench_nemesis_events.py [--real /path/to/toxiproxy-server]
        [--connections 200] [--chunks 300] [--interval-ms 10] [--size 300] [--rounds 3]

An upstream in this process (asyncio) accepts `--connections` connections through a proxy
with no toxics and writes `--chunks` chunks of `--size` bytes on each, `--interval-ms`
apart; the readers (the same loop) count the bytes that arrive. Each round measures the
embedded nemesis (`lab nemesis`) and, with `--real`, a toxiproxy-server, one after the
other; prints the proxy's CPU (utime + stime from /proc) per chunk in µs, and the medians.
Bulk throughput is `bench/bench_nemesis.py`'s. Everything is on 127.0.0.1 and bounded by
the chunk count and a deadline. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_nemesis import _cpu_s, embedded, real

from lab.nemesis.client import ToxiproxyClient

_DEADLINE_S = 120.0


async def _one_round(port: int, upstream_port_box: list[int], args: argparse.Namespace) -> int:
    """Open the connections, let the upstream write, return the bytes read."""
    got = 0

    async def read(reader: asyncio.StreamReader) -> None:
        nonlocal got
        while data := await reader.read(65536):  # until EOF
            got += len(data)

    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(args.connections)]
    readers = [asyncio.create_task(read(r)) for r, _ in conns]
    await asyncio.wait_for(asyncio.gather(*readers), _DEADLINE_S)
    for _, w in conns:
        w.close()
    return got


async def _serve(args: argparse.Namespace, box: list[int], ready: asyncio.Event) -> asyncio.Server:
    payload = b"x" * (args.size - 1) + b"\n"

    async def handle(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _i in range(args.chunks):  # bounded by --chunks
            writer.write(payload)
            await writer.drain()
            await asyncio.sleep(args.interval_ms / 1000)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    box.append(int(server.sockets[0].getsockname()[1]))
    ready.set()
    return server


async def measure(api: str, pid: int, args: argparse.Namespace) -> float:
    box: list[int] = []
    ready = asyncio.Event()
    server = await _serve(args, box, ready)
    client = ToxiproxyClient(api, timeout=10)
    if client.get_proxy("bench-events") is not None:
        client.delete_proxy("bench-events")
    info = client.create_proxy("bench-events", f"127.0.0.1:{box[0]}", "127.0.0.1:0")
    port = int(info.listen.rsplit(":", 1)[1])
    try:
        before = _cpu_s(pid)
        got = await _one_round(port, box, args)
        cpu = _cpu_s(pid) - before
    finally:
        client.delete_proxy("bench-events")
        server.close()
    chunks = args.connections * args.chunks
    if got != chunks * args.size:
        print(f"  warning: {got} bytes arrived, {chunks * args.size} were sent", file=sys.stderr)
    return float(cpu / chunks * 1e6)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--real", type=Path, default=None)
    p.add_argument("--connections", type=int, default=200)
    p.add_argument("--chunks", type=int, default=300)
    p.add_argument("--interval-ms", type=float, default=10.0)
    p.add_argument("--size", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    if not (1 <= args.connections <= 2000 and 1 <= args.chunks <= 100_000 and 2 <= args.size <= 65536):
        p.error("--connections 1..2000, --chunks 1..100000, --size 2..65536")
    if args.real is not None and not os.access(args.real, os.X_OK):
        p.error(f"--real {args.real}: not an executable file")
    ours: list[float] = []
    theirs: list[float] = []
    print(
        f"{args.connections} connections x {args.chunks} chunks of {args.size} B, "
        f"{args.interval_ms:g} ms apart, no toxics, {args.rounds} round(s)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        with embedded(folder) as nemesis_server:
            real_cm = real(args.real, folder) if args.real is not None else None
            real_server = real_cm.__enter__() if real_cm is not None else None
            try:
                for round_ in range(1, args.rounds + 1):
                    ours.append(asyncio.run(measure(*nemesis_server, args)))
                    line = f"round {round_}: embedded {ours[-1]:6.1f} µs CPU per chunk"
                    if real_server is not None:
                        theirs.append(asyncio.run(measure(*real_server, args)))
                        line += f"   real {theirs[-1]:6.1f}"
                    print(line, flush=True)
            finally:
                if real_cm is not None:
                    real_cm.__exit__(None, None, None)
    print(f"median embedded {statistics.median(ours):.1f} µs per chunk")
    if theirs:
        print(f"median real     {statistics.median(theirs):.1f} µs per chunk")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
