"""The checker's inputs built in memory judge exactly as the same rows written to files:
what property tests call instead of re-implementing the gates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lab.checker import gate_check, judge, judge_records, run_data_from_records
from lab.checker.inputs.jsonl import LedgerError
from lab.checker.judge.verdict import judge_dir
from lab.checker.model import Verdict
from lab.checker.rules import cross_stream, duplicates
from lab.client import DedupKey, InboxReceipt
from lab.wire.client_ledger import HttpExchange, Recovery
from tests.checker.builders import Sim, clean_run


def _rows(sim: Sim) -> dict[str, Any]:
    inbox = sim.client_rows.get("inbox", [])
    outbox = sim.client_rows.get("outbox", [])
    client = [
        {"table": table, **row}
        for table, rows in sim.client_rows.items()
        if table not in ("inbox", "outbox")
        for row in rows
    ]
    return {
        "run": sim.run_json(),
        "client": client,
        "inbox": inbox,
        "outbox": outbox,
        "server": sim.server_rows,
        "tap": sim.tap,
        "nemesis": sim.nemesis,
    }


def _as_records(client: list[dict[str, Any]]) -> list[Any]:
    """The client rows as the `lab.wire.client_ledger` records the core emits."""
    from lab.wire.client_ledger import RECORD_TYPES

    types = {t.table: t for t in RECORD_TYPES}
    out = []
    for row in client:
        rtype = types[row.pop("table")]
        fields = {
            k: (bool(v) if k in ("carried_session", "write", "reinitialized") else v) for k, v in row.items()
        }
        out.append(rtype(**fields))
    return out


@pytest.mark.parametrize("broken", [False, True])
def test_in_memory_records_are_judged_exactly_as_the_same_run_folder(tmp_path: Path, broken: bool) -> None:
    run = clean_run()
    sim = run.sim
    if broken:  # a server that replays another stream's event, and a duplicate write
        sim.cut_and_resume(run.post_b)
        sim.send(run.post_b, json.dumps({"jsonrpc": "2.0", "method": "g"}), minted_for=run.get_b)
        sim.dispatch("b", "op-b-9", 4, "performed")
        sim.dispatch("b", "op-b-9", 5, "performed")
    _, from_files = judge_dir(sim.write(tmp_path / "run"))
    rows = _rows(sim)
    rows["client"] = _as_records(rows["client"])
    from_memory = judge(run_data_from_records(**rows))
    assert from_memory.verdict is from_files.verdict is (Verdict.FAIL if broken else Verdict.PASS)
    for mem, disk in zip(from_memory.gates, from_files.gates, strict=True):
        assert (mem.gate, mem.verdict, mem.violations) == (disk.gate, disk.verdict, disk.violations)
        assert dict(mem.measured) == dict(disk.measured), mem.gate
        assert [w.check for w in mem.witnesses] == [w.check for w in disk.witnesses]


def test_one_gate_on_records_as_the_client_core_holds_them() -> None:
    # What a state machine has in hand: core records and its in-memory inbox's receipts.
    sim = clean_run().sim
    rows = _rows(sim)
    receipts = [
        InboxReceipt(
            client_id=r["client_id"],
            key=DedupKey(r["session_generation"], r["stream_key"], r["event_id"], r["message_digest"]),
            sequence=r["sequence"],
            server_stream_id=r["server_stream_id"],
            kind=r["kind"],
            jsonrpc_id=r["jsonrpc_id"],
            method=r["method"],
            conn_id=r["conn_id"],
            accepted_at=r["accepted_at"],
            data=r["data"],
        )
        for r in rows["inbox"]
    ]
    rows["inbox"] = receipts
    rows["client"] = _as_records(rows["client"])
    data = run_data_from_records(**rows)
    g1 = gate_check(data, cross_stream)
    assert g1.verdict is Verdict.PASS and g1.measured["verified"] == 15
    # The same receipts with one more, a's progress on its call filed under its GET
    # stream: the real gate catches it (no re-implementation of the rule here).
    wrong = next(
        r
        for r in receipts
        if r.client_id == "a" and r.kind == "notification" and r.key.stream_key == "post:2"
    )
    data = run_data_from_records(**{**rows, "inbox": [*receipts, _moved(wrong, "get:1")]})
    g1 = gate_check(data, cross_stream)
    assert g1.verdict is Verdict.FAIL and [w.check for w in g1.witnesses] == ["not_sent_on_stream"]
    assert gate_check(data, duplicates).verdict is Verdict.PASS


def _fields(obj: Any) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def _moved(receipt: InboxReceipt, stream_key: str) -> InboxReceipt:
    key = receipt.key
    return InboxReceipt(
        **{
            **_fields(receipt),
            "key": DedupKey(key.session_generation, stream_key, key.event_id, key.message_digest),
        }
    )


def test_rows_missing_a_contract_field_are_refused_by_name() -> None:
    sim = clean_run().sim
    rows = _rows(sim)
    rows["client"] = [
        HttpExchange("a", 1, "call", "POST", "post:1", 200, None, 1, True, 1.0, 2.0, "", None),
        Recovery("a", "post:1", None, "connection_lost", 1.0, None, "resumed", 1, False),
    ]
    rows["tap"] = [{"type": "sent", "flow": "f1", "t": 1.0}]  # lacks index, event_id, ...
    with pytest.raises(LedgerError, match=r"^tap sent: rows lack field\(s\) index"):
        run_data_from_records(**rows)


def test_judge_records_gives_the_whole_verdict() -> None:
    sim = clean_run().sim
    sim.complete = False
    rows = _rows(sim)
    rows["client"] = _as_records(rows["client"])
    assert judge_records(**rows).verdict is Verdict.INCOMPLETE


@pytest.mark.parametrize("complete", [True, False])
def test_a_run_cut_short_cannot_fail_on_liveness_alone(complete: bool) -> None:
    # A recovery that never ended: gate 5 fails. In a finished run that is the target's
    # failure; in a run cut short it may be the cut itself, so the run is incomplete.
    run = clean_run()
    run.sim.recovered(run.post_b, run.sim.t, None, path="abandoned")
    run.sim.tick(10.0)  # the run went on long after: the loss had its chance (not censored)
    run.sim.complete = complete
    rows = _rows(run.sim)
    rows["client"] = _as_records(rows["client"])
    report = judge_records(**rows)
    assert {g.number: g.verdict for g in report.gates}[5] is Verdict.FAIL
    assert report.verdict is (Verdict.FAIL if complete else Verdict.INCOMPLETE)
