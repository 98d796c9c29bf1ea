"""What a replay reads back of a run (lab.replay.recorded), on its own: a client under test's
operations from the proxy tap (one per idempotency key, in the order the proxy had the
requests; only tool calls), the lab's own clients' from their ledger as before, and the
client itself from run.json; and the replay's scenario runs that same client."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from lab.load.settings import ClientScript
from lab.replay.build import replay_scenario
from lab.replay.recorded import Recorded, ReplayError, read_scripts, recorded_client
from lab.replay.shrink import Candidate, Oracle, witness_clients

ZERO = 1000.0
"""run.json `started_at` of the synthetic runs."""


def flow(conn: str | None, rpc: str | None, *, tool: str | None = None, key: str | None = None,
         t: float, t_request: float | None = None, method: str = "POST", **extra: Any) -> dict[str, Any]:  # fmt: skip
    """A tap `flow` record with the fields a replay reads (docs/ledgers.md, "Proxy tap")."""
    rec: dict[str, Any] = {"type": "flow", "flow": f"f{t}", "t": t, "conn": conn, "method": method,
                           "jsonrpc_method": rpc, "tool": tool, "idempotency_key": key, "status": 200,
                           "session": None, "session_out": None}  # fmt: skip
    if t_request is not None:
        rec["t_request"] = t_request
    return rec | extra


def write_tap(run: Path, records: list[dict[str, Any]], tail: str = "") -> None:
    (run / "proxy").mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r, separators=(",", ":")) for r in records]
    (run / "proxy" / "tap.jsonl").write_text("\n".join(lines) + "\n" + tail)


def write_ledger(run: Path, rows: list[tuple[str, str, float]]) -> None:
    (run / "clients").mkdir(parents=True, exist_ok=True)
    with contextlib.closing(sqlite3.connect(run / "clients" / "worker-0.sqlite")) as db:
        db.execute("CREATE TABLE operations (client_id TEXT, tool TEXT, started_at REAL)")
        db.executemany("INSERT INTO operations VALUES (?, ?, ?)", rows)
        db.commit()


SUT_TAP = [
    flow("w0-u1:1", "initialize", t=1000.2, t_request=1000.1, session_out="s_aaaaaaaaaaaaaaaaaaaa"),
    flow("w0-u1:2", "notifications/initialized", t=1000.3, t_request=1000.25),
    flow("w0-u1:3", None, t=1000.4, t_request=1000.35, method="GET"),  # the standalone stream
    # The echo's answer passed last, but the proxy had its request first: it comes first.
    flow("w0-u1:4", "tools/call", tool="echo", key="w0-u1/9f3e0a11/c1", t=1003.0, t_request=1000.5004),
    flow("w0-u1:5", "tools/list", t=1000.9, t_request=1000.8),  # the Python SDK learns the schema
    flow("w0-u1:6", "tools/call", tool="ticker", key="w0-u1/9f3e0a11/c2", t=1001.5, t_request=1001.25),
    # The same write sent three times (its answer lost, then re-sent): one operation.
    flow("w0-u1:7", "tools/call", tool="ledger.append", key="w0-u1/9f3e0a11/c3", t=1002.1, t_request=1002.0),
    flow("w0-u1:8", "tools/call", tool="ledger.append", key="w0-u1/9f3e0a11/c3", t=1002.6, t_request=1002.5),
    flow("w0-u1:9", "tools/call", tool="ledger.append", key="w0-u1/9f3e0a11/c3", t=1002.9),
    flow("w0-u1:10", None, t=1003.1, t_request=1003.05, method="DELETE"),
    # A tap without `t_request` (an older proxy): the answer's time.
    flow("w0-u2:4", "tools/call", tool="echo", key="w0-u2/9f3e0a11/c1", t=1001.0),
    # A tool that is no operation of a script, and a request of no lab client: left out.
    flow("w0-u2:5", "tools/call", tool="clock", key="w0-u2/9f3e0a11/c2", t=1001.2, t_request=1001.1),
    flow(None, "tools/call", tool="echo", key="k", t=1001.3, t_request=1001.2),
    # A client ID may itself hold ':' (the client is the conn before its last one).
    flow("edge:7:3", "tools/call", tool="ticker", key="edge:7/9f3e0a11/c1", t=999.9, t_request=999.5),
]


def test_a_client_under_tests_operations_come_from_the_tap(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "clients").mkdir(parents=True)
    (run / "clients" / "app-0.jsonl").write_text('{"ev": "ready"}\n')  # its record: no ledger
    # An SSE event of a tools/call stream names the method too; the tap's last line was cut.
    event = {"type": "sent", "flow": "f1", "t": 1000.6, "index": 0, "data": '{"method":"tools/call"}'}
    write_tap(run, [*SUT_TAP, event], tail='{"type":"flow","conn":"w0-u3:4","jsonrpc_method":"tools/call"')
    scripts = read_scripts(run, {"started_at": ZERO})
    assert scripts == [
        ClientScript("edge:7", ("stream",), (0.0,)),  # before the run's zero: at 0
        ClientScript("w0-u1", ("read", "stream", "write"), (0.5, 1.25, 2.0)),  # ms, the first of the retries
        ClientScript("w0-u2", ("read",), (1.0,)),
    ]


def test_the_lab_clients_ledger_is_read_as_before_and_the_tap_only_without_it(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_ledger(run, [("w0-u1", "ticker", 1001.5), ("w0-u1", "echo", 1000.25), ("w0-u1", "clock", 1000.3)])
    write_tap(run, SUT_TAP)  # a lab run's tap has tool calls too: the ledger says more (its own times)
    assert read_scripts(run, {"started_at": ZERO}) == [ClientScript("w0-u1", ("read", "stream"), (0.25, 1.5))]
    empty = tmp_path / "empty"
    write_ledger(empty, [])
    write_tap(empty, [flow("w0-u1:1", "initialize", t=1000.2)])
    with pytest.raises(
        ReplayError, match=r"no client ledger \(clients/\*\.sqlite\) holds one, and the proxy tap"
    ):
        read_scripts(empty, {"started_at": ZERO})


@pytest.mark.parametrize(
    ("about", "load_client", "expected"),
    [
        (None, None, "lab"),  # a run.json of before `client`: the lab's own clients
        ({"kind": "lab", "spec": "lab", "adapter": None}, "python-sdk", "lab"),  # `--client lab` won
        ({"kind": "python-sdk", "spec": "python-sdk", "adapter": "python-sdk"}, None, "python-sdk"),
        ({"kind": "typescript-sdk", "spec": "typescript-sdk"}, "lab", "typescript-sdk"),
        ("python-sdk", None, "python-sdk"),
        ({"kind": "cmd", "spec": "cmd", "adapter": "cmd"}, "cmd:python my_adapter.py", "cmd:python my_adapter.py"),
    ],
)  # fmt: skip
def test_the_client_comes_from_run_json(about: object, load_client: str | None, expected: str) -> None:
    scenario = {"load": {"client": load_client}} if load_client else {"load": {}}
    assert recorded_client({"client": about} if about is not None else {}, scenario) == expected


def test_a_cmd_adapter_whose_command_is_unknown_is_refused() -> None:
    with pytest.raises(ReplayError, match=r"run.json does not keep its command"):
        recorded_client({"client": {"kind": "cmd", "spec": "cmd"}}, {"load": {"client": "python-sdk"}})


SCENARIO: dict[str, Any] = {
    "seed": 4,
    "target": {"kind": "reference"},
    "load": {"client": "lab", "users": 2, "duration": "5s", "mix": {"read": 1}},
    "faults": [{"kind": "kill_session", "rate": 0.2, "match": {"tools": ["echo"]}}],
}
TRIGGERS = (
    {"fault": "kill_session", "rule": "kill_session#0", "by": "request", "client": "w0-u1",
     "request": "POST tools/call echo", "ordinal": 1, "event_index": None, "conn": "w0-u1:4"},
)  # fmt: skip


def recorded(tmp_path: Path, client: dict[str, Any] | str, report: dict[str, Any] | None = None) -> Recorded:
    run = {"run_id": "r1", "seed": 9, "started_at": ZERO, "client": client, "target": {"kind": "reference"}}
    scripts = (ClientScript("w0-u1", ("read", "write"), (0.5, 2.0)),)
    return Recorded(tmp_path, run, tmp_path / "s.toml", SCENARIO, scripts, TRIGGERS, report)


def test_the_replay_of_a_client_under_test_runs_the_same_client(tmp_path: Path) -> None:
    # The file said `lab`; the run was `lab run --client python-sdk`: run.json says which ran.
    doc, sel = replay_scenario(recorded(tmp_path, {"kind": "python-sdk", "spec": "python-sdk"}))
    assert doc["load"]["client"] == "python-sdk" and sel.pinned == 1
    assert doc["load"]["clients"] == [{"id": "w0-u1", "ops": ["read", "write"], "at": [0.5, 2.0]}]
    doc, _ = replay_scenario(recorded(tmp_path, {"kind": "lab", "spec": "lab"}))
    assert "client" not in doc["load"]  # the default: the lab's own


def test_a_client_under_tests_sessions_are_its_own_by_the_tap(tmp_path: Path) -> None:
    write_tap(tmp_path, SUT_TAP)  # no client ledger: w0-u1's initialize was given s_aaa...
    report = {
        "rules": {"missing_rehandshake": {"witnesses": [{"row": {"session": "s_aaaaaaaaaaaaaaaaaaaa"}}]}}
    }
    rec = recorded(tmp_path, {"kind": "python-sdk", "spec": "python-sdk"}, report)
    assert witness_clients(rec, "missing_rehandshake") == [["w0-u1"]]


def test_every_run_of_a_shrink_runs_the_recorded_client(tmp_path: Path) -> None:
    # A stand-in for `lab` that keeps the argv it was given (the oracle runs `lab run`).
    fake_lab = tmp_path / "fake-lab"
    fake_lab.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        "out = sys.argv[sys.argv.index('--out') + 1]\n"
        "open(out + '/argv.json', 'w').write(json.dumps(sys.argv[1:]))\n"
    )
    fake_lab.chmod(0o755)
    rec = recorded(tmp_path, {"kind": "python-sdk", "spec": "python-sdk"})
    oracle = Oracle(
        rec, "missing_rehandshake", "client", target="http://127.0.0.1:1/mcp", folder=tmp_path / "shrink",
        k=1, n=1, deadline=time.monotonic() + 60, lab=str(fake_lab), say=lambda _: None, client=rec.client,
    )  # fmt: skip
    assert not oracle(Candidate(rec.scripts, rec.triggers))  # no report: not a failure
    (argv_file,) = (tmp_path / "shrink" / "runs").glob("*/argv.json")
    argv = json.loads(argv_file.read_text())
    assert argv[argv.index("--client") + 1] == "python-sdk"
    (candidate,) = (tmp_path / "shrink" / "candidates").glob("*.toml")
    assert tomllib.loads(candidate.read_text())["load"]["client"] == "python-sdk"  # the file says it too
