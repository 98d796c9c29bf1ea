"""The figures of one run of the whole chain, taken from its run folder and from Linux's
/proc: what each process used, how many connections each hop held, and where requests
went unanswered. Used by bench/bench_chain_steps.py; reads files only.

Every request of a run carries its client's `x-lab-conn` (`<client_id>:<conn_id>`, one per
request): the client ledger (`http_exchanges`), the proxy tap (`flow` records) and the
reference server's ledger (`requests`) all keep it, so one request can be followed
across the chain and its loss put on the segment where it happened:

    clients -> proxy    sent by a client, never seen by the tap (the nemesis or mitmdump
                        never took it: refused, reset, or still queued when the client gave
                        up), or seen by the tap only after the client had given up on it
    proxy -> server     seen by the tap, no status, and the server never answered it
    server -> proxy     the server answered it (a `requests` row), the tap has no status:
                        mitmdump never passed the answer on
    proxy -> clients    the tap passed a status on, the client got no response head
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

SEGMENTS = ("clients -> proxy", "proxy -> server", "server -> proxy", "proxy -> clients")
"""The chain's segments, nearest the clients first (the order "first to stop" is judged in)."""

LOSS_SHARE = 0.01
"""A segment stops answering when it loses more than this share of the requests entering it..."""
LOSS_MIN = 10
"""...and at least this many: the few requests in flight when a run stops are not a collapse."""

_FLOW = re.compile(r'^\{"type":\s*"flow"[,}]')
"""A tap `flow` record (the tap writes `type` first); the prefilter keeps the bench from
parsing every `sent`/`forwarded` record of a large tap."""

# /proc/net/tcp states (include/net/tcp_states.h), as the file writes them.
ESTABLISHED = "01"
SYN_RECV = "03"
TIME_WAIT = "06"


# ------------------------------------------------------------------ connections (/proc/net)


@dataclass(slots=True)
class TcpCount:
    """One read of /proc/net/tcp{,6}: ESTABLISHED sockets whose local port is each hop's
    listening port (the connections the hop accepted), SYN_RECV ones (handshakes not yet
    accepted), and TIME_WAIT sockets on the whole box (the ephemeral ports they hold)."""

    established: dict[str, int] = field(default_factory=dict)
    syn_recv: dict[str, int] = field(default_factory=dict)
    time_wait: int = 0


def count_tcp(texts: Iterable[str], ports: Mapping[str, int]) -> TcpCount:
    """Count the sockets of /proc/net/tcp-format `texts` (the header line is skipped) by
    state and local port; `ports` maps hop -> its listening port. One split per line and a
    dict look-up: cheap enough every 2 s for tens of thousands of sockets."""
    by_hex = {f"{port:04X}": hop for hop, port in ports.items()}
    out = TcpCount({hop: 0 for hop in ports}, {hop: 0 for hop in ports})
    for text in texts:
        for line in text.splitlines()[1:]:
            fields = line.split(None, 4)
            if len(fields) < 4:
                continue
            state = fields[3]
            if state == TIME_WAIT:
                out.time_wait += 1
                continue
            hop = by_hex.get(fields[1][-4:])
            if hop is None:
                continue
            if state == ESTABLISHED:
                out.established[hop] += 1
            elif state == SYN_RECV:
                out.syn_recv[hop] += 1
    return out


def listen_drops(text: str) -> dict[str, int]:
    """`ListenOverflows` and `ListenDrops` from /proc/net/netstat's TcpExt lines (box-wide
    counters: an accept queue that was full, a SYN dropped)."""
    lines = [line.split() for line in text.splitlines() if line.startswith("TcpExt:")]
    if len(lines) < 2:
        return {}
    names, values = lines[0][1:], lines[1][1:]
    return {n: int(v) for n, v in zip(names, values, strict=False) if n in ("ListenOverflows", "ListenDrops")}


# ------------------------------------------------------------------ requests (the ledgers)


@dataclass(slots=True)
class Requests:
    """Every request of a run, followed across the chain by its `x-lab-conn`."""

    sent: int = 0
    """requests the clients sent (client ledger `http_exchanges`)."""
    no_answer_at_client: int = 0
    """of them, with no response head at the client (`status` NULL)."""
    seen: int = 0
    """tap `flow` records: requests that reached the proxy."""
    answered: int = 0
    """tap flows the server answered (`status` not null, `answered_by` "server")."""
    by_proxy: int = 0
    """tap flows the proxy answered itself (a fault's answer)."""
    unanswered: int = 0
    """tap flows with no status: no answer came from upstream."""
    late: int = 0
    """of the unanswered, those that reached the proxy after their client had given up."""
    server_answered: int = 0
    """tap flows whose request the server logged with a status (its `requests` table)."""
    lost: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SEGMENTS, 0))
    entered: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SEGMENTS, 0))
    to_proxy_p99_s: float | None = None
    """p99 of tap `t_request` - the client's `started_at` (client to proxy, through the nemesis)."""
    proxy_p99_s: float | None = None
    """p99 of tap `t - t_request` of the answered flows (request in to answer out, at the proxy)."""
    client_p99_s: float | None = None
    """p99 of the calls that ended ok at the clients (operations `finished_at - started_at`)."""
    calls: dict[str, int] = field(default_factory=dict)
    """client operations by outcome (ok, error, unknown, cancelled)."""
    clients: int = 0
    """clients that sent at least one request."""
    with_session: int = 0
    """clients that established a session."""
    server_ledger: bool = False
    """whether the server's ledger was there to split the tap's unanswered flows."""

    def share(self, segment: str) -> float:
        n = self.entered[segment]
        return self.lost[segment] / n if n else 0.0

    @property
    def end_to_end_share(self) -> float:
        return self.no_answer_at_client / self.sent if self.sent else 0.0


@dataclass(frozen=True, slots=True)
class Exchange:
    """One request in the client ledger (`http_exchanges`)."""

    answered: bool
    """a response head came back (`status` not NULL)."""
    started_at: float | None
    ended_at: float | None


@dataclass(slots=True)
class ClientLedger:
    """One worker's client ledger: what the figures need of it."""

    exchanges: dict[str, Exchange] = field(default_factory=dict)
    """x-lab-conn -> the request as its client saw it."""
    calls: list[tuple[float, str, float | None]] = field(default_factory=list)
    """(started_at, outcome, finished_at - started_at) of every call (`operations`)."""
    clients: int = 0
    with_session: int = 0
    first_request: float | None = None


def _open_ro(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)


def read_client(path: Path) -> ClientLedger:
    """One `clients/worker-<n>.sqlite` (mcpClientLedger.v1)."""
    c = ClientLedger()
    db = _open_ro(path)
    try:
        for conn, answered, started, ended in db.execute(
            "SELECT client_id || ':' || conn_id, status IS NOT NULL, started_at, ended_at FROM http_exchanges"
        ):
            c.exchanges[str(conn)] = Exchange(bool(answered), _float(started), _float(ended))
        row = db.execute("SELECT COUNT(DISTINCT client_id), MIN(started_at) FROM http_exchanges").fetchone()
        c.clients, c.first_request = int(row[0]), row[1]
        c.with_session = int(
            db.execute(
                "SELECT COUNT(DISTINCT client_id) FROM sessions WHERE what = 'established'"
            ).fetchone()[0]
        )
        c.calls = [
            (float(started), str(outcome), _float(took))
            for started, outcome, took in db.execute(
                "SELECT started_at, outcome, finished_at - started_at FROM operations WHERE started_at IS NOT NULL"
            )
        ]
    finally:
        db.close()
    return c


def read_clients(folder: Path) -> dict[str, ClientLedger]:
    """worker part name (`worker-0`...) -> its client ledger's figures."""
    return {
        p.name.removesuffix(".sqlite"): read_client(p) for p in sorted(folder.glob("clients/worker-*.sqlite"))
    }


def read_server_answered(folder: Path) -> set[str] | None:
    """The x-lab-conn of every request the reference server answered; None without its ledger."""
    path = folder / "server" / "ledger.sqlite"
    if not path.is_file():
        return None
    db = _open_ro(path)
    try:
        return {str(c) for (c,) in db.execute("SELECT conn FROM requests WHERE conn IS NOT NULL")}
    finally:
        db.close()


@dataclass(slots=True)
class TapFlow:
    status: int | None
    by_proxy: bool
    t_request: float | None
    """when the request reached the proxy (absent from older taps)."""
    latency: float | None
    """`t - t_request`: request in to the answer's head out."""


def read_flows(path: Path) -> dict[str, TapFlow]:
    """x-lab-conn -> the tap's `flow` record of that request (mcpTapLedger: docs/ledgers.md)."""
    flows: dict[str, TapFlow] = {}
    try:
        handle = path.open(encoding="utf-8", errors="replace")
    except OSError:
        return flows
    with handle:
        for line in handle:
            if not _FLOW.match(line):
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # the last line of a killed writer
            status, t, t_req = rec.get("status"), _float(rec.get("t")), _float(rec.get("t_request"))
            flows[str(rec.get("conn"))] = TapFlow(
                status if isinstance(status, int) and not isinstance(status, bool) else None,
                rec.get("answered_by") == "proxy",
                t_req,
                None if t is None or t_req is None else t - t_req,
            )
    return flows


def p99(values: Iterable[float]) -> float | None:
    """Nearest-rank p99 (None for no values)."""
    v = sorted(values)
    return v[max(0, math.ceil(0.99 * len(v)) - 1)] if v else None


def requests(
    clients: Mapping[str, ClientLedger],
    flows: Mapping[str, TapFlow],
    server: set[str] | None,
    start: float | None = None,
    end: float | None = None,
) -> Requests:
    """Join the three ledgers on x-lab-conn and put each loss on its segment; only the
    requests (and calls) a client started in [start, end), when given; a flow whose
    request is not in a client ledger, by when it reached the proxy."""

    def inside(t: float | None) -> bool:
        return t is None or ((start is None or t >= start) and (end is None or t < end))

    r = Requests(server_ledger=server is not None)
    sent: dict[str, Exchange] = {}
    latency: list[float] = []
    for c in clients.values():
        r.clients += c.clients
        r.with_session += c.with_session
        for started, outcome, took in c.calls:
            if inside(started):
                r.calls[outcome] = r.calls.get(outcome, 0) + 1
                if outcome == "ok" and took is not None:
                    latency.append(took)
        sent.update((conn, x) for conn, x in c.exchanges.items() if inside(x.started_at))
    r.client_p99_s = p99(latency)
    r.sent = r.entered["clients -> proxy"] = len(sent)
    known = {conn for c in clients.values() for conn in c.exchanges}
    judged = {
        conn: f for conn, f in flows.items() if conn in sent or (conn not in known and inside(f.t_request))
    }
    answered_latency: list[float] = []
    to_proxy: list[float] = []
    for conn, f in judged.items():
        r.seen += 1
        x = sent.get(conn)
        if x is not None and x.started_at is not None and f.t_request is not None:
            to_proxy.append(f.t_request - x.started_at)
        if f.status is None:
            r.unanswered += 1
            if (
                x is not None
                and x.ended_at is not None
                and f.t_request is not None
                and f.t_request >= x.ended_at
            ):
                r.late += 1  # its client had already given up: lost before the proxy
                r.lost["clients -> proxy"] += 1
                continue
        elif f.by_proxy:
            r.by_proxy += 1
            continue
        else:
            r.answered += 1
            if f.latency is not None:
                answered_latency.append(f.latency)
        r.entered["proxy -> server"] += 1
        if server is not None and conn in server:
            r.server_answered += 1
            r.entered["server -> proxy"] += 1
            r.lost["server -> proxy"] += f.status is None
        else:
            r.lost["proxy -> server"] += f.status is None
    r.proxy_p99_s = p99(answered_latency)
    r.to_proxy_p99_s = p99(to_proxy)
    for conn, x in sent.items():
        r.no_answer_at_client += not x.answered
        flow = judged.get(conn)
        if flow is None:
            r.lost["clients -> proxy"] += 1
        elif flow.status is not None:
            r.entered["proxy -> clients"] += 1
            r.lost["proxy -> clients"] += not x.answered
    return r


def first_to_stop(steps: Iterable[tuple[int, Requests]]) -> tuple[str, int, float] | None:
    """(segment, users, its loss share) of the first step, in the order given, where a
    segment lost more than LOSS_SHARE (and at least LOSS_MIN) of the requests entering it;
    of several such segments in that step, the one nearest the clients: a hop that stops
    answering starves the ones behind it, never the ones before it. None if none did."""
    for users, r in steps:
        for segment in SEGMENTS:
            if r.lost[segment] >= LOSS_MIN and r.share(segment) > LOSS_SHARE:
                return segment, users, r.share(segment)
    return None


# ------------------------------------------------------------------ processes (processes.jsonl)


@dataclass(slots=True)
class Process:
    part: str
    cpu_mean: float | None
    cpu_max: float | None
    rss_max: int | None
    fds_max: int | None
    clients: int | None = None
    """a worker's clients (those that sent a request)."""
    rss_base: int | None = None
    """a worker's RSS before its first client's first request."""

    @property
    def kib_per_client(self) -> float | None:
        """A worker's peak RSS above its RSS before its clients, per client (KiB)."""
        if not self.clients or self.rss_max is None or self.rss_base is None:
            return None
        return (self.rss_max - self.rss_base) / self.clients / 1024


PART_ORDER = ("server", "mitmproxy", "nemesis", "master")


def _order(part: str) -> tuple[int, str]:
    head = part.split("/", 1)[0]
    if head in PART_ORDER:
        return PART_ORDER.index(head), part
    return (len(PART_ORDER), part) if head.startswith("worker-") else (len(PART_ORDER) + 1, part)


def processes(folder: Path, clients: Mapping[str, ClientLedger]) -> tuple[list[Process], int | None]:
    """Per process over the run (run.json's start to stop): CPU mean and max (cores), peak
    RSS and fds; for workers their clients and RSS before them. Also the box's cores."""
    from lab.checker.health.processes import load_samples, summary, window

    s = load_samples(folder)
    start, stop = _run_window(folder)
    rows = []
    for p in summary(s, start, stop):
        part = str(p["part"])
        proc = Process(
            part, _float(p["cpu_mean"]), _float(p["cpu_max"]), _int(p["rss_max"]), _int(p["fds_max"])
        )
        c = clients.get(part)
        if c is not None:
            proc.clients = c.clients
            before = window(s, None, c.first_request)
            rss = before[before["part"] == part]["rss"].dropna()
            proc.rss_base = int(rss.iloc[-1]) if len(rss) else None
        rows.append(proc)
    return sorted(rows, key=lambda p: _order(p.part)), s.cpus


def _run_window(folder: Path) -> tuple[float | None, float | None]:
    try:
        run = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, None
    return _float(run.get("started_at")), _float(run.get("stopped_at"))


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
