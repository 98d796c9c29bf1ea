"""Which HTTP client the Locust driver uses, measured: httpx vs geventhttpclient under gevent.

    python bench/bench_client_io.py [--streams 100] [--events 500]

In one gevent-patched process (as in a Locust worker), against the raw SSE server:
1. throughput: `--streams` concurrent SSE responses of `--events` events each, read as
   fast as possible; events/s per client library;
2. latency of small events: one stream, one ~150-byte event every 100 ms, each carrying
   the server's send time; the delay until the client library hands over its bytes.
Prints figures side by side; asserts nothing.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from urllib.parse import urlsplit  # noqa: E402

import gevent  # noqa: E402
import httpx  # noqa: E402
from geventhttpclient import HTTPClient  # noqa: E402

from lab.wire.sse import SseDecoder  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def body(count: int, interval_ms: int) -> bytes:
    args = {"count": count, "interval_ms": interval_ms}
    return json.dumps(
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"arguments": args}}
    ).encode()


def httpx_chunks(url: str, payload: bytes) -> Iterator[bytes]:
    with httpx.Client(timeout=30.0) as c, c.stream("POST", url, content=payload) as r:
        yield from r.iter_raw()


def ghc_chunks(url: str, payload: bytes) -> Iterator[bytes]:
    u = urlsplit(url)
    client = HTTPClient(u.hostname or "127.0.0.1", u.port, connection_timeout=5, network_timeout=30)
    try:
        resp = client.post(u.path, body=payload)
        while True:
            chunk = resp.read(65536)
            if not chunk:
                return
            yield chunk
    finally:
        client.close()


LIBRARIES: dict[str, Callable[[str, bytes], Iterator[bytes]]] = {
    "httpx": httpx_chunks,
    "geventhttpclient": ghc_chunks,
}


def throughput(lib: Callable[[str, bytes], Iterator[bytes]], url: str, streams: int, events: int) -> float:
    counts = [0] * streams

    def one(i: int) -> None:
        dec = SseDecoder()
        for chunk in lib(url, body(events, 0)):
            counts[i] += len(dec.feed(chunk))

    t0 = time.perf_counter()
    gevent.joinall([gevent.spawn(one, i) for i in range(streams)], raise_error=True)
    return sum(counts) / (time.perf_counter() - t0)


def latency(lib: Callable[[str, bytes], Iterator[bytes]], url: str) -> list[float]:
    delays: list[float] = []
    dec = SseDecoder()
    for chunk in lib(url, body(30, 100)):
        now = time.time()
        for ev in dec.feed(chunk):
            delays.append((now - json.loads(ev.data)["params"]["t"]) * 1000)
    return delays


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--events", type=int, default=500)
    a = ap.parse_args()
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "raw_sse_server.py")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().split()[-1]
        print(f"{a.streams} streams x {a.events} events as fast as possible; then 30 events 100 ms apart")
        for name, lib in LIBRARIES.items():
            rate = throughput(lib, url, a.streams, a.events)
            d = latency(lib, url)
            print(
                f"{name:<17} {rate:>9,.0f} events/s   small-event delay: median {statistics.median(d):7.1f} ms, "
                f"max {max(d):7.1f} ms"
            )
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
