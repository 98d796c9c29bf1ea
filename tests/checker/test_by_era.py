"""Every rule judged again on each era's part of a run of both (lab.checker.judge.by_era):
the ledgers cut to one era's clients, their flows and their server rows; in the report as
figures beside the run's verdict (docs/report.md, *By protocol era*)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from lab.checker.inputs.load import RunData
from lab.checker.judge.by_era import era_data
from lab.checker.judge.verdict import judge_dir
from lab.checker.rules import REGISTRY
from tests.checker.builders import clean_run

ERA_OF = {"w0-u1": "handshake", "w0-u2": "modern"}


def _data() -> RunData:
    flows = pd.DataFrame(
        {
            "flow": ["f1", "f2", "f3", "f4"],
            "conn": ["w0-u1:1", "w0-u2:7", None, "lab-proxy:1"],
            "session": ["s_a", None, None, None],
            "session_out": ["s_a", None, None, None],
            "protocol_version_in": ["2025-11-25", "2026-07-28", "2026-07-28", None],
        }
    )
    sent = pd.DataFrame({"flow": ["f1", "f1", "f2", "f3", "f4"], "index": [0, 1, 0, 0, 0]})
    plan = pd.DataFrame({"t": [1.0]})
    fault = pd.DataFrame({"flow": [None, "f2"], "fault": ["storm", "cut_stream"]})
    client = {
        "operations": pd.DataFrame(
            {"client_id": ["w0-u1", "w0-u2", "w0-u2"], "operation_key": ["a", "b", "c"]}
        ),
        "meta": pd.DataFrame({"key": ["x"]}),  # a table of no client: in both parts
    }
    server = {
        "dispatches": pd.DataFrame({"session": ["s_a", "modern", "s_gone"], "request_id": ["1", "2", "3"]}),
        "requests": pd.DataFrame(
            {"conn": ["w0-u1:1", "w0-u2:7", None, None], "session": [None, None, "s_a", None]}
        ),
    }
    return RunData(
        run_dir=Path("."),
        run={"target": {"kind": "reference", "era": "both"}},
        client=client,
        server=server,
        tap={"flow": flows, "sent": sent, "plan": plan, "fault": fault},
    )


def test_an_eras_part_holds_its_clients_their_flows_and_their_server_rows() -> None:
    modern = era_data(_data(), "modern", ERA_OF)
    assert modern.run is not None and modern.run["target"] == {"kind": "reference", "era": "modern"}
    assert modern.tap is not None and modern.client is not None and modern.server is not None
    # f2 by its client; f3 (no lab client) by its revision; f4 neither: the handshake era's.
    assert modern.tap["flow"]["flow"].tolist() == ["f2", "f3"]
    assert modern.tap["sent"]["flow"].tolist() == ["f2", "f3"]
    assert len(modern.tap["plan"]) == 1 and modern.tap["fault"]["fault"].tolist() == ["storm", "cut_stream"]
    assert modern.client["operations"]["operation_key"].tolist() == ["b", "c"]
    assert len(modern.client["meta"]) == 1
    # The modern era's writes are session `modern`; a session no flow named is in both parts.
    assert modern.server["dispatches"]["request_id"].tolist() == ["2", "3"]
    assert modern.server["requests"]["conn"].fillna("-").tolist() == ["w0-u2:7", "-"]

    handshake = era_data(_data(), "handshake", ERA_OF)
    assert handshake.tap is not None and handshake.client is not None and handshake.server is not None
    assert handshake.tap["flow"]["flow"].tolist() == ["f1", "f4"]
    assert handshake.tap["sent"]["flow"].tolist() == ["f1", "f1", "f4"]
    assert handshake.tap["fault"]["fault"].tolist() == ["storm"]
    assert handshake.client["operations"]["operation_key"].tolist() == ["a"]
    assert handshake.server["dispatches"]["request_id"].tolist() == ["1", "3"]
    # By connection first; a row with no connection by its session (s_a: the handshake era's).
    assert handshake.server["requests"]["session"].fillna("-").tolist() == ["-", "s_a", "-"]


def _report(tmp_path: Path, era: str) -> dict[str, Any]:
    run_dir = clean_run().sim.write(tmp_path / f"run-{era}")
    run = json.loads((run_dir / "run.json").read_text())
    run["target"]["era"] = era
    (run_dir / "run.json").write_text(json.dumps(run))
    _, report = judge_dir(run_dir)
    eras: Any = report.sections["eras"]
    return {"eras": eras, "gates": {g.gate: g for g in report.gates}}


def test_a_run_of_both_eras_has_every_rule_judged_on_each_eras_part(tmp_path: Path) -> None:
    both = _report(tmp_path, "both")
    rows = {g["gate"]: g for g in both["eras"]["gates"]}
    assert set(rows) == set(both["gates"])
    for gate, row in rows.items():
        assert set(row["by_era"]) == {"handshake", "modern"}
        for era, v in row["by_era"].items():
            if v is not None:
                assert v["verdict"] in ("pass", "fail", "inconclusive"), (gate, era, v)
        # The clean run's clients are all of the handshake era: its part judges every rule
        # as the whole run did; there is no modern part.
        if "handshake" in REGISTRY[gate].eras:
            assert row["by_era"]["handshake"]["verdict"] == str(both["gates"][gate].verdict), gate
        else:
            assert row["by_era"]["handshake"] is None, gate
        assert row["by_era"]["modern"] is None
    # A run of one era has no such section.
    assert _report(tmp_path, "handshake")["eras"] is None
