"""The lab's own latency at the release gate's load, without faults: per hop, per worker,
per 5 s, and each process's CPU.

    python bench/bench_lab_latency.py [--users 120] [--workers 2] [--duration 30]
                                      [--stall 1500/2000@0] [--blocking 50] [--probe] [--keep]
    python bench/bench_lab_latency.py RUN_DIR [RUN_DIR ...]   # figures of finished runs

Writes a scenario of gate-100k's shape (its users, workers, spawn rate, task mix, ticker
and reconnect budget; no faults, no toxics, no event target) to a temporary folder, runs
`lab run` on it, and prints from the run folder (report.json `lab_latency` and
`processes`, and the ledgers for the time bins):
- the wall time of `lab run` (report included) and the events counted;
- each hop's count, p50, p99 and max, over the run and per Locust worker;
- the delivery hop's p50/p99 per 5 s bin beside each lab process's mean CPU in the bin;
- each process's CPU mean/p95/max (cores) and peak RSS.
With `--blocking MS`, gevent's own monitor thread runs in every Locust process
(GEVENT_MONITOR_THREAD_ENABLE, GEVENT_MAX_BLOCKING_TIME) and reports each time a
greenlet held the loop longer than MS; the bench counts the reports in the workers' logs
by the innermost frame of the lab's code (and of SQLite, ssl, json...) that was running.
With `--probe`, a thread sends a small request on a new connection every 0.2 s, while
the load runs, straight to each layer — the server, mitmdump, the nemesis — and prints
the time to the answer's first byte per layer: what one layer adds to the one behind it.
Given run folders instead, it prints the same figures for each (e.g. before and after a
change, side by side). `--stall` passes the test-only LAB_TEST_LOOP_STALL_MS to the
workers (lab/load/locustfile.py). Prints figures only.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _labrun import listening, run_folder, start_run

BIN_S = 5.0

SCENARIO = """# bench/bench_lab_latency.py: gate-100k's shape, no faults
description = "Lab latency bench: {users} clients on {workers} workers, {duration} s, no faults"
seed = 100000

[target]
kind = "reference"
protocol_version = "2025-11-25"

[load]
users = {users}
spawn_rate = 50
duration = "{duration}s"
hard_timeout = "{hard}s"
workers = {workers}
wait_min = "0.8s"
wait_max = "1.6s"

[load.mix]
read = 1
stream = 4
write = 1
churn = 1

[load.ticker]
count = 50
interval = "10ms"

[reconnect]
budget_qps = 100
burst = 20

[budgets]
resume_p99_s = "5s"
min_events = 1000
"""


def run(args: argparse.Namespace, tmp: Path) -> tuple[Path, float, int]:
    scenario = tmp / "lab-latency.toml"
    scenario.write_text(
        SCENARIO.format(
            users=args.users, workers=args.workers, duration=args.duration, hard=args.duration * 3 + 60
        ),
        encoding="utf-8",
    )
    env = {k: v for k, v in os.environ.items() if k != "LAB_TEST_LOOP_STALL_MS"}
    if args.stall:
        env["LAB_TEST_LOOP_STALL_MS"] = args.stall
    if args.blocking:
        env["GEVENT_MONITOR_THREAD_ENABLE"] = "true"
        env["GEVENT_MAX_BLOCKING_TIME"] = str(args.blocking / 1000.0)
    out = tmp / "results"
    t0 = time.monotonic()
    proc = start_run(scenario, out, env=env)
    probes: dict[str, list[float]] = {}
    prober = threading.Thread(target=probe_layers, args=(out, proc, probes), daemon=True)
    if args.probe:
        prober.start()
    code = proc.wait()
    wall = time.monotonic() - t0
    if args.probe:
        prober.join(timeout=5)
        print_probes(probes)
    folder = run_folder(out)
    if folder is None:
        raise SystemExit(f"lab run exited {code} without making a run folder under {out}")
    return folder, wall, code


def _first_byte(host: str, port: int) -> float | None:
    t0 = time.perf_counter()
    try:
        with socket.create_connection((host, port), timeout=10) as sock:
            sock.sendall(b"GET /mcp HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
            if not sock.recv(1):
                return None
    except OSError:
        return None
    return time.perf_counter() - t0


def probe_layers(out: Path, proc: subprocess.Popen[bytes], probes: dict[str, list[float]]) -> None:
    """Every 0.2 s while `lab run` runs (and its load is on): each layer's first byte."""
    listen: dict[str, tuple[str, int]] = {}
    while proc.poll() is None and len(listen) < 3:
        found = run_folder(out)
        listen = listening(found) if found else {}
        time.sleep(0.5)
    folder = run_folder(out)
    while proc.poll() is None and folder is not None and not (folder / "progress.json").is_file():
        time.sleep(0.2)  # the load has not started yet
    while proc.poll() is None and folder is not None and not (folder / "report.json").exists():
        for layer, (host, port) in listen.items():
            took = _first_byte(host, port)
            if took is not None:
                probes.setdefault(layer, []).append(took)
        time.sleep(0.2)


def print_probes(probes: dict[str, list[float]]) -> None:
    print("first byte of a new request, straight to each layer, during the load:")
    for layer in ("server", "mitmproxy", "nemesis"):
        v = np.sort(np.array(probes.get(layer, []), dtype="float64"))
        if not len(v):
            print(f"  {layer:<10} no answer")
            continue
        p50 = v[max(0, int(np.ceil(0.5 * len(v))) - 1)]
        p99 = v[max(0, int(np.ceil(0.99 * len(v))) - 1)]
        print(f"  {layer:<10} n {len(v):>4}  p50 {secs(p50):>8}  p99 {secs(p99):>8}  max {secs(v[-1]):>8}")


def secs(value: Any) -> str:
    return "—" if value is None else f"{value * 1000:.0f} ms"


def bins(folder: Path) -> list[str]:
    """Delivery p50/p99 per 5 s bin beside each lab process's mean CPU in the bin."""
    from lab.checker.context import Context, parse_budgets
    from lab.checker.health import lab_hops, processes
    from lab.checker.inputs.load import MissingInput, load_run

    data = load_run(folder)
    ctx = Context(data, parse_budgets(data.run))
    try:
        d = lab_hops.delivery_delays(ctx)
    except MissingInput as e:
        return [f"  (no delivery figures: {e})"]
    s = processes.samples(ctx)
    start = ctx.origin or float(d["t"].min())
    f = s.frame[[processes.is_lab(str(p)) and "/" not in str(p) for p in s.frame["part"]]]
    parts = sorted(set(f["part"].astype(str))) if len(f) else []
    head = f"  {'T+ s':>6} {'events':>7} {'p50':>7} {'p99':>7} {'max':>7}  " + " ".join(
        f"{p[:10]:>10}" for p in parts
    )
    lines = [head]
    t = d["t"].to_numpy(dtype="float64")
    delay = d["delay"].to_numpy(dtype="float64")
    edge = start
    while edge < t.max():
        inside = (t >= edge) & (t < edge + BIN_S)
        v = np.sort(delay[inside])
        cpu = []
        for p in parts:
            g = f[(f["part"] == p) & (f["t"] >= edge) & (f["t"] < edge + BIN_S)]["cpu"]
            cpu.append(f"{g.mean():>10.2f}" if len(g) else f"{'—':>10}")
        if len(v):
            p50 = v[max(0, int(np.ceil(0.5 * len(v))) - 1)]
            p99 = v[max(0, int(np.ceil(0.99 * len(v))) - 1)]
            lines.append(
                f"  {edge - start:>6.0f} {len(v):>7} {secs(p50):>7} {secs(p99):>7} {secs(v[-1]):>7}  "
                + " ".join(cpu)
            )
        edge += BIN_S
    lines.append("  (CPU columns: mean cores used in the bin, per lab process)")
    return lines


def blocked(folder: Path) -> list[str]:
    """gevent's "appears to be blocked" reports in the workers' logs, counted by the
    innermost frame in lab/ and by the innermost frame of all."""
    from collections import Counter

    ours: Counter[str] = Counter()
    inner: Counter[str] = Counter()
    reports = 0
    for log in sorted((folder / "logs").glob("worker-*.log")):
        text = log.read_text(errors="replace")
        for chunk in text.split("appears to be blocked")[1:]:
            stack = chunk.split("Blocked Stack", 1)[-1].split("\n\n", 1)[0]
            frames = [line.strip() for line in stack.splitlines() if line.strip().startswith("File ")]
            if not frames:
                continue
            reports += 1
            inner[_frame(frames[-1])] += 1
            lab = [f for f in frames if "/lab/" in f]
            ours[_frame(lab[-1]) if lab else "(no frame of lab/)"] += 1
    if not reports:
        return ["  no blocking report (or --blocking was not given)"]
    out = [f"  {reports} reports; innermost lab/ frame:"]
    out += [f"    {n:>5}  {k}" for k, n in ours.most_common(8)]
    out += ["  innermost frame:"] + [f"    {n:>5}  {k}" for k, n in inner.most_common(8)]
    return out


def _frame(line: str) -> str:
    """`File "/x/lab/inbox.py", line 12, in flush` -> `lab/inbox.py:flush`."""
    try:
        path = line.split('"')[1]
        func = line.rsplit(" in ", 1)[1]
    except IndexError:
        return line
    if "/site-packages/" in path:
        short = path.split("/site-packages/")[-1]
    elif "/lab/" in path:
        short = "lab/" + path.rsplit("/lab/", 1)[1]
    else:
        short = path.rsplit("/", 1)[-1]
    return f"{short}:{func}"


def show(folder: Path, wall: float | None = None, code: int | None = None) -> None:
    report = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    ll = report.get("lab_latency") or {}
    run = report.get("run") or {}
    print(f"\n== {folder.name}")
    extra = f", lab run wall {wall:.1f} s (report included), exit {code}" if wall is not None else ""
    print(
        f"verdict {report.get('verdict')}, events {report.get('event_count')}, "
        f"run {run.get('duration_s') or 0:.1f} s{extra}"
    )
    print(f"{'hop':<10} {'count':>8} {'p50':>8} {'p99':>8} {'max':>8}   per worker (p99)")
    for h in ll.get("hops") or []:
        if h["hop"] == "nemesis":
            print(f"{'nemesis':<10} {h.get('why_not')}")
            continue
        if not h.get("measured"):
            print(f"{h['hop']:<10} not measured: {h.get('why_not')}")
            continue
        workers = ", ".join(f"{w['part']} {secs(w['p99_s'])}" for w in h.get("by_worker") or [])
        print(
            f"{h['hop']:<10} {h['count']:>8} {secs(h['p50_s']):>8} {secs(h['p99_s']):>8} {secs(h['max_s']):>8}   {workers}"
        )
    resume = ll.get("resume")
    if resume and resume.get("recoveries"):
        print(
            f"resume: {resume['recoveries']} recoveries, p99 {secs(resume['p99_s'])}, "
            f"net of the lab's delivery delay {secs(resume['net_p99_s'])} ({resume['joined']} joined)"
        )
    for w in ll.get("warnings") or []:
        print(f"WARNING: {w['text']}")
    print("delivery per 5 s:")
    print("\n".join(bins(folder)))
    pr = report.get("processes") or {}
    print(f"{'process':<22} {'CPU mean':>9} {'p95':>6} {'max':>6} {'RSS max':>9}")
    for p in pr.get("parts") or []:
        rss = "—" if p.get("rss_max") is None else f"{p['rss_max'] / 2**20:.0f} MiB"
        print(
            f"{p['part']:<22} {p.get('cpu_mean') or 0:>9.2f} {p.get('cpu_p95') or 0:>6.2f} "
            f"{p.get('cpu_max') or 0:>6.2f} {rss:>9}"
        )
    box = pr.get("box")
    if box:
        print(
            f"box: {box['cpu_mean']:.2f} cores busy on average, p95 {box['cpu_p95']:.2f} of {pr.get('cpus')}"
        )
    print("gevent loop blocked (workers):")
    print("\n".join(blocked(folder)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", type=Path, help="finished run folders: print their figures")
    ap.add_argument("--users", type=int, default=120)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--duration", type=int, default=30, help="seconds of load")
    ap.add_argument("--stall", default=None, help="LAB_TEST_LOOP_STALL_MS for the workers (test only)")
    ap.add_argument("--blocking", type=int, default=0, help="report loop blocks over this many ms (gevent)")
    ap.add_argument(
        "--probe", action="store_true", help="time a request straight to each layer, during the load"
    )
    ap.add_argument("--keep", action="store_true", help="keep the run folder (its path is printed)")
    args = ap.parse_args()
    if args.runs:
        for folder in args.runs:
            show(folder)
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench-lab-latency-"))
    folder, wall, code = run(args, tmp)
    show(folder, wall, code)
    if args.keep:
        print(f"\nrun folder kept: {folder}")
    else:
        subprocess.run(["rm", "-rf", str(tmp)], check=False)


if __name__ == "__main__":
    main()
