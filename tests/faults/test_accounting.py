"""The checker's fault accounting (lab/checker/truth/faults.py) reads the registry of fault kinds:
what counts as fired is each kind's declared tap evidence, and a kill_session the target
refused with 405 is not applicable. Run folders are written as the proxy writes them and
read by the checker's own loader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lab.checker.inputs.load import load_run
from lab.checker.truth.faults import count_faults, not_applicable


def run_folder(tmp: Path, records: list[dict[str, Any]], configured: list[str]) -> Path:
    (tmp / "proxy").mkdir(parents=True)
    (tmp / "proxy" / "tap.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    windows = [{"fault": k, "rule": f"{k}#0", "start": 0.0, "end": 60.0} for k in configured]
    (tmp / "run.json").write_text(json.dumps({"schema": "mcpLabRun.v1", "fault_windows": windows}))
    return tmp


def flow(fid: str, faults: list[dict[str, Any]]) -> dict[str, Any]:
    nulls = ["session", "jsonrpc_id", "jsonrpc_method", "idempotency_key", "origin_in", "origin_out"]
    nulls += ["origin_allowed_out", "last_event_id_in", "last_event_id_out"]
    head = {"type": "flow", "flow": fid, "t": 1.0, "conn": "c:1", "method": "POST", "path": "/mcp"}
    return {**head, **dict.fromkeys(nulls), "status": 200, "answered_by": "server", "faults": faults}


def kill(status: int, flow_id: str = "f1") -> dict[str, Any]:
    detail = {"delete_status": status, "session": "s_" + "a" * 20, "order": "before"}
    return {
        "type": "fault",
        "t": 2.0,
        "fault": "kill_session",
        "rule": "k",
        "decision": "d_1",
        "flow": flow_id,
        "detail": detail,
    }


def test_a_kind_counts_only_where_it_says_it_leaves_evidence(tmp_path: Path) -> None:
    records = [
        flow("f1", [{"fault": "rewrite_origin", "rule": "r", "decision": "d_a"}]),
        # expiry_race leaves a `fault` record; an entry in a flow's list is not its evidence.
        flow("f2", [{"fault": "expiry_race", "rule": "e", "decision": "d_b"}]),
        {
            "type": "dropped",
            "flow": "f3",
            "t": 1.0,
            "index": 0,
            "fault": "cut_stream",
            "rule": "c",
            "decision": "d_c",
        },
        # One cut drops every event after it: one firing (its decision), not one per event.
        {
            "type": "dropped",
            "flow": "f3",
            "t": 1.1,
            "index": 1,
            "fault": "cut_stream",
            "rule": "c",
            "decision": "d_c",
        },
        {
            "type": "dropped",
            "flow": "f5",
            "t": 1.2,
            "index": 4,
            "fault": "cut_stream",
            "rule": "c",
            "decision": "d_e",
        },
        # A kind the registry does not know (another proxy's) is counted from every source.
        flow("f4", [{"fault": "someone_elses", "rule": "x", "decision": "d_d"}]),
    ]
    counts, never = count_faults(load_run(run_folder(tmp_path, records, ["rewrite_origin", "expiry_race"])))
    totals = {c.fault: (c.total, dict(c.by_source)) for c in counts}
    assert totals["rewrite_origin"] == (1, {"tap_flow": 1})
    assert totals["cut_stream"] == (2, {"tap_dropped": 2})  # two cuts, three events dropped
    assert totals["someone_elses"] == (1, {"tap_flow": 1})
    assert totals["expiry_race"] == (0, {}) and never == ["expiry_race"]


def test_a_kill_session_answered_405_is_not_applicable(tmp_path: Path) -> None:
    data = load_run(run_folder(tmp_path, [kill(405), kill(405, "f2")], ["kill_session"]))
    counts, never = count_faults(data)
    assert never == [] and [c.total for c in counts] == [2]  # it fired: the DELETE was sent
    na = not_applicable(data)
    assert list(na) == ["kill_session"] and na["kill_session"].firings == 2
    assert "405" in na["kill_session"].reason


def test_one_delete_that_worked_makes_it_applicable(tmp_path: Path) -> None:
    data = load_run(run_folder(tmp_path, [kill(405), kill(200, "f2"), kill(-1, "f3")], ["kill_session"]))
    assert not_applicable(data) == {}


def test_no_tap_no_claims(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"schema": "mcpLabRun.v1", "fault_windows": []}))
    data = load_run(tmp_path)
    assert not_applicable(data) == {} and count_faults(data) == ([], [])
