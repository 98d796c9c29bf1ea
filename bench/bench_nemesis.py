"""Bulk MB/s through the embedded nemesis, and through a real toxiproxy-server when one is given.

    .venv/bin/python bench/bench_nemesis.py [--real /path/to/toxiproxy-server] [--mb 400] [--connections 4] [--rounds 3]

One upstream in this process (threads) sends `--mb` MB in all, split over `--connections`
connections opened at once, as fast as the kernel takes it; the clients (threads) read
through a proxy with no toxics until EOF. The proxies are `lab nemesis` and, with
`--real`, a `toxiproxy-server` (built outside this repository; docs/nemesis.md): each
round measures both, one after the other, so the figures come from the same run. Prints
MB/s, the proxy's CPU seconds (from /proc) and MB per CPU second for each, the medians,
and the ratio embedded/real (the aim is >= 0.75). Everything is on 127.0.0.1 and bounded
by `--mb` and a 120 s deadline per transfer. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from lab.nemesis.client import ToxiproxyClient, wait_until_up

_CHUNK = 1024 * 1024
_DEADLINE_S = 120.0
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Figure:
    mb_per_s: float
    cpu_s: float
    mb: float

    @property
    def mb_per_cpu_s(self) -> float:
        return self.mb / self.cpu_s if self.cpu_s > 0 else float("inf")


class Upstream:
    """Sends `per_connection` bytes to each connection, then closes it."""

    def __init__(self, per_connection: int) -> None:
        self.per_connection = per_connection
        self._sock = socket.create_server(("127.0.0.1", 0), backlog=64)
        self._sock.settimeout(0.2)
        self.port = int(self._sock.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._payload = memoryview(bytes(range(256)) * (_CHUNK // 256))

    def __enter__(self) -> Upstream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._sock.close()
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        while not self._stop.is_set():  # until the bench ends
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._send, args=(conn,), daemon=True).start()

    def _send(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(_DEADLINE_S)
            left = self.per_connection
            try:
                while left > 0:  # bounded by per_connection
                    n = min(left, _CHUNK)
                    conn.sendall(self._payload[:n])
                    left -= n
                conn.shutdown(socket.SHUT_WR)
            except OSError:
                return


def _read_all(port: int, out: list[int]) -> None:
    buffer = bytearray(_CHUNK)
    got = 0
    with socket.create_connection(("127.0.0.1", port), timeout=_DEADLINE_S) as s:
        while True:  # until EOF, bounded by the upstream's byte count and the deadline
            n = s.recv_into(buffer)
            if not n:
                break
            got += n
    out.append(got)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime


def transfer(proxy_port: int, connections: int, pid: int, expected: int) -> Figure:
    counts: list[int] = []
    threads = [threading.Thread(target=_read_all, args=(proxy_port, counts)) for _ in range(connections)]
    cpu_before = _cpu_s(pid)
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=_DEADLINE_S)
    elapsed = time.perf_counter() - start
    cpu = _cpu_s(pid) - cpu_before
    total = sum(counts)
    if total != expected:
        print(f"  warning: {total} bytes arrived, {expected} were sent", file=sys.stderr)
    mb = total / 1e6
    return Figure(mb / elapsed, cpu, mb)


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return int(s.getsockname()[1])


@contextmanager
def embedded(folder: Path) -> Iterator[tuple[str, int]]:
    lab = str(Path(sys.executable).with_name("lab"))
    proc = subprocess.Popen(
        [lab, "nemesis", "--api-port", "0", "--log", str(folder / "nemesis.jsonl")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        match = re.match(r"^lab-nemesis api (http://\S+)$", proc.stdout.readline().strip())
        if match is None:
            raise RuntimeError("lab nemesis did not announce its API")
        yield match.group(1), proc.pid
    finally:
        _stop(proc)


@contextmanager
def real(binary: Path, folder: Path) -> Iterator[tuple[str, int]]:
    port = _free_port()
    with (folder / "toxiproxy.log").open("w") as log:
        proc = subprocess.Popen(
            [str(binary), "-host", "127.0.0.1", "-port", str(port)], stdout=log, stderr=log
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(ToxiproxyClient(url), within=20)
        yield url, proc.pid
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    proc.terminate()  # by PID
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def measure(server: tuple[str, int], upstream: Upstream, connections: int) -> Figure:
    url, pid = server
    client = ToxiproxyClient(url, timeout=10)
    if client.get_proxy("bench") is not None:
        client.delete_proxy("bench")
    info = client.create_proxy("bench", f"127.0.0.1:{upstream.port}", "127.0.0.1:0")
    port = int(info.listen.rsplit(":", 1)[1])
    try:
        transfer(port, connections, pid, upstream.per_connection * connections)  # warm-up (discarded)
        return transfer(port, connections, pid, upstream.per_connection * connections)
    finally:
        client.delete_proxy("bench")


def _line(name: str, f: Figure) -> str:
    return (
        f"  {name:9} {f.mb_per_s:8.1f} MB/s   proxy CPU {f.cpu_s:6.2f} s   {f.mb_per_cpu_s:8.1f} MB per CPU-s"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--real", type=Path, default=None, help="a toxiproxy-server binary to compare with")
    p.add_argument("--mb", type=int, default=400, help="MB per transfer, over all connections (1..4000)")
    p.add_argument("--connections", type=int, default=4, help="concurrent connections (1..64)")
    p.add_argument("--rounds", type=int, default=3, help="rounds (1..20)")
    args = p.parse_args(argv)
    if not (1 <= args.mb <= 4000 and 1 <= args.connections <= 64 and 1 <= args.rounds <= 20):
        p.error("--mb 1..4000, --connections 1..64, --rounds 1..20")
    if args.real is not None and not os.access(args.real, os.X_OK):
        p.error(f"--real {args.real}: not an executable file")
    per_connection = args.mb * 1_000_000 // args.connections
    ours: list[Figure] = []
    theirs: list[Figure] = []
    print(f"bulk: {args.mb} MB over {args.connections} connections, no toxics, {args.rounds} round(s)")
    with tempfile.TemporaryDirectory() as tmp, Upstream(per_connection) as upstream:
        folder = Path(tmp)
        with embedded(folder) as nemesis_server:
            real_cm = real(args.real, folder) if args.real is not None else None
            real_server = real_cm.__enter__() if real_cm is not None else None
            try:
                for round_ in range(1, args.rounds + 1):
                    print(f"round {round_}")
                    ours.append(measure(nemesis_server, upstream, args.connections))
                    print(_line("embedded", ours[-1]))
                    if real_server is not None:
                        theirs.append(measure(real_server, upstream, args.connections))
                        print(_line("real", theirs[-1]))
            finally:
                if real_cm is not None:
                    real_cm.__exit__(None, None, None)
    ours_mb = statistics.median(f.mb_per_s for f in ours)
    print(f"median embedded {ours_mb:.1f} MB/s")
    if theirs:
        theirs_mb = statistics.median(f.mb_per_s for f in theirs)
        print(f"median real     {theirs_mb:.1f} MB/s")
        print(f"ratio embedded/real {ours_mb / theirs_mb:.2f} (aim >= 0.75)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
