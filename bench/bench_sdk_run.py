"""How many concurrent SDK clients `lab run --client` holds on this box, end to end.

    python bench/bench_sdk_run.py [--client python-sdk] [--steps 100,250,500] [--workers 1]
                                  [--duration 60] [--period 5]

For each step, one `lab run` of a generated scenario (no faults): N users spawned over
the first quarter of the run (figures are taken from 15 s after that: starting clients is
the busy part), each calling `echo` or `ticker` about once per `--period`
seconds, through the nemesis and mitmdump to the reference server, with `--workers`
Locust workers (one adapter process each). While it runs, the adapter, Locust worker,
mitmdump, nemesis and server processes are sampled from /proc every second (RSS; CPU,
mean and peak over the steady window, 100 % = one core); afterwards the
application logs say how many clients were up at once, how long they took to start, and
how the calls went. Reports figures only (no assertion); every run is bounded by its
scenario's hard timeout. The report step is skipped (`--no-report`): this measures load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LAB = str(Path(sys.executable).with_name("lab"))
TICK = os.sysconf("SC_CLK_TCK")
SETTLE_S = 15.0
"""Seconds after the ramp before the steady window opens."""
PARTS = ("adapter", "worker", "mitmproxy", "nemesis", "server")

SCENARIO = """
description = "bench: {users} SDK clients"
seed = 5
[target]
kind = "reference"
[load]
client = "{client}"
users = {users}
spawn_rate = {rate}
duration = "{duration}s"
hard_timeout = "{hard}s"
workers = {workers}
wait_min = "{wait_min}s"
wait_max = "{wait_max}s"
stall_timeout = "60s"
[load.mix]
read = 3
stream = 1
write = 0
[load.ticker]
count = 3
interval = "20ms"
[reconnect]
budget_qps = {budget}
"""


def proc_stat(pid: int) -> tuple[float, float] | None:
    """(CPU seconds, RSS MiB) of a live process, None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        rss = next(
            int(line.split()[1]) / 1024
            for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if line.startswith("VmRSS:")
        )
    except (OSError, StopIteration, ValueError):
        return None
    return (int(fields[11]) + int(fields[12])) / TICK, rss


def part_of(pid: int) -> str | None:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None
    if "lab.sut.python_sdk" in cmd or "adapter.mjs" in cmd:
        return "adapter"
    if "locust" in cmd and "--worker" in cmd:
        return "worker"
    if "mitmdump" in cmd:
        return "mitmproxy"
    if " serve " in cmd:
        return "server"
    if " nemesis " in cmd:
        return "nemesis"
    return None


def descendants(root: int) -> list[int]:
    """Every process below `root` (by /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            out.append(child)
            todo.append(child)
    return out


class Sampler(threading.Thread):
    """Samples the run's parts every second: peak RSS per part, and each part's CPU (100 % =
    one core) in every second of the steady window (from `steady_from`, epoch s)."""

    def __init__(self, root: int, steady_from: float, steady_to: float) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.window = (steady_from, steady_to)
        self.stop = threading.Event()
        self.rss: dict[str, float] = {}
        self.last: dict[int, float] = {}
        self.cpu: dict[str, list[float]] = {}

    def run(self) -> None:
        while not self.stop.wait(1.0):
            now = time.time()
            total: dict[str, float] = {}
            busy: dict[str, float] = {}
            for pid in descendants(self.root):
                part = part_of(pid)
                stat = proc_stat(pid) if part else None
                if part is None or stat is None:
                    continue
                cpu, rss = stat
                total[part] = total.get(part, 0.0) + rss
                if pid in self.last:
                    busy[part] = busy.get(part, 0.0) + cpu - self.last[pid]
                self.last[pid] = cpu
            for part, rss in total.items():
                self.rss[part] = max(self.rss.get(part, 0.0), rss)
            if self.window[0] <= now <= self.window[1]:
                for part, seconds in busy.items():
                    self.cpu.setdefault(part, []).append(100 * seconds)

    def cpu_by_part(self) -> dict[str, tuple[float, float]]:
        """part -> (mean, peak) CPU % over the steady window's seconds."""
        return {p: (statistics.fmean(v), max(v)) for p, v in self.cpu.items() if v}


def app_figures(run: Path, steady_from: float) -> dict[str, Any]:
    records: list[dict[str, Any]] = []
    for log in sorted(run.glob("clients/app-*.jsonl")):
        records += [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    records.sort(key=lambda r: r["t"])
    up = peak = 0
    for r in records:
        if r["ev"] == "started":
            up += 1
            peak = max(peak, up)
        elif r["ev"] in ("left", "client_failed"):
            up -= 1
    starts = sorted(r["elapsed_s"] for r in records if r["ev"] == "started")
    calls = [r for r in records if r["ev"] == "outcome" and r["t"] >= steady_from]
    ok = sorted(r["elapsed_s"] for r in calls if r["status"] == "ok")
    span = (calls[-1]["t"] - calls[0]["t"]) if len(calls) > 1 else 0.0

    def pct(values: list[float], q: float) -> float | None:
        return values[min(len(values) - 1, int(q * len(values)))] if values else None

    return {
        "peak_clients": peak,
        "start_failed": sum(1 for r in records if r["ev"] == "start_failed"),
        "client_failed": sum(1 for r in records if r["ev"] == "client_failed"),
        "start_p99_s": pct(starts, 0.99),
        "steady_calls": len(calls),
        "calls_per_s": len(calls) / span if span else 0.0,
        "ok_ratio": len(ok) / len(calls) if calls else None,
        "p50_ms": (pct(ok, 0.5) or 0) * 1000 if ok else None,
        "p99_ms": (pct(ok, 0.99) or 0) * 1000 if ok else None,
        "mean_ms": statistics.fmean(ok) * 1000 if ok else None,
    }


def one(client: str, users: int, workers: int, duration: float, period: float, tmp: Path) -> dict[str, Any]:
    ramp = duration / 4
    path = tmp / f"bench-{users}.toml"
    path.write_text(
        SCENARIO.format(
            client=client,
            users=users,
            rate=max(1.0, users / ramp),
            duration=duration,
            hard=duration * 2 + 120,
            workers=workers,
            wait_min=period * 0.5,  # wide, so the users' calls do not fall into step
            wait_max=period * 1.5,
            budget=max(workers, 100),
        )
    )
    out = tmp / f"results-{users}"
    started = time.time()
    # The steady window: from SETTLE_S after the ramp (starting clients is the busy part)
    # to the end of the load; the run's clock starts a few seconds after this process's.
    steady = (started + ramp + SETTLE_S, started + duration)
    proc = subprocess.Popen(
        [LAB, "run", str(path), "--no-report", "--quiet", "--out", str(out)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    sampler = Sampler(proc.pid, *steady)
    sampler.start()
    _, err = proc.communicate(timeout=duration * 2 + 240)
    sampler.stop.set()
    sampler.join()
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    record = json.loads((run / "run.json").read_text())
    steady_from = record["started_at"] + ramp + SETTLE_S
    figures = app_figures(run, steady_from)
    cpu = sampler.cpu_by_part()
    return {
        "users": users,
        "workers": workers,
        "exit": proc.returncode,
        "end_reason": record["end_reason"],
        **figures,
        **{f"rss_{p}_mib": round(sampler.rss.get(p, 0.0), 1) for p in PARTS},
        **{f"cpu_{p}_pct": round(cpu.get(p, (0.0, 0.0))[0], 1) for p in PARTS},
        **{f"cpu_{p}_peak_pct": round(cpu.get(p, (0.0, 0.0))[1], 1) for p in PARTS},
        "load_avg": os.getloadavg()[0],
        "stderr": err.strip()[-300:],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--client", default="python-sdk")
    p.add_argument("--steps", default="100,250,500")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--period", type=float, default=5.0, help="seconds between a client's calls (about)")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-sdk-run-") as tmp:
        for users in (int(s) for s in args.steps.split(",")):
            row = one(args.client, users, args.workers, args.duration, args.period, Path(tmp))
            rows.append(row)
            print(json.dumps(row), flush=True)
    cols = [
        ("users", "users"),
        ("peak_clients", "up"),
        ("start_p99_s", "start p99 s"),
        ("calls_per_s", "calls/s"),
        ("ok_ratio", "ok"),
        ("p50_ms", "p50 ms"),
        ("p99_ms", "p99 ms"),
        ("rss_adapter_mib", "adapter MiB"),
        ("cpu_adapter_pct", "adapter CPU %"),
        ("cpu_worker_pct", "worker CPU %"),
        ("cpu_mitmproxy_pct", "mitmdump CPU %"),
        ("cpu_nemesis_pct", "nemesis CPU %"),
        ("cpu_server_pct", "server CPU %"),
        ("load_avg", "load avg"),
        ("end_reason", "end"),
    ]
    print("| " + " | ".join(c[1] for c in cols) + " |")
    print("|" + " ---: |" * len(cols))
    for r in rows:
        cells = []
        for key, _ in cols:
            v = r.get(key)
            cells.append(f"{v:.2f}" if isinstance(v, float) else str(v))
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
