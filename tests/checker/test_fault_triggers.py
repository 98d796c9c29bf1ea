"""Every fault firing named by its logical trigger (lab.checker.truth.triggers), and
`lab report`'s fault_triggers.jsonl."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

from lab.checker.context import Context, parse_budgets
from lab.checker.inputs.records import run_data_from_records
from lab.checker.truth.faults import count_faults
from lab.checker.truth.triggers import SCHEMA, Trigger, triggers
from lab.report.outputs import report_run
from tests.checker.builders import clean_run

T0 = 1_000.0


def _flow(flow: str, t: float, conn: str | None, method: str, **extra: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "type": "flow", "flow": flow, "t": t, "conn": conn, "method": method, "path": "/mcp",
        "session": "s_1", "jsonrpc_id": None, "jsonrpc_method": None, "idempotency_key": None,
        "origin_in": None, "origin_out": None, "origin_allowed_out": None, "last_event_id_in": None,
        "last_event_id_out": None, "status": 200, "answered_by": "server", "faults": [],
    }  # fmt: skip
    record.update(extra)
    return record


def _fault_entry(kind: str, decision: str) -> dict[str, Any]:
    return {"fault": kind, "rule": f"{kind}#0", "decision": decision}


def _tap() -> list[dict[str, Any]]:
    ticker = {"jsonrpc_method": "tools/call", "tool": "ticker"}
    tap: list[dict[str, Any]] = [
        _flow("f-init", T0 + 0.1, "a:1", "POST", jsonrpc_method="initialize"),
        _flow("f-t1", T0 + 1.0, "a:2", "POST", **ticker),
        _flow("f-t2", T0 + 2.0, "a:3", "POST", **ticker),
        _flow(
            "f-res",
            T0 + 3.0,
            "a:4",
            "GET",
            last_event_id_in="e5",
            last_event_id_out="e9",
            faults=[_fault_entry("rewrite_last_event_id", "d_rw")],
        ),
        _flow("f-del", T0 + 4.0, "b:7", "DELETE"),
        _flow("f-anon", T0 + 5.0, None, "POST", faults=[_fault_entry("strip_session_id", "d_anon")]),
    ]
    # A cut of the 1st ticker call: one decision drops events 3, 4 and 5 (one firing).
    tap += [
        {"type": "dropped", "flow": "f-t1", "t": T0 + 1.3 + i / 10, "index": i, **_fault_entry("cut_stream", "d_cut")}
        for i in (3, 4, 5)
    ]  # fmt: skip
    # The 2nd ticker call is sent another stream's event at its event 2.
    tap.append(
        {
            "type": "forwarded", "flow": "f-t2", "t": T0 + 2.2, "index": 2, "event_id": "x", "digest": "d",
            "source": {"flow": "f-t1", "index": 1}, **_fault_entry("cross_ids", "d_x"),
        }
    )  # fmt: skip
    # A session race on client b's DELETE.
    tap.append(
        {"type": "fault", "t": T0 + 4.1, "flow": "f-del", "detail": {"order": "before"}, **_fault_entry("kill_session", "d_k")}
    )  # fmt: skip
    return tap


NEMESIS = [
    {"type": "toxic_added", "t": T0 + 6.0, "proxy": "mcp", "toxic": "latency-0", "kind": "latency"},
    {"type": "toxic_removed", "t": T0 + 8.0, "proxy": "mcp", "toxic": "latency-0", "kind": "latency"},
]


def test_each_firing_is_named_by_its_client_request_and_event() -> None:
    data = run_data_from_records(run={"started_at": T0}, tap=_tap(), nemesis=NEMESIS)
    rows = triggers(Context(data, parse_budgets(data.run)))
    # One row per firing, as the fault counts count them.
    counts, _ = count_faults(data)
    assert Counter(t.fault for t in rows) == Counter({c.fault: c.total for c in counts if c.total})
    by_fault = {t.fault: t for t in rows}
    assert len(by_fault) == len(rows) == 6
    cut = by_fault["cut_stream"]
    assert (cut.by, cut.client, cut.request, cut.ordinal, cut.event_index, cut.conn) == (
        "event", "a", "POST tools/call ticker", 1, 3, "a:2",
    )  # fmt: skip
    assert cut.sentence() == "cut_stream at event 3 of the 1st `POST tools/call ticker` of client a"
    crossed = by_fault["cross_ids"]
    assert (crossed.ordinal, crossed.event_index) == (2, 2)
    rewrite = by_fault["rewrite_last_event_id"]
    assert (rewrite.by, rewrite.request, rewrite.ordinal) == ("request", "GET resume", 1)
    assert rewrite.sentence() == "rewrite_last_event_id on the 1st `GET resume` of client a"
    race = by_fault["kill_session"]
    assert (race.by, race.client, race.request, race.ordinal) == ("request", "b", "DELETE", 1)
    # Known by time only: a request of no lab client, and a toxic.
    anon = by_fault["strip_session_id"]
    assert (anon.by, anon.client, anon.at_s) == ("time", None, 5.0)
    toxic = by_fault["toxic:latency"]
    assert (toxic.by, toxic.source, toxic.phase, toxic.at_s) == ("time", "nemesis", "run", 6.0)
    assert toxic.sentence() == "toxic:latency added 6.0 s into the run (phase run), by time only"
    # In the order they fired.
    assert [t.at_s for t in rows] == sorted(t.at_s for t in rows if t.at_s is not None)


def test_a_resend_is_named_as_its_calls_next_attempt() -> None:
    # Client a's 1st write was lost and sent again (the same idempotency key): the re-send
    # is the 2nd attempt of the 1st write, and the next write is still the 2nd, as the
    # proxy counts them for pins (lab.faults.pins.Ordinals).
    write = {"jsonrpc_method": "tools/call", "tool": "ledger.append"}
    tap = [
        _flow("w1", T0 + 1.0, "a:2", "POST", idempotency_key="k1", **write),
        _flow("w1-again", T0 + 2.0, "a:3", "POST", idempotency_key="k1", faults=[_fault_entry("strip_session_id", "d1")], **write),
        _flow("w2", T0 + 3.0, "a:4", "POST", idempotency_key="k2", faults=[_fault_entry("kill_session", "d2")], **write),
    ]  # fmt: skip
    data = run_data_from_records(run={"started_at": T0}, tap=tap)
    rows = {t.fault: t for t in triggers(Context(data, parse_budgets(data.run)))}
    again, second = rows["strip_session_id"], rows["kill_session"]
    assert (again.ordinal, again.attempt, second.ordinal, second.attempt) == (1, 2, 2, 1)
    assert again.sentence() == (
        "strip_session_id on the 1st `POST tools/call ledger.append` of client a (its 2nd attempt)"
    )
    assert second.sentence() == "kill_session on the 2nd `POST tools/call ledger.append` of client a"


def test_lab_report_writes_every_firing_to_fault_triggers_jsonl(tmp_path: Path) -> None:
    run_dir = clean_run().sim.write(tmp_path / "run")
    code = report_run(run_dir, figures=False, quiet=True, out=io.StringIO(), err=io.StringIO())
    assert code in (0, 1, 2)
    doc = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    lines = (run_dir / "fault_triggers.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines]
    fired = {c["fault"]: c["total"] for c in doc["faults"]["counts"] if c["total"]}
    assert fired, "the clean run fires faults"
    assert Counter(r["fault"] for r in rows) == Counter(fired)
    assert doc["fault_triggers"]["firings"] == len(rows)
    assert all(r["schema"] == SCHEMA and set(r) >= {*Trigger.__slots__, "sentence"} for r in rows)
    for page in ("report.md", "report.html"):
        said = (run_dir / page).read_text(encoding="utf-8")
        assert f"{len(rows)} firings, each named by what a later run can meet again" in said, page
