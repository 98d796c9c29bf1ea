"""How many concurrent, mostly idle clients the whole chain holds — Locust workers ->
nemesis -> mitmdump with the addon -> reference server — stepping the client count up,
and which hop stops answering first.

    python bench/bench_chain_steps.py [--steps 1000,2000,4000,6000,8000,10000]
                                      [--spawn-rate 50] [--hold 30] [--wait-min 30] [--wait-max 90]
                                      [--workers N] [--keep-going] [--keep]
    python bench/bench_chain_steps.py --from RUN_DIR [RUN_DIR ...]   # figures of finished runs

For each step of N clients it writes a scenario of scenarios/clients-2000.toml's shape
(its task mix, ticker, reconnect budget; standalone GET streams, no faults) with
`users = N`, `spawn_rate`, `duration = N / spawn_rate + hold`, `wait_min`/`wait_max`,
`workers` (default ceil(N / 2500), at most 4), `max_streams` >= 2 N, and runs
`lab run --no-report --quiet` on it. While it runs, a thread reads /proc/net/tcp (and
tcp6) every 2 s and counts the ESTABLISHED connections each hop accepted on its listening
port (the ports come from the run folder once the parts are up). After each step it
prints, from the run folder:
- per process (processes.jsonl): CPU mean and max (cores), peak RSS, peak fds, its fd
  limit, and for each worker its clients and RSS per client (KiB: peak RSS above the
  worker's RSS before its first client, divided by its clients);
- per hop: peak connections (and handshakes not yet accepted), the box's TIME_WAIT peak
  and its listen-queue overflows during the step;
- the requests: sent by the clients, seen by the proxy (tap `flow` records), answered
  by the server, unanswered (no status), the loss on each segment of the chain (requests
  followed by their x-lab-conn, bench/_chain_figures.py), and the p99 latency of the
  answered ones at the proxy and of the calls at the clients;
- the run's exit code, end reason and wall time.
Then one row per step, and the first segment to stop answering: the first step where a
segment lost more than 1 % (and at least 10) of the requests entering it, nearest the
clients of those that did. It stops after a step where more than 20 % of the requests
sent got no answer at the client, unless `--keep-going`. With `--keep` the run folders
stay (their path is printed; the connection figures are saved in each as
bench-chain-connections.json, so `--from` shows them too). Prints figures only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _chain_figures import (
    LOSS_MIN,
    LOSS_SHARE,
    SEGMENTS,
    Process,
    Requests,
    count_tcp,
    first_to_stop,
    listen_drops,
    processes,
    read_clients,
    read_flows,
    read_server_answered,
    requests,
)
from _labrun import HOPS, ROOT, listening, run_folder, start_run

TEMPLATE = ROOT / "scenarios" / "clients-2000.toml"
DEFAULT_STEPS = "1000,2000,4000,6000,8000,10000"
SAMPLE_S = 2.0
STOP_SHARE = 0.20
"""A step where more than this share of the requests sent got no answer ends the stepping."""
CONNECTIONS_FILE = "bench-chain-connections.json"
TCP_FILES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


# ------------------------------------------------------------------ the scenario of a step


def workers_for(users: int) -> int:
    return max(1, min(4, math.ceil(users / 2500)))


def step_scenario(template: dict[str, Any], users: int, args: argparse.Namespace) -> dict[str, Any]:
    """The template scenario with this step's clients and timing; no faults, toxics or phases."""
    doc: dict[str, Any] = json.loads(json.dumps(template))  # a deep copy of plain TOML values
    for key in ("faults", "toxics", "phases", "expected_failures"):
        doc.pop(key, None)
    duration = math.ceil(users / args.spawn_rate + args.hold)
    workers = args.workers or workers_for(users)
    doc["description"] = (
        f"Chain steps bench: {users} mostly idle clients on {workers} worker{'s' * (workers > 1)}, "
        f"{duration} s (spawn {args.spawn_rate:g}/s, hold {args.hold:g} s), no faults"
    )
    target = doc.setdefault("target", {})
    target["max_streams"] = max(int(target.get("max_streams", 0)), 2 * users)
    load = doc.setdefault("load", {})
    load.pop("event_target", None)
    load.update(
        users=users,
        spawn_rate=float(args.spawn_rate),
        duration=f"{duration}s",
        hard_timeout=f"{2 * duration + 120}s",
        workers=min(workers, users),
        wait_min=f"{args.wait_min:g}s",
        wait_max=f"{args.wait_max:g}s",
        open_standalone=True,
        # A client idle for up to wait_max sends nothing, and the reference server sends
        # nothing unasked on a standalone stream: the lab would end a healthy step of idle
        # clients as "traffic stalled" after its default 20 s.
        stall_timeout=f"{max(20.0, args.wait_max + 30):g}s",
    )
    return doc


def dump_toml(doc: dict[str, Any], prefix: str = "") -> str:
    """The subset of TOML a scenario without faults uses: scalars, lists of scalars, tables."""
    lines, tables = [], []
    for key, value in doc.items():
        if isinstance(value, dict):
            tables.append((key, value))
        else:
            lines.append(f"{key} = {_toml_value(value, f'{prefix}{key}')}")
    out = "\n".join(lines) + ("\n" if lines else "")
    for key, value in tables:
        out += f"\n[{prefix}{key}]\n" + dump_toml(value, f"{prefix}{key}.")
    return out


def _toml_value(value: object, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return json.dumps(value)  # TOML's numbers and basic strings read JSON's
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v, where) for v in value) + "]"
    raise SystemExit(f"{TEMPLATE}: {where}: cannot write a {type(value).__name__} back as TOML")


# ------------------------------------------------------------------ watching a running step


@dataclass(slots=True)
class Connections:
    """Peaks of the /proc/net/tcp samples of one step (bench-chain-connections.json)."""

    samples: int = 0
    ports: dict[str, int] = field(default_factory=dict)
    established: dict[str, int] = field(default_factory=dict)
    syn_recv: dict[str, int] = field(default_factory=dict)
    time_wait: int = 0
    listen_drops: dict[str, int] = field(default_factory=dict)
    fd_limits: dict[str, int] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}

    @classmethod
    def read(cls, folder: Path) -> Connections | None:
        try:
            data = json.loads((folder / CONNECTIONS_FILE).read_text(encoding="utf-8"))
            return cls(**{k: data[k] for k in cls.__slots__ if k in data})
        except (OSError, ValueError, TypeError):
            return None


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def fd_limit(pid: int) -> int | None:
    """The soft `Max open files` of a running process (/proc/<pid>/limits)."""
    for line in _read(Path(f"/proc/{pid}/limits")).splitlines():
        if line.startswith("Max open files"):
            soft = line.split()[3]
            return int(soft) if soft.isdigit() else None
    return None


def watch(out: Path, proc: subprocess.Popen[bytes], deadline: float, conns: Connections) -> None:
    """Every SAMPLE_S while `lab run` runs (and at most until `deadline`, monotonic): the
    connections each hop holds, once its port is known."""
    first_drops: dict[str, int] | None = None
    while proc.poll() is None and time.monotonic() < deadline:
        folder = run_folder(out)
        if folder is not None and len(conns.ports) < len(HOPS):
            conns.ports = {hop: port for hop, (_, port) in listening(folder).items()}
        if folder is not None and not conns.fd_limits and len(conns.ports) == len(HOPS):
            _fd_limits(folder, conns)
        if conns.ports:
            c = count_tcp((_read(p) for p in TCP_FILES), conns.ports)
            conns.samples += 1
            for hop, n in c.established.items():
                conns.established[hop] = max(conns.established.get(hop, 0), n)
            for hop, n in c.syn_recv.items():
                conns.syn_recv[hop] = max(conns.syn_recv.get(hop, 0), n)
            conns.time_wait = max(conns.time_wait, c.time_wait)
            drops = listen_drops(_read(Path("/proc/net/netstat")))
            first_drops = drops if first_drops is None else first_drops
            conns.listen_drops = {k: v - first_drops.get(k, v) for k, v in drops.items()}
        time.sleep(SAMPLE_S)


def _fd_limits(folder: Path, conns: Connections) -> None:
    try:
        run = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    for p in run.get("processes") or []:
        if isinstance(p, dict) and isinstance(p.get("pid"), int) and isinstance(p.get("name"), str):
            limit = fd_limit(p["pid"])
            if limit is not None:
                conns.fd_limits[p["name"]] = limit


def run_step(users: int, args: argparse.Namespace, tmp: Path, template: dict[str, Any]) -> Step:
    doc = step_scenario(template, users, args)
    scenario = tmp / f"chain-steps-{users}.toml"
    scenario.write_text(
        f"# bench/bench_chain_steps.py: {TEMPLATE.name}'s shape, {users} clients\n" + dump_toml(doc),
        encoding="utf-8",
    )
    out = tmp / f"step-{users}"
    hard = 2 * math.ceil(users / args.spawn_rate + args.hold) + 120
    deadline = time.monotonic() + hard + 180  # lab run stops itself at its hard timeout
    conns = Connections()
    t0 = time.monotonic()
    proc = start_run(scenario, out, report=False)
    watcher = threading.Thread(target=watch, args=(out, proc, deadline, conns), daemon=True)
    watcher.start()
    try:
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        print(f"lab run (pid {proc.pid}) outlived its hard timeout by 180 s: stopping it", flush=True)
        proc.terminate()
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
    wall = time.monotonic() - t0
    watcher.join(timeout=SAMPLE_S + 5)
    folder = run_folder(out)
    if folder is None:
        raise SystemExit(f"lab run exited {code} without making a run folder under {out}")
    with contextlib.suppress(OSError):
        (folder / CONNECTIONS_FILE).write_text(json.dumps(conns.as_json()), encoding="utf-8")
    return measure(folder, wall=wall, code=code, conns=conns)


# ------------------------------------------------------------------ the figures of a step


@dataclass(slots=True)
class Step:
    folder: Path
    users: int
    workers: int
    wall: float | None
    code: int | None
    end_reason: str
    verdict: str | None
    load_s: float | None
    """seconds from the run's start to the planned end of its load (None: not planned)."""
    requests: Requests
    """the requests the clients started during the load."""
    at_stop: Requests
    """the requests they started after it: the clients leaving (their DELETEs)."""
    processes: list[Process]
    cpus: int | None
    conns: Connections | None


def measure(
    folder: Path, *, wall: float | None = None, code: int | None = None, conns: Connections | None = None
) -> Step:
    run = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    load = ((run.get("scenario") or {}).get("load")) or {}
    report: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        report = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    if wall is None and isinstance(run.get("started_at"), float) and isinstance(run.get("stopped_at"), float):
        wall = run["stopped_at"] - run["started_at"]
    clients = read_clients(folder)
    procs, cpus = processes(folder, clients)
    flows = read_flows(folder / "proxy" / "tap.jsonl")
    server = read_server_answered(folder)
    start, duration, stop = run.get("started_at"), load.get("duration"), run.get("stopped_at")
    end = None
    if isinstance(start, float) and isinstance(duration, int | float):
        end = start + duration if not isinstance(stop, float) else min(start + duration, stop)
    return Step(
        folder=folder,
        users=int(load.get("users") or 0),
        workers=int(load.get("workers") or 0),
        wall=wall,
        code=code,
        end_reason=str(run.get("end_reason") or run.get("status") or "?"),
        verdict=report.get("verdict"),
        load_s=None if end is None else end - start,
        requests=requests(clients, flows, server, end=end),
        at_stop=requests(clients, flows, server, start=end) if end is not None else Requests(),
        processes=procs,
        cpus=cpus,
        conns=conns if conns is not None else Connections.read(folder),
    )


def secs(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} s" if value >= 1 else f"{value * 1000:.0f} ms"


def pct(n: int, d: int) -> str:
    return f"{100 * n / d:.1f} %" if d else "—"


def show_step(s: Step) -> None:
    r = s.requests
    print(f"\n== {s.users} clients, {s.workers} worker{'s' * (s.workers != 1)}: {s.folder}")
    exit_ = "—" if s.code is None else str(s.code)
    verdict = f", verdict {s.verdict}" if s.verdict else ""
    print(f"exit {exit_}, end {s.end_reason}{verdict}, wall {secs(s.wall)}")
    print(
        f"{'process':<20} {'CPU mean':>8} {'max':>5} {'RSS MiB':>8} {'fds':>6} {'fd limit':>9} {'clients':>8} {'KiB/client':>10}"
    )
    limits = s.conns.fd_limits if s.conns else {}
    for p in s.processes:
        rss = "—" if p.rss_max is None else f"{p.rss_max / 2**20:.0f}"
        per = p.kib_per_client
        print(
            f"{p.part:<20} {_num(p.cpu_mean):>8} {_num(p.cpu_max):>5} {rss:>8} {_num(p.fds_max, 0):>6} "
            f"{limits.get(p.part, '—')!s:>9} {'—' if p.clients is None else p.clients:>8} "
            f"{'—' if per is None else f'{per:.1f}':>10}"
        )
    if s.conns is None or not s.conns.samples:
        print("connections: not sampled (a finished run without bench-chain-connections.json)")
    else:
        c = s.conns
        hops = ", ".join(
            f"{h} {c.established.get(h, '—')} (+{c.syn_recv.get(h, 0)} not accepted)" for h in HOPS
        )
        drops = ", ".join(f"{k} {v}" for k, v in sorted(c.listen_drops.items())) or "—"
        print(f"peak connections accepted per hop: {hops}; {c.samples} samples")
        print(f"box: TIME_WAIT peak {c.time_wait}; during the step {drops}")
    planned = "" if s.load_s is None else f" (started in the first {s.load_s:.0f} s, the planned load)"
    print(
        f"requests{planned}: sent {r.sent}, seen by the proxy {r.seen}, answered by the server "
        f"{r.answered}, unanswered {r.unanswered} ({pct(r.unanswered, r.seen)} of seen; {r.late} of "
        "them reached the proxy after their client had given up)"
        + (f", answered by the proxy {r.by_proxy}" if r.by_proxy else "")
    )
    print(
        f"  no answer at the client: {r.no_answer_at_client} ({pct(r.no_answer_at_client, r.sent)} of sent)"
    )
    stop = s.at_stop
    print(f"  {'segment':<17} {'lost':>7} {'of':>7} {'share':>7}   after it, clients leaving: lost of share")
    for seg in SEGMENTS:
        if seg == "server -> proxy" and not r.server_ledger:
            print(f"  {seg:<17} — (no server ledger: its losses count under proxy -> server)")
            continue
        print(
            f"  {seg:<17} {r.lost[seg]:>7} {r.entered[seg]:>7} {pct(r.lost[seg], r.entered[seg]):>7}   "
            f"{stop.lost[seg]:>7} {stop.entered[seg]:>7} {pct(stop.lost[seg], stop.entered[seg]):>7}"
        )
    calls = ", ".join(f"{k} {n}" for k, n in sorted(r.calls.items())) or "none"
    print(f"  clients {r.clients} sent a request, {r.with_session} got a session; calls: {calls}")
    print(
        f"  p99: client to proxy {secs(r.to_proxy_p99_s)}, answered at the proxy {secs(r.proxy_p99_s)} "
        f"(request in to answer out), calls at the clients {secs(r.client_p99_s)}"
    )
    if stop.sent:
        print(
            f"  after the load: sent {stop.sent}, seen {stop.seen}, answered {stop.answered}, "
            f"unanswered {stop.unanswered}, no answer at the client {stop.no_answer_at_client}"
        )


def _num(value: float | int | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def show_table(steps: list[Step]) -> None:
    print("\n== steps")
    head = (
        f"{'clients':>7} {'wkrs':>4} {'exit':>4} {'wall s':>7} {'sessions':>8} {'sent':>7} {'seen':>7} "
        f"{'answered':>8} {'unansw':>7} {'no ans %':>8} {'to proxy':>9} {'proxy p99':>9} {'call p99':>9} "
        f"{'conns nem/mitm/srv':>20} {'busiest process':>22} {'KiB/client':>10} {'leaving: no ans':>15}"
    )
    print(head)
    for s in steps:
        r = s.requests
        c = s.conns
        conns = "/".join(str(c.established.get(h, "—")) for h in HOPS) if c and c.samples else "—"
        busiest = max(s.processes, key=lambda p: p.cpu_max or 0.0, default=None)
        busy = "—" if busiest is None or busiest.cpu_max is None else f"{busiest.part} {busiest.cpu_max:.2f}"
        kib = [p.kib_per_client for p in s.processes if p.kib_per_client is not None]
        print(
            f"{s.users:>7} {s.workers:>4} {'—' if s.code is None else s.code:>4} "
            f"{'—' if s.wall is None else f'{s.wall:.0f}':>7} {r.with_session:>8} {r.sent:>7} {r.seen:>7} "
            f"{r.answered:>8} {r.unanswered:>7} {pct(r.no_answer_at_client, r.sent):>8} "
            f"{secs(r.to_proxy_p99_s):>9} {secs(r.proxy_p99_s):>9} {secs(r.client_p99_s):>9} {conns:>20} {busy:>22} "
            f"{f'{max(kib):.1f}' if kib else '—':>10} "
            f"{pct(s.at_stop.no_answer_at_client, s.at_stop.sent):>15}"
        )
    first = first_to_stop((s.users, s.requests) for s in steps)
    rule = f"more than {LOSS_SHARE:.0%} and at least {LOSS_MIN} of the requests entering it lost"
    if first is None:
        print(f"first hop to stop answering: none ({rule}, in no step)")
    else:
        seg, users, share = first
        print(f"first hop to stop answering: {seg} at step {users} ({share:.1%} lost; rule: {rule})")
    leaving = first_to_stop((s.users, s.at_stop) for s in steps)
    if leaving is not None:
        seg, users, share = leaving
        print(f"  after the load (clients leaving), first: {seg} at step {users} ({share:.1%} lost)")


def show_box() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ports = " - ".join(_read(Path("/proc/sys/net/ipv4/ip_local_port_range")).split()) or "—"
    somaxconn = _read(Path("/proc/sys/net/core/somaxconn")).strip() or "—"
    backlog = _read(Path("/proc/sys/net/ipv4/tcp_max_syn_backlog")).strip() or "—"
    load = " ".join(_read(Path("/proc/loadavg")).split()[:3]) or "—"
    print(
        f"box: {os.cpu_count()} cores, load {load}; open files limit {soft} (hard {hard}); "
        f"somaxconn {somaxconn}, tcp_max_syn_backlog {backlog}; ephemeral ports {ports}"
    )


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", default=DEFAULT_STEPS, help="client counts, comma-separated")
    ap.add_argument("--spawn-rate", type=float, default=50.0, help="clients started per second")
    ap.add_argument("--hold", type=float, default=30.0, help="seconds at the full count")
    ap.add_argument("--wait-min", type=float, default=30.0, help="seconds between a client's operations, min")
    ap.add_argument("--wait-max", type=float, default=90.0, help="... and max")
    ap.add_argument("--workers", type=int, default=0, help="Locust workers (default ceil(N/2500), at most 4)")
    ap.add_argument("--keep-going", action="store_true", help="do not stop after a step that mostly failed")
    ap.add_argument("--keep", action="store_true", help="keep the run folders (their path is printed)")
    ap.add_argument(
        "--from", dest="runs", nargs="+", type=Path, help="finished run folders: print their figures"
    )
    return ap


def main() -> None:
    args = parser().parse_args()
    show_box()
    if args.runs:
        finished = [measure(folder) for folder in args.runs]
        for s in finished:
            show_step(s)
        show_table(finished)
        return
    try:
        counts = [int(n) for n in args.steps.split(",") if n.strip()]
    except ValueError:
        raise SystemExit(f"--steps: expected client counts like 1000,2000, got {args.steps!r}") from None
    if (
        not counts
        or min(counts) < 1
        or args.spawn_rate <= 0
        or args.hold < 0
        or args.wait_max < args.wait_min
    ):
        raise SystemExit("--steps >= 1, --spawn-rate > 0, --hold >= 0 and --wait-max >= --wait-min, please")
    template = tomllib.loads(TEMPLATE.read_text(encoding="utf-8"))
    tmp = Path(tempfile.mkdtemp(prefix="bench-chain-steps-"))
    steps: list[Step] = []
    try:
        for users in counts:
            s = run_step(users, args, tmp, template)
            steps.append(s)
            show_step(s)
            share = s.requests.end_to_end_share
            if share > STOP_SHARE and not args.keep_going:
                print(f"\nstopping: {share:.0%} of the requests sent got no answer (--keep-going to go on)")
                break
        show_table(steps)
    finally:
        if args.keep:
            print(f"\nrun folders kept under {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
