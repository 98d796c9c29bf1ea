"""Events/s of the reference server vs a minimal raw SSE server, side by side, same load.

    python bench/bench_server.py [--clients 200] [--events 500] [--hold 2000]
    python bench/bench_server.py --before REV [--clients 50] [--events 1000] [--rounds 5]
    python bench/bench_server.py --store [--clients 50] [--events 1000] [--rounds 5]

Both servers run as processes of their own under uvicorn (uvloop, httptools) on
127.0.0.1; one load client (raw asyncio sockets, bench/sse_load.py) drives each in turn:
N concurrent sessions, each calling `ticker` with `--events` progress events as fast as
possible (saturation); then `--hold` sessions at once, each ticking every 20 ms (all
streams open together: peak open shows how many were held). The reference server writes its full ledger during the run, as in a real run.
Prints figures; asserts nothing (machines are noisy).

With `--before REV`: the server's CPU per event instead, this tree's `lab serve` against
REV's (its `lab/` taken out with `git archive`, first on the server's PYTHONPATH), both
writing their ledgers, each round driving each with the same throughput load, alternated;
CPU is the server process's own (utime + stime from /proc, threads included) over the
load, divided by the events the load client received. Medians of the rounds.

With `--store`: the same figure for this tree's server in memory and with `--store FILE`
(lab/server/store.py: sessions, streams and every event kept for a restart), side by side
in one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _labrun import export_tree
from sse_load import LoadResult, run_load

ROOT = Path(__file__).resolve().parents[1]
LAB = str(Path(sys.executable).with_name("lab"))


def start(argv: list[str], prefix: str, tree: Path | None = None) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "LAB_LEDGER_KEY": "cd" * 32}
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(prefix):
            return proc, line[len(prefix) :].strip()
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


def load(url: str, clients: int, args: dict[str, object]) -> LoadResult:
    import uvloop

    host_port = url.split("//", 1)[1].split("/", 1)[0]
    host, port = host_port.rsplit(":", 1)
    return uvloop.run(run_load(host, int(port), "/mcp", clients, args))


def line(name: str, r: LoadResult) -> str:
    return (
        f"{name:<10} {r.clients:>6} clients {r.events:>9} events {r.seconds:7.2f} s "
        f"{r.events_per_second:>10,.0f} ev/s  peak open {r.peak_open:>5}  failed {r.failed}"
    )


def cpu_seconds(pid: int) -> float:
    """utime + stime of process `pid`, all its threads, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_rounds(
    servers: dict[str, tuple[list[str], Path | None]], clients: int, events: int, rounds: int
) -> dict[str, list[float]]:
    """Each server's CPU per event (µs) in each round: each round drives every server in
    turn with the same throughput load."""
    started = {name: start(argv, "lab-serve listening on ", tree) for name, (argv, tree) in servers.items()}
    load_args: dict[str, object] = {"count": events, "interval_ms": 0}
    per: dict[str, list[float]] = {name: [] for name in servers}
    try:
        for _ in range(rounds):
            for name, (proc, url) in started.items():
                spent = cpu_seconds(proc.pid)
                r = load(url, clients, load_args)
                time.sleep(0.2)  # the ledger's (and the store's) last batch
                per[name].append((cpu_seconds(proc.pid) - spent) / max(1, r.events) * 1e6)
    finally:
        for proc, _ in started.values():
            stop(proc)
    return per


def print_rounds(per: dict[str, list[float]], labels: dict[str, str]) -> None:
    base = statistics.median(next(iter(per.values())))
    for name, values in per.items():
        m = statistics.median(values)
        rounds_txt = ", ".join(f"{v:.1f}" for v in values)
        print(f"  {labels[name]:<24} {m:7.1f} µs ({m / base:.2f})   rounds: {rounds_txt}")


def cpu_per_event(rev: str, clients: int, events: int, rounds: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-server-"))
    before = export_tree(rev, tmp / "before", "lab")
    # The `lab` script, not `python -c`: a -c program has the work tree (its cwd) first
    # on sys.path, ahead of REV's tree on PYTHONPATH.
    servers = {
        name: ([LAB, "serve", "--port", "0", "--ledger", str(tmp / f"{name}.sqlite")], tree)
        for name, tree in (("before", before), ("after", None))
    }
    per = cpu_rounds(servers, clients, events, rounds)
    print(f"reference server CPU per event: {clients} streams x {events} events, {rounds} rounds, ledger on")
    print_rounds(per, {"before": f"before ({rev})", "after": "after (this tree)"})


def cpu_per_event_store(clients: int, events: int, rounds: int) -> None:
    """This tree's server without and with `--store`, both writing their ledgers."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-server-"))
    memory = [LAB, "serve", "--port", "0", "--ledger", str(tmp / "memory-ledger.sqlite")]
    stored = [LAB, "serve", "--port", "0", "--ledger", str(tmp / "store-ledger.sqlite")]
    stored += ["--store", str(tmp / "store.sqlite")]
    per = cpu_rounds({"memory": (memory, None), "store": (stored, None)}, clients, events, rounds)
    print(f"reference server CPU per event: {clients} streams x {events} events, {rounds} rounds, ledger on")
    print_rounds(per, {"memory": "in memory", "store": "with --store"})
    size = sum(p.stat().st_size for p in tmp.glob("store.sqlite*"))
    print(f"  store file at the end: {size / 1e6:.1f} MB (sessions stay until they expire)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--events", type=int, default=500)
    ap.add_argument("--hold", type=int, default=2000)
    ap.add_argument("--before", metavar="REV", help="CPU per event, this tree against REV's server")
    ap.add_argument("--store", action="store_true", help="CPU per event, in memory and with --store")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    if a.before:
        cpu_per_event(a.before, a.clients, a.events, a.rounds)
        return
    if a.store:
        cpu_per_event_store(a.clients, a.events, a.rounds)
        return
    fast: dict[str, object] = {"count": a.events, "interval_ms": 0}
    tmp = Path(tempfile.mkdtemp(prefix="bench-server-"))
    ref, ref_url = start(
        [LAB, "serve", "--port", "0", "--ledger", str(tmp / "ledger.sqlite")], "lab-serve listening on "
    )
    raw, raw_url = start([sys.executable, str(ROOT / "bench" / "raw_sse_server.py")], "raw-sse listening on ")
    try:
        print(f"throughput: {a.clients} concurrent streams x {a.events} events, as fast as possible")
        r_raw = load(raw_url, a.clients, fast)
        r_ref = load(ref_url, a.clients, fast)
        print(line("raw", r_raw))
        print(line("reference", r_ref))
        print(f"ratio reference/raw: {r_ref.events_per_second / r_raw.events_per_second:.2f}")
        paced: dict[str, object] = {"count": 100, "interval_ms": 20}
        print(f"concurrency: {a.hold} concurrent streams x 100 events, one per 20 ms per stream")
        p_raw = load(raw_url, a.hold, paced)
        p_ref = load(ref_url, a.hold, paced)
        print(line("raw", p_raw))
        print(line("reference", p_ref))
        print(f"ratio reference/raw: {p_ref.events_per_second / p_raw.events_per_second:.2f}")
        print(f"hold: {a.hold} sessions, each stream open ~10 s (10 events, 1 per second)")
        print(line("reference", load(ref_url, a.hold, {"count": 10, "interval_ms": 1000})))
    finally:
        stop(ref)
        stop(raw)


if __name__ == "__main__":
    main()
