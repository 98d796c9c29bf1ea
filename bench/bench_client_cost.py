"""CPU per SSE event of the lab's own clients as a Locust worker runs them, without the
network: ClientCore + SyncDriver's per-chunk path + one InboxDatabase, under gevent's
monkey patching, for this tree's `lab` and (with `--before REV`) that revision's, side by
side in one run.

    .venv/bin/python bench/bench_client_cost.py [--before REV] [--clients 200] [--events 200]
                                                [--rounds 5] [--core-only]
    .venv/bin/python bench/bench_client_cost.py --resolve 20000 [--rounds 5]

Each client does its handshake with the in-memory model server (tests/client/model_server)
and opens its standalone GET stream; then every client gets `--events` notifications on
it, one event per chunk (as a ticker's events arrive), interleaved across clients as on a
busy worker, each fed the way `SyncDriver._run` feeds a chunk it read (`_feed` under the
driver's lock, then `_signal`: the waiters' event, the core's next wake-up, the process
clock), with the worker's flush every 1,000 events and at the end. `--core-only` feeds
`core.response_data` directly instead (no driver).

With `--before REV`, REV's `lab/` is taken out with `git archive` into a temporary folder
and each round runs both, alternated, each in a process of its own (the other tree's
`lab` first on sys.path). Measured: process CPU time of the feeding loop and the flushes
only (not the handshakes), divided by the events. Prints µs per event, medians of the
rounds, and the ratio; asserts nothing. `--resolve N` measures instead the lookup every
connect makes (gevent's thread-pool resolver against lab.load.resolver's), in this process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _labrun import ROOT, export_tree


def measure(clients: int, events: int, core_only: bool, folder: Path) -> float:
    """In this process (gevent patched first): µs of CPU per event."""
    import gevent.monkey

    gevent.monkey.patch_all()
    import random
    import time

    import httpx

    from lab.client import BackoffPolicy, ClientConfig, ClientCore, Purpose, ReconnectBudget
    from lab.drivers.sync import SyncDriver
    from lab.inbox import InboxDatabase
    from lab.wire.redact import Redactor
    from tests.client.model_server import Link, ModelServer

    db = InboxDatabase(folder / "worker.sqlite")
    server = ModelServer()
    budget = ReconnectBudget(1000.0)
    http = httpx.Client()
    feeds = []
    for i in range(clients):
        cid = f"c{i}"
        core = ClientCore(
            ClientConfig(client_id=cid, backoff=BackoffPolicy(0.05, 0.5)),
            inbox=db.inbox(cid),
            budget=budget,
            redactor=Redactor(b"b" * 32),
            rng=random.Random(i),
        )
        link = Link(core, server)
        link.now = time.time()
        known = set(server.sessions)
        link.run(core.connect(link.now))
        link.settle()
        (conn_id,) = link.conns(Purpose.STANDALONE)
        (sid,) = set(server.sessions) - known
        chunks = [chunk for _ in range(events) for _, chunk in server.push_notification(sid)]
        driver = SyncDriver(core, "http://127.0.0.1:1/mcp", http, on_records=db.record)
        driver._timer_started = True  # as after its first call: every signal asks the clock
        feeds.append((core, driver, conn_id, chunks))
    db.flush()
    n = 0
    started = time.process_time()
    for e in range(events):
        for core, driver, conn_id, chunks in feeds:
            if core_only:
                core.response_data(conn_id, chunks[e], time.time())
            else:
                with driver._lock:
                    assert driver._feed(core.response_data, conn_id, chunks[e])
            n += 1
            if n % 1000 == 0:
                db.flush()
    db.flush()
    spent = time.process_time() - started
    accepted = db.commits
    db.close()
    assert accepted >= n, f"{accepted} of {n} events accepted"
    return spent / n * 1e6


def measure_resolve(lookups: int, rounds: int) -> None:
    """CPU per `getaddrinfo("127.0.0.1")` under gevent, as every connect does it: gevent's
    thread resolver (before) against lab.load.resolver's (after), alternated."""
    import gevent.monkey

    gevent.monkey.patch_all()
    import socket
    import time

    import gevent
    from gevent.resolver.thread import Resolver as ThreadResolver

    from lab.load.resolver import NumericFirstResolver

    hub = gevent.get_hub()
    kinds = {"thread pool (before)": ThreadResolver, "numeric first (after)": NumericFirstResolver}
    results: dict[str, list[float]] = {name: [] for name in kinds}
    for _ in range(rounds):
        for name, kind in kinds.items():
            hub.resolver = kind(hub=hub)
            started = time.process_time()
            for _ in range(lookups):
                socket.getaddrinfo("127.0.0.1", 8080, 0, socket.SOCK_STREAM)
            results[name].append((time.process_time() - started) / lookups * 1e6)
    print(f"getaddrinfo('127.0.0.1') under gevent, {lookups} lookups, {rounds} rounds (median of rounds)")
    for name, values in results.items():
        print(f"  {name:24s} {statistics.median(values):7.1f} µs CPU per lookup")


def _child(tree: Path | None, args: argparse.Namespace) -> float:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree)] if tree is not None else []) + os.pathsep + str(ROOT)
    argv = [sys.executable, __file__, "--child", "--clients", str(args.clients), "--events", str(args.events)]
    if args.core_only:
        argv.append("--core-only")
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"bench child failed ({tree or 'this tree'}):\n{out.stderr}")
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    expected = (tree or ROOT) / "lab"
    if Path(answer["lab"]).parent != expected:  # the measured code must be the tree's
        raise SystemExit(f"the child imported {answer['lab']}, not {expected}")
    return float(answer["us_per_event"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", metavar="REV", help="also measure this git revision's lab/, alternated")
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--events", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--core-only", action="store_true", help="feed the core directly, no driver")
    ap.add_argument("--resolve", type=int, metavar="N", help="only: N lookups of 127.0.0.1, both resolvers")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.resolve:
        measure_resolve(args.resolve, args.rounds)
        return
    if args.child:
        with tempfile.TemporaryDirectory() as tmp:
            us = measure(args.clients, args.events, args.core_only, Path(tmp))
        import lab

        print(json.dumps({"us_per_event": us, "lab": lab.__file__}))
        return
    with tempfile.TemporaryDirectory() as tmp:
        trees: dict[str, Path | None] = {}
        if args.before:
            trees[f"before ({args.before})"] = export_tree(args.before, Path(tmp), "lab")
        trees["after (this tree)"] = None
        results: dict[str, list[float]] = {name: [] for name in trees}
        for _ in range(args.rounds):
            for name, tree in trees.items():  # alternated: a noisy moment hits both
                results[name].append(_child(tree, args))
    what = "core only" if args.core_only else "core + SyncDriver per-chunk path + InboxDatabase, gevent"
    print(f"{what}: {args.clients} clients x {args.events} events, {args.rounds} rounds (median of rounds)")
    medians = {k: statistics.median(v) for k, v in results.items()}
    first = next(iter(medians.values()))
    for name, value in medians.items():
        rounds = ", ".join(f"{x:.1f}" for x in results[name])
        print(f"  {name:24s} {value:7.1f} µs CPU per event ({value / first:.2f})   rounds: {rounds}")


if __name__ == "__main__":
    main()
