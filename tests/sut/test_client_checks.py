"""The checks of a client under test (lab.checker.judge.under_test), on run folders written by hand
(tests/sut/wire_builder.py): each catches its bad case, with a witness that points at the
wire, and passes the good one. No process is started: the checker reads files only."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.checker.judge.verdict import judge_dir
from lab.checker.model import Attribution, GateResult, RunReport, Verdict
from lab.report.document import document
from lab.report.markdown import render
from tests.sut.wire_builder import T0, Wire

STORM = {"id": "storm-x", "kind": "storm", "params": {"retry_after": 2.0, "send_retry_after": True}}
STORM_FAULT = [{"fault": "storm", "rule": "storm-x", "decision": "d_2", "detail": {"status": 503}}]


def judged(tmp_path: Path, wire: Wire, name: str = "run") -> RunReport:
    _data, report = judge_dir(wire.write(tmp_path / name))
    return report


def gate(report: RunReport, gate_id: str) -> GateResult:
    return next(g for g in report.gates if g.gate == gate_id)


def client_witnesses(g: GateResult) -> list[str]:
    """Each witness's check, after asserting it blames the client and points at the tap."""
    for w in g.witnesses:
        assert w.attribution is Attribution.CLIENT
        assert any(
            r.startswith("proxy/tap.jsonl:") or r.startswith("clients/app-0.jsonl:") for r in w.refs
        ), w
    return [w.check for w in g.witnesses]


def test_a_client_under_test_is_judged_by_its_own_gates(tmp_path: Path) -> None:
    w = Wire()
    c = w.init("c1", T0)
    w.call(c, T0 + 1, "c1/1")
    report = judged(tmp_path, w)
    assert [g.gate for g in report.gates][-4:] == [
        "client_resume_cursor",
        "client_reconnect_after_gone",
        "client_disconnect_cancel",
        "client_resend",
    ]
    assert report.client is not None and report.client.implementation == "mcp 9.9.9"
    assert all(g.truth_from for g in report.gates if g.gate != "illegal_origin")
    assert any(s.kind == "app_log" and s.status == "ok" for s in report.sources)
    text = render(document(report))  # where each gate's evidence came from, in plain words
    assert "- evidence from: the wire (the proxy's record): " in text and "truth from" not in text


# -- gate 3 -----------------------------------------------------------------------------------


def _after_404(reinitialize: bool) -> Wire:
    w = Wire()
    c = w.init("c1", T0)
    w.call(c, T0 + 1, "c1/1")
    dead = c.session
    w.request(c, T0 + 2, "POST", status=404, session=dead, rpc_method="tools/call", rpc_id=9, key="c1/2")
    if reinitialize:
        w.init("c1", T0 + 2.5)
    w.request(c, T0 + 3, "POST", session=c.session, rpc_method="tools/call", rpc_id=10, key="c1/3")
    return w


def test_gate3_catches_a_client_that_keeps_the_dead_session_id(tmp_path: Path) -> None:
    g = gate(judged(tmp_path, _after_404(reinitialize=False)), "missing_rehandshake")
    assert g.verdict is Verdict.FAIL and g.violations == 1
    assert client_witnesses(g) == ["no_rehandshake"]
    assert "kept using the dead session ID" in g.witnesses[0].explanation
    assert len(g.witnesses[0].refs) == 2  # the 404 and the next request


def test_gate3_passes_a_client_that_initializes_again(tmp_path: Path) -> None:
    g = gate(judged(tmp_path, _after_404(reinitialize=True)), "missing_rehandshake")
    assert g.verdict is Verdict.PASS, g.summary
    assert g.measured["rehandshaken"] == 1


# -- gate 6 -----------------------------------------------------------------------------------


def _resume_into_storm(second_try_after: float, budget: float = 5.0) -> tuple[Wire, float]:
    w = Wire(faults=[STORM])
    c = w.init("c1", T0)
    _flow, ids = w.call(c, T0 + 1, "c1/1", cut_after=1, outcome=None)
    refused = T0 + 1.5
    w.resume(c, refused, ids[-1], status=503, answered_by="proxy", faults=STORM_FAULT)
    w.resume(c, refused + 0.01 + second_try_after, ids[-1], of=("p1", 2, 2), key="c1/1")
    return w, budget


def test_gate6_catches_a_wait_shorter_than_retry_after(tmp_path: Path) -> None:
    w, _ = _resume_into_storm(1.0)
    g = gate(judged(tmp_path, w), "reconnect_qps")
    assert g.verdict is Verdict.FAIL
    assert client_witnesses(g) == ["waited_less_than_advised"]
    assert "Retry-After of its 503 answer" in g.witnesses[0].explanation
    assert g.witnesses[0].row["advised_s"] == 2.0


def test_gate6_passes_a_client_that_waits_what_it_was_told(tmp_path: Path) -> None:
    w, _ = _resume_into_storm(2.5)
    g = gate(judged(tmp_path, w), "reconnect_qps")
    assert g.verdict is Verdict.PASS, g.summary
    assert g.measured["with_advice"] == 1 and g.measured["by_kind"] == {"resume": 2}


def test_gate6_counts_every_client_against_the_budget(tmp_path: Path) -> None:
    w = Wire()
    for i in range(4):
        c = w.init(f"c{i}", T0)
        _flow, ids = w.call(c, T0 + 1, f"c{i}/1", cut_after=1, outcome=None)
        w.resume(c, T0 + 2.2 + i * 0.1, ids[-1], of=("p" + str(i + 1), 2, 2), key=f"c{i}/1")
    budgets = {"reconnect_qps": 3.0}
    _data, report = judge_dir(w.write(tmp_path / "run"))
    assert gate(report, "reconnect_qps").verdict is Verdict.PASS  # 4 in a second, budget 5
    tight = w.write(tmp_path / "tight")
    run = (
        (tight / "run.json")
        .read_text()
        .replace('"reconnect_qps": 5.0', f'"reconnect_qps": {budgets["reconnect_qps"]}')
    )
    (tight / "run.json").write_text(run)
    _data, report = judge_dir(tight)
    g = gate(report, "reconnect_qps")
    assert g.verdict is Verdict.FAIL and g.measured["peak_per_s"] == 4
    assert client_witnesses(g) == ["over_budget"]


# -- gate 1 -----------------------------------------------------------------------------------


def _foreign(delivered: bool, numbered: bool = True) -> Wire:
    w = Wire(numbered=numbered)
    a, b = w.init("a", T0), w.init("b", T0)
    flow_b, ids_b = w.call(b, T0 + 1, "b/1")
    flow_a, _ids = w.call(a, T0 + 2, "a/1", progress=1)
    # The proxy injects b's answer into a's stream; a hands it to its application or not.
    answer_b = {"jsonrpc": "2.0", "id": 2, "result": {"content": [{"type": "text", "text": "b/1"}]}}
    from lab.sut.protocol import message_digest

    w.forward(flow_a, 9, T0 + 2.03, ids_b[-1], message_digest(answer_b), (flow_b, 3), fault="inject_foreign")
    if delivered:
        w.deliver(a, T0 + 2.035, answer_b, None)
    return w


@pytest.mark.parametrize("numbered", [True, False])
def test_gate1_catches_a_message_of_another_session_delivered(tmp_path: Path, numbered: bool) -> None:
    # Also when the adapter could not number its requests (one x-lab-conn per client).
    g = gate(judged(tmp_path, _foreign(delivered=True, numbered=numbered)), "cross_stream")
    assert g.verdict is Verdict.FAIL
    assert client_witnesses(g) == ["delivered_foreign"]
    text = g.witnesses[0].explanation
    assert "inject_foreign" in text and "s_b" in text
    assert any(r.startswith("fault:d_") for r in g.witnesses[0].refs)


def test_gate1_passes_a_client_that_drops_the_foreign_message(tmp_path: Path) -> None:
    g = gate(judged(tmp_path, _foreign(delivered=False)), "cross_stream")
    assert g.verdict is Verdict.PASS, (g.summary, g.evidence)
    injected = g.measured["crossings_injected"]
    assert isinstance(injected, int) and injected >= 1


# -- gate 5 -----------------------------------------------------------------------------------


def _lost(recovered: bool) -> Wire:
    w = Wire()
    c = w.init("c1", T0)
    for i in range(3):
        w.call(c, T0 + 1 + i, f"c1/{i}")
    _flow, ids = w.call(c, T0 + 5, "c1/x", cut_after=1, outcome=None)
    if recovered:
        w.resume(c, T0 + 6, ids[-1], of=("p4", 2, 5), key="c1/x")
    else:
        w.outcome(c, T0 + 6, "c1/x", 5, "exception", "stream lost")
    return w


def test_gate5_counts_a_call_that_never_recovered_as_infinite(tmp_path: Path) -> None:
    g = gate(judged(tmp_path, _lost(recovered=False)), "resume_p99")
    assert g.verdict is Verdict.FAIL
    assert g.measured["never_recovered"] == 1 and g.measured["p99_unbounded"] is True
    assert g.witnesses[0].check == "slow_recovery" and "never recovered" in g.witnesses[0].explanation


def test_gate5_measures_a_recovery_from_the_loss_to_the_next_message(tmp_path: Path) -> None:
    g = gate(judged(tmp_path, _lost(recovered=True)), "resume_p99")
    assert g.verdict is Verdict.PASS, g.summary
    assert g.measured["recoveries"] == 1
    p99 = g.measured["p99_s"]
    assert isinstance(p99, float) and 0.9 < p99 < 1.1  # cut at +5.06, answer delivered at +6.031


def _slow_recovery(*, client_wait: float, answer_after: float, retry_ms: int | None = None) -> Wire:
    """Three calls, then one cut after a progress event; the client resumes `client_wait`
    s after the cut, and the server's replay comes `answer_after` s after the request."""
    w = Wire()
    c = w.init("c1", T0)
    for i in range(3):
        w.call(c, T0 + 1 + i, f"c1/{i}")
    _flow, ids = w.call(c, T0 + 5, "c1/x", cut_after=1, outcome=None, retry_ms=retry_ms)
    cut = T0 + 5 + 0.06
    w.resume(c, cut + client_wait, ids[-1], of=("p4", 2, 5), key="c1/x", answer_after=answer_after)
    return w


def _share_p99(g: GateResult, share: str) -> float:
    shares = g.measured["shares"]
    assert isinstance(shares, dict)
    figures = shares[share]
    assert isinstance(figures, dict)
    value = figures["p99_s"]
    assert isinstance(value, float)
    return value


def test_gate5_fails_the_client_under_test_on_its_own_slow_resumption(tmp_path: Path) -> None:
    g = gate(judged(tmp_path, _slow_recovery(client_wait=8.0, answer_after=0.02)), "resume_p99")
    assert g.verdict is Verdict.FAIL, g.summary
    assert g.measured["judged_on"] == "client's share"
    assert 7.9 < _share_p99(g, "client") < 8.1
    assert [w.attribution for w in g.witnesses] == [Attribution.CLIENT]
    assert "client's share 8.0" in g.witnesses[0].explanation


def test_gate5_does_not_blame_the_client_under_test_for_a_slow_target(tmp_path: Path) -> None:
    # The client resumed at once; the target took 8 s to replay: not the client's failure.
    g = gate(judged(tmp_path, _slow_recovery(client_wait=0.01, answer_after=8.0)), "resume_p99")
    assert g.verdict is Verdict.INCONCLUSIVE, g.summary
    assert "limited by the target or the lab" in g.summary
    assert _share_p99(g, "target") > 7.9 and _share_p99(g, "client") < 0.1


def test_gate5_counts_the_wait_a_server_advised_as_the_servers(tmp_path: Path) -> None:
    # The stream advised `retry: 8000`; the client waited exactly that long.
    g = gate(
        judged(tmp_path, _slow_recovery(client_wait=8.0, answer_after=0.02, retry_ms=8000)), "resume_p99"
    )
    assert g.verdict is Verdict.INCONCLUSIVE, g.summary
    assert _share_p99(g, "client") < 0.1


# -- client checks ----------------------------------------------------------------------------


@pytest.mark.parametrize(("stale", "verdict"), [(True, Verdict.FAIL), (False, Verdict.PASS)])
def test_resumption_must_carry_the_last_event_id_seen(tmp_path: Path, stale: bool, verdict: Verdict) -> None:
    w = Wire()
    c = w.init("c1", T0)
    _flow, ids = w.call(c, T0 + 1, "c1/1", cut_after=2, outcome=None)
    w.resume(c, T0 + 2, ids[1] if stale else ids[-1], of=("p1", 3, 2), key="c1/1")
    g = gate(judged(tmp_path, w), "client_resume_cursor")
    assert g.verdict is verdict, g.summary
    if stale:
        assert client_witnesses(g) == ["cursor_not_last_seen"]
        assert ids[-1] in g.witnesses[0].explanation


@pytest.mark.parametrize(("reconnects", "verdict"), [(True, Verdict.FAIL), (False, Verdict.PASS)])
def test_no_reconnect_after_the_session_is_gone(tmp_path: Path, reconnects: bool, verdict: Verdict) -> None:
    w = Wire()
    c = w.init("c1", T0)
    _flow, ids = w.call(c, T0 + 1, "c1/1", cut_after=1, outcome=None)
    dead = c.session
    w.resume(c, T0 + 2, ids[-1], status=404)
    if reconnects:
        w.resume(c, T0 + 3, ids[-1], status=404, session=dead)
    else:
        w.init("c1", T0 + 3)
    g = gate(judged(tmp_path, w), "client_reconnect_after_gone")
    assert g.verdict is verdict, g.summary
    if reconnects:
        assert client_witnesses(g) == ["reconnect_after_gone"]


@pytest.mark.parametrize(("asked", "verdict"), [(False, Verdict.FAIL), (True, Verdict.PASS)])
def test_a_disconnect_is_not_a_cancellation(tmp_path: Path, asked: bool, verdict: Verdict) -> None:
    w = Wire()
    c = w.init("c1", T0)
    w.call(c, T0 + 1, "c1/1", cut_after=1, outcome=None)
    w.request(c, T0 + 1.5, "POST", status=202, session=c.session, rpc_method="notifications/cancelled")
    w.outcome(c, T0 + 1.6, "c1/1", 2, "cancelled" if asked else "exception", "cancel" if asked else "timeout")
    g = gate(judged(tmp_path, w), "client_disconnect_cancel")
    assert g.verdict is verdict, g.summary
    if not asked:
        assert client_witnesses(g) == ["unasked_cancel"]
        assert "c1/1" in g.witnesses[0].explanation and "timeout" in g.witnesses[0].explanation


@pytest.mark.parametrize(("resent", "verdict"), [(True, Verdict.FAIL), (False, Verdict.PASS)])
def test_no_request_resent_without_the_application(tmp_path: Path, resent: bool, verdict: Verdict) -> None:
    w = Wire()
    c = w.init("c1", T0)
    w.call(c, T0 + 1, "c1/1", cut_after=1, outcome=None)
    w.init("c1", T0 + 2)  # a new session
    w.call(c, T0 + 3, "c1/1" if resent else "c1/2")
    g = gate(judged(tmp_path, w), "client_resend")
    assert g.verdict is verdict, g.summary
    if resent:
        assert client_witnesses(g) == ["resent_request"]
        assert "into a new session" in g.witnesses[0].explanation


@pytest.mark.parametrize(
    ("tool", "annotations", "verdict"),
    [
        ("echo", {"readOnlyHint": True}, Verdict.PASS),
        ("clock", {"idempotentHint": True}, Verdict.PASS),
        ("ledger.append", {"readOnlyHint": False, "idempotentHint": False}, Verdict.FAIL),
        ("ledger.append", {}, Verdict.FAIL),  # no hint given: both default to false
        # The server's word that it honours the call's idempotency key for this tool
        # (the tap records its `_meta` flag beside the annotations).
        ("ledger.append", {"idempotentHint": False, "mcp-lab/idempotency-key": True}, Verdict.PASS),
    ],
)
def test_the_retry_rule_allows_a_resend_only_of_a_tool_annotated_safe_or_keyed(
    tmp_path: Path, tool: str, annotations: dict[str, bool], verdict: Verdict
) -> None:
    # The call's answer was lost (its stream cut before the response): its outcome is
    # unknown. The client then sends it again on its own, into a new session.
    w = Wire()
    c = w.init("c1", T0)
    w.tools_list(c, T0 + 0.5, {tool: annotations})
    w.call(c, T0 + 1, "c1/1", cut_after=1, outcome=None, tool=tool)
    w.init("c1", T0 + 2)
    w.call(c, T0 + 3, "c1/1", tool=tool)
    g = gate(judged(tmp_path, w), "client_resend")
    assert g.verdict is verdict, g.summary
    assert g.measured["resent_allowed"] == (1 if verdict is Verdict.PASS else 0)
    if verdict is Verdict.FAIL:
        assert client_witnesses(g) == ["resent_request"]
        assert (
            f"({tool})" in g.witnesses[0].explanation
            and "had to be reported so" in g.witnesses[0].explanation
        )


def test_the_retry_rule_reads_only_what_the_client_was_told_before_it_resent(tmp_path: Path) -> None:
    # The read-only annotation came in a tools/list answered after the re-send: the client
    # could not know it, so the re-send is a finding, worded as never annotated to it.
    w = Wire()
    c = w.init("c1", T0)
    w.call(c, T0 + 1, "c1/1", cut_after=1, outcome=None)
    w.init("c1", T0 + 2)
    w.call(c, T0 + 3, "c1/1")
    w.tools_list(c, T0 + 4, {"echo": {"readOnlyHint": True}})
    g = gate(judged(tmp_path, w), "client_resend")
    assert g.verdict is Verdict.FAIL, g.summary
    assert "never annotated to it" in g.witnesses[0].explanation


@pytest.mark.parametrize(
    ("version", "same_id", "verdict"),
    [
        ("2026-07-28", True, Verdict.FAIL),
        ("2026-07-28", False, Verdict.PASS),
        # The rule is the modern era's: a handshake-era re-send is judged by the retry rule only.
        ("2025-11-25", True, Verdict.PASS),
    ],
)
def test_a_modern_reissue_carries_a_new_request_id(
    tmp_path: Path, version: str, same_id: bool, verdict: Verdict
) -> None:
    # A read-only call whose stream broke (the cancellation of its request in the modern
    # era) is re-issued, as it may be: under a new request ID, or under the old one.
    w = Wire()
    c = w.init("c1", T0)
    w.tools_list(c, T0 + 0.5, {"echo": {"readOnlyHint": True}})
    first, _ = w.call(c, T0 + 1, "c1/1", cut_after=1, outcome=None)
    again, _ = w.call(c, T0 + 2, "c1/1")
    flows = {r["flow"]: r for r in w.tap if r["type"] == "flow"}
    for f in (first, again):
        flows[f]["protocol_version_in"] = version
    if same_id:
        flows[again]["jsonrpc_id"] = flows[first]["jsonrpc_id"]
    g = gate(judged(tmp_path, w), "client_resend")
    assert g.verdict is verdict, g.summary
    assert g.measured["resent_allowed"] == 1 and g.measured["resent"] == 0
    assert g.measured["modern_reissues"] == (1 if version == "2026-07-28" else 0)
    if verdict is Verdict.FAIL:
        assert client_witnesses(g) == ["reissued_same_id"]
        assert "under request ID" in g.witnesses[0].explanation and g.violations == 1


# -- known failures ---------------------------------------------------------------------------


def test_a_known_failure_does_not_fail_the_run_and_a_fixed_one_does(tmp_path: Path) -> None:
    plain = judged(tmp_path, _after_404(reinitialize=False), "plain")
    assert plain.verdict is Verdict.FAIL
    failing = {g.gate for g in plain.gates if g.verdict is Verdict.FAIL}
    assert "missing_rehandshake" in failing

    known = _after_404(reinitialize=False)
    known.expected_failures = sorted(failing)
    report = judged(tmp_path, known, "known")
    assert report.verdict is not Verdict.FAIL  # every failure is a known one
    assert {e.status for e in report.expectations} == {"known"}
    assert gate(report, "missing_rehandshake").verdict is Verdict.FAIL  # the gate still says so
    text = render(document(report))
    assert "**FAIL** (known)" in text and "known failure (in the baseline)" in text

    fixed = _after_404(reinitialize=True)
    fixed.expected_failures = ["missing_rehandshake"]
    report = judged(tmp_path, fixed, "fixed")
    assert gate(report, "missing_rehandshake").verdict is Verdict.PASS
    assert [e.status for e in report.expectations] == ["fixed"]
    assert report.verdict is Verdict.FAIL
    assert "fixed: remove it from the baseline" in render(document(report))


# -- inputs -----------------------------------------------------------------------------------


def test_a_damaged_application_log_is_refused_by_name(tmp_path: Path) -> None:
    w = Wire()
    w.init("c1", T0)
    run = w.write(tmp_path / "run")
    log = run / "clients" / "app-0.jsonl"
    log.write_text(log.read_text() + '{"ev": "deliver", "t": 1}\n')
    _data, report = judge_dir(run)
    assert report.verdict is Verdict.INCONCLUSIVE
    assert any(p.path == "clients/app-0.jsonl" and "deliver" in p.message for p in report.problems)
    assert gate(report, "resume_p99").verdict is Verdict.INCONCLUSIVE
