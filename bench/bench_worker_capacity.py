"""How many concurrent idle MCP clients one Locust worker process holds, and the memory each costs.

    python bench/bench_worker_capacity.py [--clients 4000] [--steps 4]

Starts the reference server, then a process patched by gevent exactly like a Locust
worker (it imports locust) that builds the lab's real clients (ClientCore + SyncDriver +
the worker's SQLite inbox, one shared httpx client), each holding an initialized
session and an open standalone GET stream, in steps; after each step it prints the
process's resident memory and the memory per client added. Prints figures only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAB = str(Path(sys.executable).with_name("lab"))


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def worker(url: str, clients: int, steps: int, tmp: str) -> None:
    """Runs inside a gevent-patched process (like a Locust worker)."""
    import gevent
    from locust.env import Environment

    from lab.client import ReconnectBudget
    from lab.inbox import InboxDatabase
    from lab.load.settings import LoadSettings
    from lab.load.user import McpClient, WorkerContext

    settings = LoadSettings(url=url, run_dir=tmp, reconnect_qps=1000.0)
    db = InboxDatabase(Path(tmp) / "worker.sqlite")
    ctx = WorkerContext(settings, db, ReconnectBudget(1000.0), b"k" * 32, "0")
    env = Environment()
    held: list[McpClient] = []
    base = rss_kib()
    print(f"baseline RSS {base / 1024:.1f} MiB", flush=True)
    per_step = clients // steps
    prev_rss, prev_n = base, 0
    for _ in range(steps):
        t0 = time.perf_counter()
        batch = [McpClient(env, ctx) for _ in range(per_step)]
        jobs = [gevent.spawn(c.connect) for c in batch]
        gevent.joinall(jobs, timeout=120)
        held += batch
        gevent.sleep(1.0)  # let every standalone GET stream open
        db.flush()
        open_streams = sum(1 for c in held if any(k.startswith("get:") for k in c.core.streams))
        rss = rss_kib()
        n = len(held)
        print(
            f"{n:>6} clients ({open_streams:>6} GET streams open) in {time.perf_counter() - t0:5.1f} s: "
            f"RSS {rss / 1024:7.1f} MiB, {(rss - base) / n:6.1f} KiB/client overall, "
            f"{(rss - prev_rss) / (n - prev_n):6.1f} KiB/client this step",
            flush=True,
        )
        prev_rss, prev_n = rss, n
    for c in held:
        c.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=4000)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--worker", nargs=3, metavar=("URL", "CLIENTS", "TMP"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        from gevent import monkey

        monkey.patch_all()
        worker(a.worker[0], int(a.worker[1]), a.steps, a.worker[2])
        return
    tmp = tempfile.mkdtemp(prefix="bench-capacity-")
    env = {**os.environ, "LAB_LEDGER_KEY": "ef" * 32}
    server = subprocess.Popen(
        [LAB, "serve", "--port", "0", "--max-streams", "100000", "--session-ttl", "600"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().split()[-1]
        print(f"server {url}; one worker process, {a.clients} idle clients in {a.steps} steps", flush=True)
        subprocess.run(
            [sys.executable, __file__, "--steps", str(a.steps), "--worker", url, str(a.clients), tmp],
            check=False,
            env=env,
            timeout=900,
        )
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
