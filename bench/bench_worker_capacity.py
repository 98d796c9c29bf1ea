"""How many concurrent idle MCP clients one Locust worker process holds, and what each costs.

    python bench/bench_worker_capacity.py [--clients 4000] [--steps 4] [--users] [--trace]

Starts the reference server, then a process patched by gevent exactly like a Locust
worker (it imports locust) that builds the lab's real clients the way `McpUser` does
(`McpClient`: ClientCore + SyncDriver + the worker's SQLite inbox), each holding an
initialized session and an open standalone GET stream, in steps. After each step and a
settling time (`--settle`, longer than the driver's keep-alive, so that idle POST
connections are closed) it prints the process's resident memory, the memory per client
overall (above the baseline: the process with its first client built and stopped) and
for the step, the process's open sockets per client (each is one TCP connection; every
proxy in the chain spends two file descriptors on it) and the process's CPU over the
next 2 s, all clients idle (100 % = one core).

`--users` builds each client the way a Locust worker does, inside a real Locust user
(`McpUser`, connecting in `on_start`, then waiting): the figures then include what
Locust itself spends per user (its greenlet, ~10 KiB), which the lab cannot change.

`--trace` also runs tracemalloc and prints, at the end, the ten allocation sites that
grew most between the first and the last step, per client added (Python's allocators
only: SQLite, libev and the frame stacks of greenlets do not show; tracemalloc itself
slows the build down and inflates RSS, so read RSS from a run without it).
Prints figures only.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAB = str(Path(sys.executable).with_name("lab"))


IDLE_WINDOW = 2.0
"""Seconds, after the settling time, over which the process's CPU is measured."""


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def short_path(filename: str) -> str:
    for marker in ("site-packages/", "python3.12/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return "lab/" + filename.split("/lab/", 1)[1] if "/lab/" in filename else filename


def open_sockets() -> int:
    """The process's open sockets (TCP connections here; SQLite and the hub use none)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                n += 1
        except OSError:
            pass  # closed while we looked
    return n


def worker(url: str, clients: int, steps: int, tmp: str, a: argparse.Namespace) -> None:
    """Runs inside a gevent-patched process (like a Locust worker)."""
    import gevent
    from locust import constant, task
    from locust.env import Environment

    from lab.client import ReconnectBudget
    from lab.inbox import InboxDatabase
    from lab.load import user as load_user
    from lab.load.settings import LoadSettings
    from lab.load.user import McpClient, McpUser, WorkerContext

    settings = LoadSettings(url=url, run_dir=tmp, reconnect_qps=1000.0)
    db = InboxDatabase(Path(tmp) / "worker.sqlite")
    ctx = WorkerContext(settings, db, ReconnectBudget(1000.0), b"k" * 32, "0")
    load_user.WORKER.append(ctx)

    class IdleUser(McpUser):
        """A user that connects (on_start) and then waits: a mostly idle client."""

        wait_time = constant(3600)

        @task
        def idle(self) -> None:
            pass

    env = Environment(user_classes=[IdleUser])
    runner = env.create_local_runner() if a.users else None
    logging.getLogger("locust").setLevel(logging.ERROR)  # "spawn rate is very high"
    # The first client imports what every client uses (httpcore and its backends, h11, ...)
    # and warms SQLite: ~7 MiB a worker pays once. The baseline is taken after it.
    warm = McpClient(env, ctx)
    warm.connect()
    warm.stop()
    gevent.sleep(0.5)  # its sockets close on the loop's next turns
    if a.trace:
        tracemalloc.start(1)
    first: tracemalloc.Snapshot | None = None
    base, base_socks = rss_kib(), open_sockets()
    what = "Locust users" if a.users else "clients"
    print(f"baseline RSS {base / 1024:.1f} MiB, {base_socks} sockets; {what}:", flush=True)
    per_step = clients // steps
    prev_rss, prev_n = base, 0
    print(
        f"{'clients':>7} {'GET open':>8} {'build s':>7} {'RSS MiB':>8} {'KiB/client':>10} "
        f"{'KiB/client step':>15} {'sockets':>7} {'sockets/client':>14} {'idle CPU':>8}",
        flush=True,
    )
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        n = per_step * step
        if runner is not None:
            runner.start(n, spawn_rate=max(1, per_step // 2))
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and sum(c.sessions > 0 for c in ctx.clients.values()) < n:
                gevent.sleep(0.1)
        else:
            batch = [McpClient(env, ctx) for _ in range(per_step)]
            gevent.joinall([gevent.spawn(c.connect) for c in batch], timeout=120)
        built = time.perf_counter() - t0
        gevent.sleep(a.settle)  # every standalone GET opens; idle kept-alive POST connections close
        cpu0, wall0 = time.process_time(), time.perf_counter()
        gevent.sleep(IDLE_WINDOW)
        idle_cpu = (time.process_time() - cpu0) / (time.perf_counter() - wall0) * 100
        db.flush()
        open_streams = sum(any(k.startswith("get:") for k in c.core.streams) for c in ctx.clients.values())
        rss, socks = rss_kib(), open_sockets() - base_socks
        print(
            f"{n:>7} {open_streams:>8} {built:>7.1f} {rss / 1024:>8.1f} {(rss - base) / n:>10.1f} "
            f"{(rss - prev_rss) / (n - prev_n):>15.1f} {socks:>7} {socks / n:>14.2f} {idle_cpu:>7.0f}%",
            flush=True,
        )
        prev_rss, prev_n = rss, n
        if a.trace and step == 1:
            first = tracemalloc.take_snapshot()
    if first is not None:
        added = per_step * (steps - 1)
        diff = tracemalloc.take_snapshot().compare_to(first, "lineno")
        total = sum(d.size_diff for d in diff)
        print(
            f"\ntracemalloc: {total / 1024 / added:.1f} KiB/client traced between {per_step} and "
            f"{per_step * steps} clients; top 10 allocation sites:",
            flush=True,
        )
        for d in diff[:10]:
            frame = d.traceback[0]
            print(
                f"  {d.size_diff / added:8.0f} B/client {d.count_diff / added:6.1f} blocks  "
                f"{short_path(frame.filename)}:{frame.lineno}"
            )
    ctx.stop_all()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=4000)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--trace", action="store_true", help="tracemalloc's top 10 allocation sites")
    ap.add_argument(
        "--users", action="store_true", help="each client inside a real Locust user (a worker's whole cost)"
    )
    ap.add_argument(
        "--settle",
        type=float,
        default=4.0,
        help="seconds after each step before measuring (idle POST connections may close)",
    )
    ap.add_argument("--worker", nargs=3, metavar=("URL", "CLIENTS", "TMP"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        from gevent import monkey

        monkey.patch_all()
        worker(a.worker[0], int(a.worker[1]), a.steps, a.worker[2], a)
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
        flags = ["--steps", str(a.steps), "--settle", str(a.settle)]
        flags += ["--trace"] * a.trace + ["--users"] * a.users
        subprocess.run(
            [sys.executable, __file__, *flags, "--worker", url, str(a.clients), tmp],
            check=False,
            env=env,
            timeout=900,
        )
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
