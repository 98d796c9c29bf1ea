"""The checker reads JSON-lines ledgers in pieces, by a fast path and a general one, and
holds one object per distinct text across a run's ledgers (lab.checker.inputs.columns,
jsonl, jsonl_fast). None of that may change what the gates see."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from lab.checker.inputs import jsonl, jsonl_fast
from lab.checker.inputs.jsonl import LINE, LedgerError, read_jsonl
from lab.checker.inputs.load import load_run
from lab.checker.inputs.schemas import TAP_RECORDS, TAP_SCHEMA
from tests.checker.builders import clean_run
from tests.helpers.fast_path import fast_path_outcomes


def _varied_tap() -> list[dict[str, Any]]:
    """A tap with every shape the readers must agree on: short forms and explicit forwards,
    flows with and without optional fields, a record type the contract does not define, a
    field no writer is known to add, nulls where numbers usually are."""
    records: list[dict[str, Any]] = [
        {"type": "plan", "t": 1.0, "source": "p", "digest": "d", "error": None, "version": 1, "rules": []}
    ]
    for f in range(12):
        flow = f"flow-{f}"
        records.append(
            {
                "type": "flow", "flow": flow, "t": 2.0 + f, "conn": f"c{f % 3}:1", "method": "POST",
                "path": "/mcp", "session": f"s_{f % 4}", "jsonrpc_id": f if f % 2 else None,
                "jsonrpc_method": "tools/call", "idempotency_key": None, "origin_in": None,
                "origin_out": None, "origin_allowed_out": None, "last_event_id_in": None,
                "last_event_id_out": None, "status": 200 if f != 5 else None, "answered_by": "server",
                "faults": ["cut_stream"] if f == 7 else [],
                **({"t_request": 1.5 + f} if f % 3 == 0 else {}),
            }
        )  # fmt: skip
        for i in range(30):
            sent = {
                "type": "sent", "flow": flow, "t": 3.0 + f + i / 100, "index": i,
                "event_id": f"e1.{f}.{i}" if i else None, "digest": f"{f:02d}{i:062d}", "has_data": True,
                "priming": i == 0, "stream_id": f"p{f}", "session": f"s_{f % 4}", "retry": 500 if i == 0 else None,
            }  # fmt: skip
            if f == 9 and i == 4:
                records.append({"type": "metrics", "t": 1.0})  # not in the contract: skipped
            if f == 10 and i == 2:
                sent["new_field"] = "x"  # not a known field: its piece goes the general way
            if (f + i) % 11 == 0:  # a faulted forward keeps its own record
                records += [
                    sent,
                    {
                        "type": "forwarded", "flow": flow, "t": sent["t"], "index": i, "event_id": "other",
                        "digest": sent["digest"], "source": {"flow": f"flow-{(f + 1) % 12}", "index": i},
                        "fault": "cross_ids", "rule": "cross_ids#0", "decision": f"d_{f}_{i}",
                    },
                ]  # fmt: skip
            else:
                records.append({**sent, "fwd": i})
        records.append({"type": "flow_end", "flow": flow, "t": 4.0 + f, "reason": "complete"})
    return records


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _assert_same(a: jsonl.JsonlFrames, b: jsonl.JsonlFrames) -> None:
    assert a.lines == b.lines and a.notes == b.notes
    for kind in TAP_RECORDS:
        fa, fb = a.frames[kind], b.frames[kind]
        pd.testing.assert_frame_equal(
            fa[sorted(fa.columns)], fb[sorted(fb.columns)], check_index_type=False, obj=kind
        )


def test_a_tap_read_in_many_pieces_gives_the_frames_of_one_piece(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tap = _write(tmp_path / "tap.jsonl", _varied_tap())
    monkeypatch.setattr(jsonl, "PIECE_BYTES", 1 << 30)
    whole = read_jsonl(tap, "tap", TAP_RECORDS, TAP_SCHEMA)
    # Pieces of 700 bytes: most hold one or two lines, a flow line is longer than a piece.
    monkeypatch.setattr(jsonl, "PIECE_BYTES", 700)
    pieces = read_jsonl(tap, "tap", TAP_RECORDS, TAP_SCHEMA)
    _assert_same(whole, pieces)
    assert len(whole.frames["sent"]) == 360 and len(whole.frames["forwarded"]) == 360
    assert whole.notes == ["tap: skipped records of types mcpLabTap.v1 does not define: 1 'metrics'"]
    # Line numbers point at the file's own lines, whatever the piece.
    lines = tap.read_text(encoding="utf-8").splitlines()
    for _, row in pieces.frames["forwarded"].iloc[::37].iterrows():
        record = json.loads(lines[int(row[LINE]) - 1])
        assert record["flow"] == row["flow"] and record["index"] in (row["index"], row["src_index"])


def test_the_fast_and_the_general_path_give_the_same_frames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tap = _write(tmp_path / "tap.jsonl", _varied_tap())
    monkeypatch.setattr(jsonl, "PIECE_BYTES", 4096)
    outcomes = fast_path_outcomes(monkeypatch)
    mixed = read_jsonl(tap, "tap", TAP_RECORDS, TAP_SCHEMA)
    # Both paths were taken: the unknown type and the unknown field sent their pieces the
    # general way, the others went the fast way.
    assert outcomes.count(True) > 10 and 1 <= outcomes.count(False) <= 3
    monkeypatch.setattr(jsonl_fast, "decode_piece", lambda *args, **kwargs: None)
    general = read_jsonl(tap, "tap", TAP_RECORDS, TAP_SCHEMA)
    _assert_same(mixed, general)
    assert "new_field" in general.frames["sent"].columns
    # Text columns stay object columns (not pandas 3's `str`), numbers are numbers.
    sent = general.frames["sent"]
    assert (
        sent["event_id"].dtype == object and sent["t"].dtype == "float64" and sent["index"].dtype == "int64"
    )


def test_a_bad_line_in_a_later_piece_is_named_by_its_line_in_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = _varied_tap()
    lines = [json.dumps(r) for r in records]
    lines[156] = lines[156][:-1]  # line 157 loses its closing brace
    tap = tmp_path / "tap.jsonl"
    tap.write_text("\n".join(lines) + "\n", encoding="utf-8")
    monkeypatch.setattr(jsonl, "PIECE_BYTES", 2000)
    with pytest.raises(LedgerError, match=r"^tap: line 157 is not JSON"):
        read_jsonl(tap, "tap", TAP_RECORDS, TAP_SCHEMA)


def test_a_last_line_cut_across_pieces_is_read_up_to_the_cut_and_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = _varied_tap()
    text = "".join(json.dumps(r) + "\n" for r in records)
    tap = tmp_path / "tap.jsonl"
    tap.write_text(text + json.dumps(records[3])[:-40], encoding="utf-8")  # a writer killed mid-line
    monkeypatch.setattr(jsonl, "PIECE_BYTES", 50)  # the cut line spans several pieces
    read = read_jsonl(tap, "tap", TAP_RECORDS, TAP_SCHEMA)
    assert read.lines == len(records)
    cut = [n for n in read.notes if "cut off" in n]
    assert cut == ["tap: the last line is cut off (the writer stopped mid-line); it was ignored"]


def test_one_text_object_per_distinct_text_across_a_runs_ledgers(tmp_path: Path) -> None:
    # An event ID is in the tap, the inbox and the outbox: read once, held once.
    data = load_run(clean_run().sim.write(tmp_path / "run"))
    assert data.tap is not None and data.client is not None
    sent = data.tap["sent"].dropna(subset=["event_id"])
    tap_ids = {v: v for v in sent["event_id"].tolist()}
    inbox = data.client["inbox"]
    shared = [v for v in inbox["event_id"].tolist() if v in tap_ids]
    assert shared, "the clean run's receipts name events the tap saw"
    assert all(v is tap_ids[v] for v in shared)
    digests = {v: v for v in sent["digest"].tolist()}
    assert all(v is digests[v] for v in inbox["message_digest"].tolist() if v in digests)
