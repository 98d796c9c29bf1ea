"""mitmdump's CPU per SSE event with the lab's addons, before and after a change, side by side.

    .venv/bin/python bench/bench_tap_cost.py [--base c0ebd26] [--rounds 5]
                                             [--clients 100] [--events 200] [--interval-ms 5]
                                             [--short-clients 400] [--short-events 10]

One upstream, bench/raw_sse_server.py (a minimal SSE server: the proxy is what is
measured), and five mitmdump processes in front of it, each started as `lab run` starts
it (lab.faults.launch): `noop` (addons/mcp_noop.py, a pass-through), `old` and `new`
with addons/mcp_faults.py and the tap on, first with an empty plan (a no-fault gate
run), then with the release gate's SSE event faults (scenarios/gate-100k.toml's
drop_priming, cross_ids, replay_after_ack, inject_foreign, cut_stream at their rates).
`old` is the addons and `lab/` of `--base` (a commit, exported with `git archive` into a
temporary folder and put first on that mitmdump's PYTHONPATH), `new` is this tree.

The load client (bench/sse_load.py) drives every proxy in turn, in an order rotated each
round, in two shapes: long paced streams (`--clients` sessions x `--events` events
`--interval-ms` apart) and short calls (`--short-clients` x `--short-events`: the
per-flow work weighs more). For each proxy it prints the CPU it used (utime + stime from
/proc) per event the upstream sent (the tap's `sent` records; the planned count for the
pass-through), in µs, per round and the median. Machines are noisy:
read the medians, and compare sides within one run only. Asserts nothing.
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
from _labrun import export_tree
from bench_proxy import cpu_seconds, load, start, stop

from lab.faults.launch import ADDONS, mitmdump_argv, ready_prefix

ROOT = Path(__file__).resolve().parents[1]

GATE_EVENT_FAULTS = [
    {"kind": "drop_priming", "rate": 0.02},
    {"kind": "cross_ids", "rate": 0.002, "match": {"streams": ["post", "resume"]}},
    {"kind": "replay_after_ack", "rate": 0.002},
    {"kind": "inject_foreign", "rate": 0.002},
    {"kind": "cut_stream", "rate": 0.001},
]
"""The SSE event faults of scenarios/gate-100k.toml (its request faults left out: against the
raw upstream most cannot apply, and they would change which flows carry events)."""


def proxy(
    upstream: str, addons: Path, script: str, log: Path, options: dict[str, str], pythonpath: Path | None
) -> tuple[subprocess.Popen[bytes], str]:
    path = addons / script
    env_before = os.environ.get("PYTHONPATH")
    if pythonpath is not None:  # the old tree's `lab` first (cwd is not on a console script's path)
        os.environ["PYTHONPATH"] = str(pythonpath)
    try:
        return start(mitmdump_argv(upstream, script=path, options=options), ready_prefix(path), log)
    finally:
        if env_before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = env_before


class SentCounter:
    """The `sent` records a tap gained since the last look (the events the upstream sent
    through that proxy: a cut stream sends fewer than planned)."""

    def __init__(self, tap: Path | None) -> None:
        self.tap, self.offset = tap, 0

    def __call__(self) -> int | None:
        if self.tap is None or not self.tap.exists():
            return None
        with self.tap.open("rb") as f:
            f.seek(self.offset)
            text = f.read()
        self.offset += len(text)
        return text.count(b'"type":"sent"')


def measure(
    sides: dict[str, tuple[str, int, SentCounter]],
    title: str,
    clients: int,
    events: int,
    interval_ms: int,
    rounds: int,
) -> dict[str, float]:
    """Every side once per round, the order rotated; µs of its CPU per event sent. Medians."""
    planned = clients * (events + 1)  # the raw upstream sends count + 1 events per call
    print(f"\n{title}: {clients} sessions x {events + 1} events, {interval_ms} ms apart, {rounds} rounds")
    names = list(sides)
    print(f"{'round':<6}" + "".join(f"{n:>13}" for n in names) + "   (µs of mitmdump CPU per event)")
    per: dict[str, list[float]] = {n: [] for n in names}
    for i in range(rounds):
        order = names[i % len(names) :] + names[: i % len(names)]
        failed = 0
        for name in order:
            url, pid, counter = sides[name]
            counter()
            before = cpu_seconds(pid)
            r = load(url, clients, events, interval_ms)
            used = cpu_seconds(pid) - before
            sent = counter() or planned
            per[name].append(used * 1e6 / sent)
            failed += r.failed
        print(f"{i + 1:<6}" + "".join(f"{per[n][-1]:>13.1f}" for n in names) + f"   failed {failed}")
    med = {n: statistics.median(v) for n, v in per.items()}
    print(f"{'median':<6}" + "".join(f"{med[n]:>13.1f}" for n in names))
    for plan in ("empty", "faults"):
        o, n = med.get(f"old-{plan}"), med.get(f"new-{plan}")
        if o and n:
            print(f"  {plan} plan: new/old = {n / o:.2f}; new/noop = {n / med['noop']:.2f}")
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--base", default="c0ebd26", help="the commit whose addons are `old`")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--events", type=int, default=200)
    ap.add_argument("--interval-ms", type=int, default=5)
    ap.add_argument("--short-clients", type=int, default=400, help="short-call shape (0: skip it)")
    ap.add_argument("--short-events", type=int, default=10)
    ap.add_argument("--no-faults", action="store_true", help="only the empty plan")
    a = ap.parse_args()
    import mitmproxy.version

    with tempfile.TemporaryDirectory(prefix="bench-tap-") as tmp_s:
        tmp = Path(tmp_s)
        old = export_tree(a.base, tmp / "old", "lab", "addons")
        plans = {"empty": {"seed": 1, "rules": []}, "faults": {"seed": 1, "rules": GATE_EVENT_FAULTS}}
        if a.no_faults:
            del plans["faults"]
        procs: list[subprocess.Popen[bytes]] = []
        try:
            up, up_url = start(
                [sys.executable, str(ROOT / "bench" / "raw_sse_server.py")],
                "raw-sse listening on ",
                tmp / "up.log",
            )
            procs.append(up)
            upstream = up_url.rsplit("/", 1)[0]
            sides: dict[str, tuple[str, int, SentCounter]] = {}
            p, url = proxy(upstream, ADDONS, "mcp_noop.py", tmp / "noop.log", {}, None)
            procs.append(p)
            sides["noop"] = (url + "/mcp", p.pid, SentCounter(None))
            for plan_name, plan in plans.items():
                plan_file = tmp / f"plan-{plan_name}.json"
                plan_file.write_text(json.dumps(plan))
                for side, addons, path in (("old", old / "addons", old), ("new", ADDONS, None)):
                    name = f"{side}-{plan_name}"
                    tap = tmp / name / "tap.jsonl"
                    opts = {"mcpfaults_plan": str(plan_file), "mcpfaults_tap": str(tap)}
                    p, url = proxy(upstream, addons, "mcp_faults.py", tmp / f"{name}.log", opts, path)
                    procs.append(p)
                    sides[name] = (url + "/mcp", p.pid, SentCounter(tap))
            print(
                f"mitmdump {mitmproxy.version.VERSION}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; "
                f"old = {a.base}, new = this tree; tap on"
            )
            for url, _, _ in sides.values():  # warm-up, not measured
                load(url, 20, 50)
            measure(sides, "long paced streams", a.clients, a.events, a.interval_ms, a.rounds)
            if a.short_clients:
                measure(sides, "short calls", a.short_clients, a.short_events, 0, a.rounds)
            for name in sides:
                tap = tmp / name / "tap.jsonl"
                if tap.exists():
                    size = tap.stat().st_size
                    with tap.open("rb") as f:
                        lines = sum(1 for _ in f)
                    print(f"tap of {name}: {lines:,} lines, {size / 1e6:.1f} MB")
        finally:
            for p in reversed(procs):
                stop(p)


if __name__ == "__main__":
    main()
