"""Check 15 from the wire: a modern-era request whose mirrored header the proxy made
disagree with its body must be refused with 400, and no modern-era answer carries a
session ID (lab.checker.rules.modern_requests). Each violation is shown to fail the check,
and the honest answers to pass it."""

from __future__ import annotations

from typing import Any

import pytest

from lab.checker import gate_check, run_data_from_records
from lab.checker.model import Verdict
from lab.checker.rules import modern_requests

MODERN = "2026-07-28"
MISMATCH = {
    "fault": "mismatch_header",
    "rule": "mismatch_header#0",
    "decision": "d-1",
    "detail": {"header": "name", "sent": "echo-not-this-one"},
}


def flow(n: int, *, status: int = 200, version: str | None = MODERN, **extra: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "type": "flow",
        "flow": f"f{n}",
        "t": 1000.0 + n,
        "conn": f"c{n}:1",
        "method": "POST",
        "path": "/mcp",
        "stream": "post",
        "session": None,
        "session_out": None,
        "jsonrpc_id": n,
        "jsonrpc_method": "tools/call",
        "tool": "echo",
        "idempotency_key": None,
        "origin_in": None,
        "origin_out": None,
        "origin_allowed_out": True,
        "last_event_id_in": None,
        "last_event_id_out": None,
        "protocol_version_in": version,
        "protocol_version_out": version,
        "status": status,
        "answered_by": "server",
        "faults": [],
    }
    record.update(extra)
    return record


def judged(*flows: dict[str, Any]) -> Any:
    run = {"schema": "mcpLabRun.v1", "run_id": "r", "complete": True, "target": {"era": "modern"}}
    return gate_check(run_data_from_records(run=run, tap=list(flows)), modern_requests)


def test_refused_mismatches_and_no_session_pass() -> None:
    g = judged(flow(1), flow(2, status=400, faults=[MISMATCH]))
    assert g.verdict is Verdict.PASS, g.summary
    assert g.measured["mismatched"] == 1 and g.measured["mismatch_refused_400"] == 1


def test_a_mismatch_refused_for_another_reason_first_is_noted_not_judged() -> None:
    # Seen on the pristine server: the proxy also made the Origin illegal, and the Origin
    # check answers first (403).
    origin = {"fault": "rewrite_origin", "rule": "rewrite_origin#0", "decision": "d-2"}
    g = judged(
        flow(1), flow(2, status=400, faults=[MISMATCH]), flow(3, status=403, faults=[origin, MISMATCH])
    )
    assert g.verdict is Verdict.PASS and g.violations == 0, g.summary
    assert g.measured["mismatch_refused_otherwise"] == 1 and "another reason" in g.notes[0]


@pytest.mark.parametrize(
    ("bad", "check"),
    [
        (flow(2, status=200, faults=[MISMATCH]), "mismatch_accepted"),
        (flow(3, session_out="s_4f2a"), "session_minted"),
    ],
)
def test_each_violation_fails_the_check_with_a_server_witness(bad: dict[str, Any], check: str) -> None:
    g = judged(flow(1), flow(4, status=400, faults=[MISMATCH]), bad)
    assert g.verdict is Verdict.FAIL and g.violations == 1
    (w,) = g.witnesses
    assert w.check == check and w.attribution == "server" and w.row["flow"] == bad["flow"]


def test_handshake_flows_are_not_judged_and_no_mismatch_is_no_evidence() -> None:
    # A handshake-era answer with a session is the rule of that era, not a violation here.
    g = judged(flow(1), flow(2, version="2025-11-25", session_out="s_1"))
    assert g.verdict is Verdict.INCONCLUSIVE and g.violations == 0
    assert [e.name for e in g.evidence if not e.ok] == ["mismatched headers injected"]
