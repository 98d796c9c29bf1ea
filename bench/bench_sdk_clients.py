"""How many concurrent clients of the official Python SDK one adapter process holds.

    python bench/bench_sdk_clients.py [--steps 100,250,500,1000] [--period 5] [--window 10]

Starts the reference server and one `python-sdk` adapter (lab/sut/python_sdk.py), then
grows the adapter's client count step by step. Every client is the SDK's own stack with
an initialized session and its standalone GET stream open, and has made one call (not
measured: its first call costs the SDK an extra tools/list). At each step it measures the
adapter idle (3 s: RSS, RSS per client, CPU), then under a paced load where every client
calls `echo` once per `--period` seconds for `--window` seconds (calls/s done, latency as
the application saw it, errors, the adapter's and the server's CPU; 100 % = one core).
Every phase is bounded in time; figures only, no assertion.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lab.sut.host import AdapterProcess, adapter_command  # noqa: E402
from lab.sut.protocol import Call, Start  # noqa: E402
from tests.livesrv import reference_server  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Tail:
    """New records of the application log since the last poll."""

    def __init__(self, path: Path) -> None:
        self._f = path.open("rb")
        self._rest = b""

    def poll(self) -> list[dict[str, Any]]:
        *lines, self._rest = (self._rest + self._f.read()).split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def run(steps: list[int], period: float, window: float) -> None:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        log = tmp / "app.jsonl"
        with (
            reference_server(tmp, "--session-ttl", "3600", ledger=False) as srv,
            AdapterProcess(adapter_command("python-sdk"), log, key=os.urandom(32)) as adapter,
        ):
            ready = adapter.wait_ready(60)
            apid, spid = adapter.proc.pid, srv.proc.pid
            tail = Tail(log)
            time.sleep(1.0)
            base_rss = rss_mib(apid)
            impl = ready["implementation"]
            print(
                f"{impl['name']} {impl['version']} adapter; baseline RSS {base_rss:.1f} MiB; {os.cpu_count()} CPUs"
            )
            print(
                f"{'clients':>7} {'start s p99':>11} {'RSS MiB':>8} {'KiB/client':>10} {'idle CPU':>8} "
                f"{'calls/s':>8} {'offered':>8} {'p50 ms':>7} {'p99 ms':>8} {'errors':>6} "
                f"{'adapter CPU':>11} {'server CPU':>10}"
            )
            started: dict[str, float] = {}
            failed = warmed = 0
            seq = 0
            for target in steps:
                for n in range(len(started) + failed, target):
                    adapter.send(Start(f"c{n}", srv.url, None))
                deadline = time.monotonic() + 120
                while len(started) + failed < target and time.monotonic() < deadline:
                    for r in tail.poll():
                        if r["ev"] == "started":
                            started[r["client"]] = r["elapsed_s"]
                        elif r["ev"] == "start_failed":
                            failed += 1
                    time.sleep(0.05)
                if len(started) + failed < target:
                    print(f"{target:>7} only {len(started)} clients started within 120 s: stopping here")
                    break
                # Warm-up, not measured: each new client's first call (the SDK follows a client's
                # first tools/call of a tool with a tools/list), and every GET stream opens.
                warm = {f"w{n}" for n in range(warmed, target)}
                for n in range(warmed, target):
                    adapter.send(Call(f"c{n}", f"w{n}", "echo", {"text": "warm-up"}, f"w{n}"))
                warmed = target
                deadline = time.monotonic() + 60
                while warm and time.monotonic() < deadline:
                    warm -= {r["call"] for r in tail.poll() if r["ev"] == "outcome"}
                    time.sleep(0.05)
                time.sleep(1.0)
                tail.poll()
                c0, t0 = cpu_s(apid), time.monotonic()
                time.sleep(3.0)
                idle_cpu = (cpu_s(apid) - c0) / (time.monotonic() - t0) * 100
                rss = rss_mib(apid)
                per_client = (rss - base_rss) * 1024 / max(1, len(started))

                clients = sorted(started)
                interval = period / len(clients)
                latencies: list[float] = []
                errors = sent = 0
                pending: set[str] = set()
                a0, s0, t0 = cpu_s(apid), cpu_s(spid), time.monotonic()
                next_at = t0
                i = 0
                while time.monotonic() - t0 < window:
                    now = time.monotonic()
                    while next_at <= now:
                        seq += 1
                        call = f"k{seq}"
                        adapter.send(Call(clients[i % len(clients)], call, "echo", {"text": "x"}, call))
                        pending.add(call)
                        sent += 1
                        i += 1
                        next_at += interval
                    for r in tail.poll():
                        if r["ev"] == "outcome" and r["call"] in pending:
                            pending.discard(r["call"])
                            latencies.append(r["elapsed_s"] * 1000)
                            errors += r["status"] != "ok"
                    time.sleep(min(0.01, max(0.0, next_at - time.monotonic())))
                elapsed = time.monotonic() - t0
                a_cpu = (cpu_s(apid) - a0) / elapsed * 100
                s_cpu = (cpu_s(spid) - s0) / elapsed * 100
                done = sent - len(pending)
                drain = time.monotonic() + 15
                while pending and time.monotonic() < drain:
                    for r in tail.poll():
                        if r["ev"] == "outcome" and r["call"] in pending:
                            pending.discard(r["call"])
                            latencies.append(r["elapsed_s"] * 1000)
                            errors += r["status"] != "ok"
                    time.sleep(0.05)
                errors += len(pending)  # never answered within 15 s of the window's end
                start_p99 = pct(list(started.values()), 0.99)
                print(
                    f"{len(clients):>7} {start_p99:>11.2f} {rss:>8.1f} {per_client:>10.1f} {idle_cpu:>7.1f}% "
                    f"{done / elapsed:>8.1f} {sent / elapsed:>8.1f} {statistics.median(latencies):>7.1f} "
                    f"{pct(latencies, 0.99):>8.1f} {errors:>6} {a_cpu:>10.1f}% {s_cpu:>9.1f}%",
                    flush=True,
                )
            adapter.stop(60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", default="100,250,500,1000", help="client counts, ascending")
    p.add_argument("--period", type=float, default=5.0, help="seconds between two calls of one client")
    p.add_argument("--window", type=float, default=10.0, help="seconds of paced load per step")
    args = p.parse_args()
    run([int(s) for s in args.steps.split(",")], args.period, args.window)


if __name__ == "__main__":
    main()
