"""Does removing `limit_data` under load hang a Toxiproxy API? (Toxiproxy issue #558)

    .venv/bin/python bench/check_limit_data_removal.py [--real /path/to/toxiproxy-server] [--clients 40] [--seconds 12]

gate-100k's toxics in small: many clients read endless streams through a proxy and
reconnect whenever theirs ends; `latency` is added, then `limit_data` (64 KiB, toxicity
`--toxicity`, gate-100k's 0.05 by default); `latency` is removed, then, once connections
have hit their limit, `limit_data`. Toxiproxy 2.12.0 hung at the first removal with
`--toxicity 0.5 --clients 60` (docs/nemesis.md).
Each removal is timed with a 60 s API timeout. Run against `lab nemesis`, and against a
`toxiproxy-server` given with `--real` (built outside this repository). Prints, per
server, how long each API call took and whether it answered. 127.0.0.1 only; the load
is bounded by `--clients` and `--seconds`. Asserts nothing.
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_nemesis import embedded, real

from lab.nemesis.client import ToxiproxyClient, ToxiproxyError
from lab.nemesis.toxics import make_toxic

_LINE = b"data: " + b"x" * 1000 + b"\n\n"


def _streamer(stop: threading.Event) -> tuple[socket.socket, threading.Thread]:
    """An upstream that writes an endless event stream to every connection."""
    server = socket.create_server(("127.0.0.1", 0), backlog=256)
    server.settimeout(0.2)

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            while not stop.is_set():  # until the check ends or the peer goes
                try:
                    conn.sendall(_LINE)
                except OSError:
                    return
                time.sleep(0.002)

    def accept() -> None:
        while not stop.is_set():  # until the check ends
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    return server, thread


def _client(port: int, stop: threading.Event, counts: list[int]) -> None:
    while not stop.is_set():  # reconnect until the check ends
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
                while not stop.is_set():
                    data = s.recv(65536)
                    if not data:
                        break
                    counts[0] += len(data)
        except OSError:
            time.sleep(0.05)
        counts[1] += 1


def check(url: str, upstream_port: int, clients: int, seconds: float, toxicity: float) -> None:
    api = ToxiproxyClient(url, timeout=60)
    if api.get_proxy("hang") is not None:
        api.delete_proxy("hang")
    port = int(api.create_proxy("hang", f"127.0.0.1:{upstream_port}").listen.rsplit(":", 1)[1])
    stop = threading.Event()
    counts = [0, 0]  # bytes read, connections ended
    threads = [
        threading.Thread(target=_client, args=(port, stop, counts), daemon=True) for _ in range(clients)
    ]
    for t in threads:
        t.start()
    third = seconds / 3
    steps: list[tuple[float, str, Callable[[], object]]] = [
        (0.0, "add latency", lambda: api.add_toxic("hang", make_toxic("latency", latency=50, jitter=25))),
        (
            third * 0.8,
            "add limit_data",
            lambda: api.add_toxic("hang", make_toxic("limit_data", toxicity=toxicity, bytes=65536)),
        ),
        (third, "remove latency", lambda: api.remove_toxic("hang", "latency_downstream")),
        (2 * third, "remove limit_data", lambda: api.remove_toxic("hang", "limit_data_downstream")),
        (2 * third + 1, "list proxies", lambda: api.proxies()),
    ]
    start = time.monotonic()
    try:
        for at, what, call in steps:
            time.sleep(max(0.0, start + at - time.monotonic()))
            before, before_mb = time.monotonic(), counts[0] / 1e6
            try:
                call()
                result = "answered"
            except ToxiproxyError as exc:
                result = f"FAILED: {exc}"
            took = time.monotonic() - before
            print(
                f"  t={before - start:5.1f}s {what:18} {result} in {took:.2f} s ({before_mb:.0f} MB read so far)"
            )
        time.sleep(max(0.0, start + seconds - time.monotonic()))
        print(f"  {counts[0] / 1e6:.0f} MB read, {counts[1]} connections ended")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=5)
        try:
            api.delete_proxy("hang")
        except ToxiproxyError as exc:
            print(f"  deleting the proxy failed: {exc}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--real", type=Path, default=None, help="a toxiproxy-server binary")
    p.add_argument("--clients", type=int, default=40, help="concurrent reconnecting clients (1..200)")
    p.add_argument("--seconds", type=float, default=12.0, help="length of the check (3..120)")
    p.add_argument("--toxicity", type=float, default=0.05, help="limit_data's toxicity (gate-100k: 0.05)")
    args = p.parse_args(argv)
    if not (1 <= args.clients <= 200 and 3 <= args.seconds <= 120):
        p.error("--clients 1..200, --seconds 3..120")
    stop = threading.Event()
    server, thread = _streamer(stop)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            upstream = int(server.getsockname()[1])
            with embedded(Path(tmp)) as (url, _pid):
                print("embedded nemesis")
                check(url, upstream, args.clients, args.seconds, args.toxicity)
            if args.real is not None:
                with real(args.real, Path(tmp)) as (url, _pid):
                    print(f"real: {args.real}")
                    check(url, upstream, args.clients, args.seconds, args.toxicity)
    finally:
        stop.set()
        server.close()
        thread.join(timeout=5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
