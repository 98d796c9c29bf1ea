"""bench/bench_chain_steps.py: the scenario it writes, the figures it takes (connections
from /proc/net/tcp, losses put on the segment where they happened, the first segment to
stop answering), and one tiny real step through the whole chain."""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from _chain_figures import (
    LOSS_MIN,
    ClientLedger,
    Exchange,
    Requests,
    TapFlow,
    count_tcp,
    first_to_stop,
    requests,
)
from bench_chain_steps import TEMPLATE, dump_toml, parser, step_scenario

from lab.scenario.read import load_scenario

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_chain_steps.py"


def test_a_step_scenario_is_the_template_with_the_steps_clients(tmp_path: Path) -> None:
    template = tomllib.loads(TEMPLATE.read_text(encoding="utf-8"))
    args = parser().parse_args(["--steps", "6000"])
    path = tmp_path / "step.toml"
    path.write_text(dump_toml(step_scenario(template, 6000, args)), encoding="utf-8")
    sc = load_scenario(path)  # the lab's own reader accepts it
    assert sc.load.users == 6000
    assert sc.load.workers == 3  # ceil(6000 / 2500)
    assert sc.load.duration == 6000 / 50 + 30
    assert sc.load.hard_timeout >= 2 * sc.load.duration
    assert (sc.load.wait_min, sc.load.wait_max) == (30.0, 90.0)
    assert sc.load.open_standalone
    assert sc.load.stall_timeout > sc.load.wait_max  # idle clients are not a stall
    assert sc.target.max_streams >= 2 * 6000
    assert sc.load.mix == {**{"churn": 0}, **template["load"]["mix"]}
    assert not sc.faults and not sc.toxics
    many = step_scenario(template, 20000, args)["load"]["workers"]
    assert many == 4  # never more than four workers by default


def test_count_tcp_counts_the_connections_a_listening_port_accepted() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        accepted = [server.accept()[0] for _ in range(2)]  # the third waits in the queue
        ephemeral = clients[0].getsockname()[1]
        try:
            texts = [Path(p).read_text() for p in ("/proc/net/tcp", "/proc/net/tcp6") if Path(p).exists()]
            counted = count_tcp(texts, {"server": port})
        finally:
            for s in clients + accepted:
                s.close()
    # Three handshakes done (accepted or queued), each counted once on the listening side;
    # the clients' own ends (ephemeral local ports) are not the hop's.
    assert counted.established == {"server": 3}
    assert count_tcp(texts, {"a client": ephemeral}).established == {"a client": 1}


def test_each_loss_is_put_on_the_segment_where_it_happened() -> None:
    def sent(answered: bool) -> Exchange:
        return Exchange(answered, started_at=100.0, ended_at=105.0)

    client = ClientLedger(
        exchanges={f"c:{i}": sent(i == 1) for i in range(1, 7)},
        clients=1,
    )
    flows = {
        "c:1": TapFlow(200, False, 100.1, 0.01),  # answered end to end
        # c:2 never reached the proxy
        "c:3": TapFlow(None, False, 100.1, None),  # the server never answered
        "c:4": TapFlow(None, False, 100.1, None),  # the server answered, the proxy did not pass it on
        "c:5": TapFlow(202, False, 100.1, 0.02),  # the proxy passed it on, the client got nothing
        "c:6": TapFlow(None, False, 106.0, None),  # reached the proxy after its client gave up
    }
    r = requests({"worker-0": client}, flows, server={"c:1", "c:4", "c:5"})
    assert (r.sent, r.seen, r.answered, r.unanswered, r.late, r.no_answer_at_client) == (6, 5, 2, 3, 1, 5)
    assert r.lost == {
        "clients -> proxy": 2,
        "proxy -> server": 1,
        "server -> proxy": 1,
        "proxy -> clients": 1,
    }
    assert r.entered == {
        "clients -> proxy": 6,
        "proxy -> server": 4,
        "server -> proxy": 3,
        "proxy -> clients": 2,
    }
    assert r.to_proxy_p99_s == pytest.approx(6.0)  # c:6's 6 s to reach the proxy
    # Without the server's ledger the two upstream losses cannot be told apart.
    blind = requests({"worker-0": client}, flows, server=None)
    assert blind.lost["proxy -> server"] == 2 and blind.lost["server -> proxy"] == 0


def _losses(**lost: tuple[int, int]) -> Requests:
    r = Requests()
    for key, (n, of) in lost.items():
        seg = key.replace("_to_", " -> ")
        r.lost[seg], r.entered[seg] = n, of
    return r


def test_the_first_segment_to_stop_answering() -> None:
    healthy = _losses(clients_to_proxy=(3, 1000), proxy_to_server=(LOSS_MIN - 1, 100))  # too few to count
    assert first_to_stop([(1000, healthy), (2000, healthy)]) is None
    # In the first step past the threshold, of two segments over it, the nearest the clients.
    broken = _losses(proxy_to_server=(50, 1000), proxy_to_clients=(100, 900))
    worse = _losses(clients_to_proxy=(500, 1000))
    assert first_to_stop([(1000, healthy), (2000, broken), (4000, worse)]) == ("proxy -> server", 2000, 0.05)


STEP_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s", re.M)
REQUESTS = re.compile(
    r"requests[^:\n]*: sent (\d+), seen by the proxy (\d+), answered by the server (\d+), unanswered (\d+)"
)
AFTER = re.compile(r"after the load: sent (\d+), seen (\d+), answered (\d+), unanswered (\d+)")


def _table_row(out: str, users: int) -> dict[str, int]:
    table = out.split("== steps", 1)[1]
    for m in STEP_ROW.finditer(table):
        if int(m[1]) == users:
            keys = (
                "clients",
                "workers",
                "exit",
                "wall",
                "sessions",
                "sent",
                "seen",
                "answered",
                "unanswered",
            )
            return {k: int(v) if v.isdigit() else -1 for k, v in zip(keys, m.groups(), strict=True)}
    raise AssertionError(f"no row for {users} clients in:\n{table}")


@pytest.mark.live
def test_one_small_step_through_the_whole_chain(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the bench's temporary folder, kept for the checks
    argv = [sys.executable, str(BENCH), "--steps", "50", "--hold", "6", "--spawn-rate", "25"]
    argv += ["--wait-min", "1", "--wait-max", "3", "--workers", "1", "--keep"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    row = _table_row(done.stdout, 50)
    assert row["exit"] == 0 and row["workers"] == 1
    assert row["sent"] > 50  # every client at least initializes and opens its stream
    assert row["answered"] == row["seen"] - row["unanswered"]
    block = REQUESTS.search(done.stdout)
    assert block is not None
    assert [int(v) for v in block.groups()] == [row["sent"], row["seen"], row["answered"], row["unanswered"]]
    assert re.search(
        r"peak connections accepted per hop: nemesis [1-9]\d*.*mitmproxy [1-9]\d*.*server [1-9]", done.stdout
    )

    # The figures are the ledgers': count them here the plain way.
    (folder,) = tmp_path.glob("bench-chain-steps-*/step-50/*-chain-steps-50-*")
    db = sqlite3.connect(f"file:{folder / 'clients' / 'worker-0.sqlite'}?mode=ro", uri=True)
    sent = db.execute("SELECT COUNT(*) FROM http_exchanges").fetchone()[0]
    db.close()
    lines = (folder / "proxy" / "tap.jsonl").read_text(encoding="utf-8").splitlines()
    flows = [rec for rec in map(json.loads, lines) if rec.get("type") == "flow"]
    after = AFTER.search(done.stdout)  # the requests of the clients leaving, if any
    left = [int(v) for v in after.groups()] if after else [0, 0, 0, 0]
    assert (row["sent"] + left[0], row["seen"] + left[1]) == (sent, len(flows))
    assert row["unanswered"] + left[3] == sum(1 for f in flows if f["status"] is None)

    # A finished run gives the same figures, and the connections saved beside it.
    again = subprocess.run(
        [sys.executable, str(BENCH), "--from", str(folder)], capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0, again.stderr[-3000:]
    later = _table_row(again.stdout, 50)
    assert {k: later[k] for k in ("sent", "seen", "answered", "unanswered", "sessions")} == {
        k: row[k] for k in ("sent", "seen", "answered", "unanswered", "sessions")
    }
    assert "peak connections accepted per hop: nemesis" in again.stdout
