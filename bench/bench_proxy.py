"""Events/s through mitmdump: the fault addon (faults on, low rate, tap on) vs a pass-through addon.

    .venv/bin/python bench/bench_proxy.py [--clients 500] [--events 200] [--interval-ms 5] [--rounds 3]

One upstream, bench/raw_sse_server.py (a minimal SSE server, so that the proxy is the
bottleneck), and two mitmdump processes in front of it, both with connection_strategy=lazy
and -q: one runs addons/mcp_noop.py (streams SSE untouched), the other
addons/mcp_faults.py with a plan that has every fault kind at `--rate` (cut_stream at
rate/100, so streams are rarely ended early) and writes the tap to a temporary folder.
The load client (bench/sse_load.py: raw asyncio sockets) drives them in turn, A/B for
`--rounds` rounds after a warm-up, in two load shapes: the lab's (many concurrent
sessions, each calling `ticker` for `--events` events `--interval-ms` apart) and a
flat-out one (few sessions, events as fast as the upstream writes them: the worst case
for an addon that works per event, since pass-through mitmproxy works per chunk).
Prints events/s of each, the medians and their ratio (aim >= 0.75), the same per
CPU-second of each proxy process (steadier on a shared machine), and what the faults did
according to the tap. Asserts nothing.

Against the raw upstream some faults cannot apply and never fire (it has no admin control,
no sessions, no tokens, no resumption and no DELETE; its last event is not a JSON-RPC
response).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sse_load import LoadResult, run_load

from lab.faults.kinds import NAMES
from lab.faults.launch import ADDONS, mitmdump_argv, ready_prefix

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
KINDS = NAMES


def start(argv: list[str], prefix: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start a process and wait (at most 30 s) for its "listening" line; its URL."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "LAB_LEDGER_KEY": "cd" * 32},
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for text in log.read_text(errors="replace").splitlines():
            if text.startswith(prefix):
                return proc, text[len(prefix) :].strip()
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    stop(proc)
    raise SystemExit(f"could not start {argv[0]}:\n{log.read_text(errors='replace')}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def mitmdump(
    upstream: str, script: str, log: Path, options: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    path = ADDONS / script
    return start(mitmdump_argv(upstream, script=path, options=options), ready_prefix(path), log)


def plan(rate: float) -> dict[str, object]:
    rules = [{"kind": k, "rate": rate / 100 if k == "cut_stream" else rate} for k in KINDS]
    return {"seed": 1, "rules": rules}


def load(url: str, clients: int, events: int, interval_ms: int = 0) -> LoadResult:
    import uvloop

    host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    args: dict[str, object] = {"count": events, "interval_ms": interval_ms}
    return uvloop.run(run_load(host, int(port), "/mcp", clients, args))


def fired(tap: Path) -> dict[str, int]:
    counts: collections.Counter[str] = collections.Counter()
    if not tap.exists():
        return {}
    with tap.open() as f:
        for text in f:
            r = json.loads(text)
            if r["type"] in ("dropped", "fault") or (r["type"] == "forwarded" and r["fault"]):
                counts[r["fault"]] += 1
            elif r["type"] == "flow":
                counts.update(x["fault"] for x in r["faults"])
    return dict(sorted(counts.items()))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def compare(
    sides: dict[str, tuple[str, int]], title: str, clients: int, events: int, interval_ms: int, rounds: int
) -> float:
    """Alternate the two proxies for `rounds` rounds of one load shape; print; the ratio of medians.

    Besides events per wall second, events per CPU-second of the proxy process: on a
    machine shared with other work, wall throughput swings with the neighbours' load,
    while what the proxy spends per event does not.
    """
    print(f"\n{title}: {clients} sessions x {events} events, {interval_ms} ms apart, {rounds} rounds")
    wall: dict[str, list[float]] = {name: [] for name in sides}
    per_cpu: dict[str, list[float]] = {name: [] for name in sides}
    print(f"{'round':<6} {'pass-through ev/s':>18} {'faults ev/s':>12} {'(ev/CPU-s)':>22} {'failed':>7}")
    for i in range(rounds):
        order = list(sides) if i % 2 == 0 else list(reversed(sides))
        failed = 0
        for name in order:
            url, pid = sides[name]
            before = cpu_seconds(pid)
            r = load(url, clients, events, interval_ms)
            used = cpu_seconds(pid) - before
            wall[name].append(r.events_per_second)
            per_cpu[name].append(r.events / used if used > 0 else 0.0)
            failed += r.failed
        n, f = wall["noop"][-1], wall["faults"][-1]
        cpu_pair = f"{per_cpu['noop'][-1]:,.0f} / {per_cpu['faults'][-1]:,.0f}"
        print(f"{i + 1:<6} {n:>18,.0f} {f:>12,.0f} {cpu_pair:>22} {failed:>7}")
    med = {name: statistics.median(v) for name, v in wall.items()}
    med_cpu = {name: statistics.median(v) for name, v in per_cpu.items()}
    ratio = med["faults"] / med["noop"] if med["noop"] else 0.0
    ratio_cpu = med_cpu["faults"] / med_cpu["noop"] if med_cpu["noop"] else 0.0
    cpu_pair = f"{med_cpu['noop']:,.0f} / {med_cpu['faults']:,.0f}"
    print(f"{'median':<6} {med['noop']:>18,.0f} {med['faults']:>12,.0f} {cpu_pair:>22}")
    print(f"ratio faults/pass-through: {ratio:.2f} (aim >= 0.75); per CPU-second: {ratio_cpu:.2f}")
    return ratio


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--clients", type=int, default=500, help="lab shape: concurrent sessions")
    ap.add_argument("--events", type=int, default=200, help="lab shape: events per session")
    ap.add_argument("--interval-ms", type=int, default=5, help="lab shape: pause between a session's events")
    ap.add_argument("--flat-clients", type=int, default=50, help="flat-out shape: sessions (0: skip it)")
    ap.add_argument("--flat-events", type=int, default=2000, help="flat-out shape: events per session")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rate", type=float, default=0.001, help="rate of every fault (cut_stream: rate/100)")
    a = ap.parse_args()
    import mitmproxy.version

    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp_s:
        tmp = Path(tmp_s)
        plan_file = tmp / "plan.json"
        plan_file.write_text(json.dumps(plan(a.rate)))
        tap = tmp / "proxy" / "tap.jsonl"
        procs: list[subprocess.Popen[bytes]] = []
        try:
            up, up_url = start(
                [sys.executable, str(ROOT / "bench" / "raw_sse_server.py")],
                "raw-sse listening on ",
                tmp / "up.log",
            )
            procs.append(up)
            upstream = up_url.rsplit("/", 1)[0]
            noop, noop_url = mitmdump(upstream, "mcp_noop.py", tmp / "noop.log")
            procs.append(noop)
            faults, faults_url = mitmdump(
                upstream,
                "mcp_faults.py",
                tmp / "faults.log",
                {"mcpfaults_plan": str(plan_file), "mcpfaults_tap": str(tap)},
            )
            procs.append(faults)
            sides = {"noop": (noop_url + "/mcp", noop.pid), "faults": (faults_url + "/mcp", faults.pid)}
            print(
                f"mitmdump {mitmproxy.version.VERSION}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; "
                f"fault rate {a.rate} (every kind), tap on"
            )
            for url, _ in sides.values():  # warm-up, not measured
                load(url, 20, 200)
            compare(sides, "lab shape (many paced streams)", a.clients, a.events, a.interval_ms, a.rounds)
            if a.flat_clients:
                compare(
                    sides,
                    "flat-out shape (few streams, no pause)",
                    a.flat_clients,
                    a.flat_events,
                    0,
                    a.rounds,
                )
            print(f"\nfaults fired (tap): {fired(tap)}")
        finally:
            for p in reversed(procs):
                stop(p)


if __name__ == "__main__":
    main()
