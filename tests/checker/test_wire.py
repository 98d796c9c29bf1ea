"""Gate 1 from the wire alone (black box: opaque event IDs, no server ledger): where an
event belongs is decided by where the server first sent it, across all sessions; what
the server sent wrong is a server violation even when every client rejected it; what is
legitimate (IDs reused across sessions, equal content) passes."""

from __future__ import annotations

import json
from pathlib import Path

from lab.checker.judge.verdict import judge_dir
from lab.checker.model import Attribution, GateResult, Verdict
from tests.checker.builders import Sim, Stream

_N = iter(range(1_000_000))


def _msg(tag: str) -> str:
    """A distinct progress notification."""
    return json.dumps(
        {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"n": next(_N), "t": tag}}
    )


def _gate1(sim: Sim, tmp_path: Path, name: str = "run", *, server: bool = False) -> GateResult:
    _, report = judge_dir(sim.write(tmp_path / name, server=server))
    return next(g for g in report.gates if g.gate == "cross_stream")


def _two_sessions(*, per_session_ids: bool = False, tap_kinds: bool = False) -> tuple[Sim, Stream, Stream]:
    """Clients a and b, each with a tool call streaming progress, on a server with opaque
    IDs; a crossing fault (rejected) so gate 1 has its evidence."""
    sim = Sim(opaque_ids=True, per_session_ids=per_session_ids, tap_kinds=tap_kinds)
    sim.budgets["min_events"] = 5
    sim.initialize("a")
    sim.initialize("b")
    post_a = sim.call("a", 1)
    post_b = sim.call("b", 1)  # the same request id in both sessions, as real clients number them
    for _ in range(3):
        sim.send(post_a, _msg("a"))
        sim.send(post_b, _msg("b"))
    crossed = sim.send(post_a, _msg("x"), accept=False)
    sim.forward_foreign(post_b, crossed, accept=False)
    return sim, post_a, post_b


def _server(g: GateResult) -> list[tuple[str, Attribution]]:
    return [(w.check, w.attribution) for w in g.witnesses if w.attribution is Attribution.SERVER]


def test_a_replay_of_another_sessions_event_fails_even_when_every_client_rejected_it(tmp_path: Path) -> None:
    # One event store for all sessions: b resumes its call (request 1) and the server
    # replays a's events of "request 1" onto it. b rejects them; the server is still wrong.
    sim, post_a, post_b = _two_sessions()
    leaked = sim.send(post_a, _msg("a-secret"))
    sim.cut_and_resume(post_b)
    sim.resend(post_b, leaked, accept=False)
    g = _gate1(sim, tmp_path)
    assert g.verdict is Verdict.FAIL
    assert _server(g) == [("sent_off_home", Attribution.SERVER)]
    (w,) = g.witnesses
    assert w.row["event_id"] == leaked.event_id and w.row["foreign_session"] is True
    # The witness names both streams: the home (a's call) and where it was sent (b's).
    assert f"flow:{post_a.flow}" in w.explanation and "of another session" in w.explanation
    assert "resumption GET" in w.explanation and str(w.row["on_logical"]) != str(w.row["home"])
    assert g.measured["foreign_session_replays"] == 1 and g.attribution_counts["client"] == 0
    assert len(w.refs) == 2 and all(r.startswith("proxy/tap.jsonl:") for r in w.refs)


def test_a_foreign_replay_that_reaches_the_proxy_before_the_live_copy_is_still_the_replay(
    tmp_path: Path,
) -> None:
    """One event store for every session can hand a's resumption an event of b's before
    b's own live copy reaches the proxy (seen 43 ms apart). The replay on a's stream is
    the misplaced send; b's live send is at home."""
    sim, post_a, post_b = _two_sessions()
    live = sim.send(post_b, _msg("b-live"))
    record = next(r for r in reversed(sim.tap) if r["type"] == "sent" and r["event_id"] == live.event_id)
    sim.cut_and_resume(post_a)
    replay = sim.resend(post_a, live, accept=False)
    replay_t = next(r for r in reversed(sim.tap) if r["type"] == "sent" and r["flow"] == replay.flow)["t"]
    record["t"] = replay_t + 0.043  # the live copy is seen after the replay
    g = _gate1(sim, tmp_path)
    assert g.verdict is Verdict.FAIL and _server(g) == [("sent_off_home", Attribution.SERVER)]
    (w,) = g.witnesses
    assert w.row["event_id"] == live.event_id and w.row["foreign_session"] is True
    assert "resumption GET" in w.explanation


def test_a_client_that_accepts_a_foreign_replay_is_also_in_violation(tmp_path: Path) -> None:
    sim, post_a, post_b = _two_sessions()
    leaked = sim.send(post_a, _msg("a-secret"))
    sim.cut_and_resume(post_b)
    sim.resend(post_b, leaked, accept=True)
    g = _gate1(sim, tmp_path)
    assert g.verdict is Verdict.FAIL and g.attribution_counts == {
        "server": 1,
        "client": 1,
        "proxy_fault_rejected": 1,
    }
    server, client = g.witnesses
    assert server.attribution is Attribution.SERVER and client.attribution is Attribution.CLIENT
    assert client.check == "not_sent_on_stream" and client.row["event_id"] == leaked.event_id
    (ref,) = client.refs
    assert ref.startswith("clients/worker-1.sqlite#inbox/")


def test_per_session_numbering_with_different_content_passes(tmp_path: Path) -> None:
    sim, post_a, post_b = _two_sessions(per_session_ids=True)
    assert {r["event_id"] for r in sim.tap if r["type"] == "sent" and r["flow"] == post_b.flow} & {
        r["event_id"] for r in sim.tap if r["type"] == "sent" and r["flow"] == post_a.flow
    }, "both sessions use the same IDs"
    # Each session resumes and gets its own next events (same IDs as the other's, other content).
    for st in (post_a, post_b):
        sim.cut_and_resume(st)
        sim.send(st, _msg(st.client))
    g = _gate1(sim, tmp_path)
    assert g.verdict is Verdict.PASS, [w.explanation for w in g.witnesses]
    assert g.measured["server_violations"] == 0 and g.measured["verified"] == g.measured["receipts_checked"]


def test_identical_broadcast_content_under_per_session_ids_passes(tmp_path: Path) -> None:
    sim, _, _ = _two_sessions(per_session_ids=True)
    get_a, get_b = sim.open_get("a"), sim.open_get("b")
    for n in range(3):
        same = json.dumps({"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"n": n}})
        sim.send(get_a, same)
        sim.send(get_b, same)  # same ID in its session, same content, another session
    # b's GET is cut after the server sent one more (the client missed it): the replay
    # delivers it again, identical to what a was sent before.
    missed = json.dumps({"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"n": 9}})
    sim.send(get_a, missed)
    ev = sim.send(get_b, missed, accept=False)
    sim.cut_and_resume(get_b)
    sim.resend(get_b, ev)
    g = _gate1(sim, tmp_path)
    assert g.verdict is Verdict.PASS, [w.explanation for w in g.witnesses]
    assert g.measured["server_violations"] == 0


def test_an_event_first_sent_on_a_resumption_equal_to_another_sessions_passes(tmp_path: Path) -> None:
    # Per-session IDs, identical content (a ticker's progress with per-session tokens):
    # b was disconnected when its event 5 was made, so the server first sends it on b's
    # resumption; a had been sent its own event 5, equal in ID and content, live before.
    sim, post_a, post_b = _two_sessions(per_session_ids=True)
    same = json.dumps({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 5}})
    sim.send(post_a, same)
    sim.cut_and_resume(post_b)
    sim.send(post_b, same)
    g = _gate1(sim, tmp_path)
    assert g.verdict is Verdict.PASS, [w.explanation for w in g.witnesses]
    assert g.measured["ids_shared_across_sessions"] == 4 and "per session" in g.notes[0]  # 1..4 in both


def test_a_replay_of_events_at_or_before_the_cursor_is_a_server_violation(tmp_path: Path) -> None:
    sim, post_a, _ = _two_sessions()
    early = sim.send(post_a, _msg("early"))
    sim.send(post_a, _msg("cursor"))
    sim.cut_and_resume(post_a)  # Last-Event-ID: the last event a accepted
    sim.resend(post_a, early, accept=False)  # the server ignores the cursor
    g = _gate1(sim, tmp_path)
    assert g.verdict is Verdict.FAIL
    (w,) = g.witnesses
    assert (w.check, w.attribution) == ("replayed_before_cursor", Attribution.SERVER)
    assert w.row["event_id"] == early.event_id and "cursor" in w.explanation


def test_a_response_on_a_standalone_get_is_a_server_violation(tmp_path: Path) -> None:
    sim, _, _ = _two_sessions(tap_kinds=True)
    get = sim.open_get("a")
    sim.send(
        get,
        json.dumps({"jsonrpc": "2.0", "id": 1, "result": {}}),
        kind="response",
        jsonrpc_id="1",
        accept=False,
    )
    g = _gate1(sim, tmp_path)
    assert g.verdict is Verdict.FAIL
    assert _server(g) == [("response_on_standalone_get", Attribution.SERVER)]


def test_a_response_on_the_resumption_of_its_post_stream_is_fine(tmp_path: Path) -> None:
    sim, post_a, _ = _two_sessions(tap_kinds=True)
    sim.cut_and_resume(post_a)
    sim.respond(post_a)
    g = _gate1(sim, tmp_path)
    assert g.verdict is Verdict.PASS, [w.explanation for w in g.witnesses]


def test_events_after_the_response_on_a_post_stream_are_a_server_violation(tmp_path: Path) -> None:
    sim, post_a, _ = _two_sessions()
    sim.respond(post_a)
    late = sim.send(post_a, _msg("late"), accept=False)
    g = _gate1(sim, tmp_path)
    assert g.verdict is Verdict.FAIL
    (w,) = g.witnesses
    assert (w.check, w.row["event_id"]) == ("event_after_response", late.event_id)


def test_a_replay_that_delivers_the_response_before_its_progress_is_a_server_violation(
    tmp_path: Path,
) -> None:
    sim, post_a, _ = _two_sessions()
    # The server sent the last progress and the response; the connection was gone.
    progress = sim.send(post_a, _msg("last"), accept=False)
    response = sim.respond(post_a, accept=False)
    sim.cut_and_resume(post_a)
    sim.resend(post_a, response)  # replayed first...
    sim.resend(post_a, progress, accept=False)  # ...then the progress, out of order
    g = _gate1(sim, tmp_path)
    assert g.verdict is Verdict.FAIL
    (w,) = g.witnesses
    assert w.attribution is Attribution.SERVER and w.row["event_id"] == progress.event_id
    assert w.check in ("event_after_response", "replayed_out_of_order")


def test_a_replay_out_of_the_order_of_first_sending_is_a_server_violation(tmp_path: Path) -> None:
    sim, post_a, _ = _two_sessions()
    first = sim.send(post_a, _msg("1"), accept=False)
    second = sim.send(post_a, _msg("2"), accept=False)
    sim.cut_and_resume(post_a)
    sim.resend(post_a, second)
    sim.resend(post_a, first)
    g = _gate1(sim, tmp_path)
    assert g.verdict is Verdict.FAIL
    (w, *_) = g.witnesses
    assert (w.check, w.row["event_id"]) == ("replayed_out_of_order", first.event_id)


def test_a_pristine_replay_in_order_after_the_cursor_passes(tmp_path: Path) -> None:
    sim, post_a, post_b = _two_sessions(tap_kinds=True)
    missed = [sim.send(post_a, _msg("m"), accept=False) for _ in range(2)]
    sim.cut_and_resume(post_a)
    for ev in missed:
        sim.resend(post_a, ev)
    sim.send(post_a, _msg("new"))
    sim.respond(post_a)
    sim.respond(post_b)
    g = _gate1(sim, tmp_path)
    assert g.verdict is Verdict.PASS, [w.explanation for w in g.witnesses]
    by_check = g.measured["server_by_check"]
    assert isinstance(by_check, dict) and set(by_check.values()) == {0}


# ---------------------------------------------------------------------------- gate 2 from the wire


def _gate2(sim: Sim, tmp_path: Path, *, server: bool = False) -> GateResult:
    _, report = judge_dir(sim.write(tmp_path / "run", server=server))
    return next(g for g in report.gates if g.gate == "duplicate_dispatch")


def _write_retried(*, second_result: str, is_error: bool = False) -> Sim:
    """Client a's write is answered, the answer lost, and the write retried with the same
    key in a new request: the server answers again."""
    sim, _, _ = _two_sessions()
    first = sim.call("a", 7, idempotency_key="op-a-7")
    sim.result(first, "op-a-7", '{"receipt": "r-1"}')
    retry = sim.call("a", 8, idempotency_key="op-a-7")
    sim.result(retry, "op-a-7", second_result, is_error=is_error)
    sim.operation("a", "op-a-7", attempts=2)
    return sim


def test_two_different_results_for_one_key_on_the_wire_fail_gate_2_without_a_server_ledger(
    tmp_path: Path,
) -> None:
    g = _gate2(_write_retried(second_result='{"receipt": "r-2"}'), tmp_path)
    assert g.verdict is Verdict.FAIL
    (w,) = g.witnesses
    assert (w.check, w.attribution) == ("wire_different_results", Attribution.SERVER)
    assert w.row["idempotency_key"] == "op-a-7" and w.row["different_results"] == 2
    assert "answered idempotency key op-a-7 (bearer token t_a) with 2 different results" in w.explanation
    assert "a retry must get the original answer back" in w.explanation
    assert len(w.refs) == 2
    assert g.attribution_counts["server"] == 1


def test_two_results_from_two_replicas_blame_the_topology_and_from_one_the_server(tmp_path: Path) -> None:
    """Behind the lab's balancer (tap `replica`): a write performed by each of two replicas
    is the deployment's (idempotency records per replica); twice by one, that server's."""
    for second, blamed in ((1, Attribution.TOPOLOGY), (0, Attribution.SERVER)):
        sim = _write_retried(second_result='{"receipt": "r-2"}')
        flows = [r for r in sim.tap if r["type"] == "flow"]
        for r in flows:
            r["replica"] = 0
        flows[-1]["replica"] = second  # the retry's flow
        g = _gate2(sim, tmp_path / str(second))
        assert g.verdict is Verdict.FAIL
        (w,) = g.witnesses
        assert w.attribution is blamed, w
        assert g.attribution_counts.get(str(blamed)) == 1
        if blamed is Attribution.TOPOLOGY:
            assert "by replicas 0, 1" in w.explanation and "not one server's rules" in w.explanation
            assert g.attribution_counts["server"] == 0


def test_a_retry_that_gets_the_original_receipt_passes_gate_2_from_the_wire(tmp_path: Path) -> None:
    g = _gate2(_write_retried(second_result='{"receipt": "r-1"}'), tmp_path)
    # No server ledger: the evidence (a key answered twice, the side effects visible) is the tap's.
    assert g.verdict is Verdict.PASS, [(e.name, e.detail) for e in g.evidence if not e.ok]
    retried = g.measured["writes_retried"]
    assert g.measured["wire_different_results"] == 0 and isinstance(retried, int) and retried >= 1


def test_an_error_answer_is_not_a_second_result(tmp_path: Path) -> None:
    g = _gate2(_write_retried(second_result='{"error": "busy"}', is_error=True), tmp_path)
    assert g.verdict is Verdict.PASS and g.measured["wire_different_results"] == 0


def test_a_replay_of_another_sessions_answer_is_gate_1s_not_a_second_performance(tmp_path: Path) -> None:
    """a and b each make a write with request id 7 under a key of their own. b's call is
    cut and resumed, and a server with one event store for every session replays a's
    answer onto b's resumption. The tap ties that answer to b's write (same session, same
    id): read without where the event belongs, b's key had two different results, and
    gate 2 said the server performed b's write again. Nothing was performed twice."""
    sim, _, _ = _two_sessions()
    call_a = sim.call("a", 7, idempotency_key="op-a-7")
    answer_a = sim.send(
        call_a, '{"jsonrpc": "2.0", "id": 7, "result": {"receipt": "r-a"}}', kind="response", jsonrpc_id="7"
    )
    sim.result(call_a, "op-a-7", '{"receipt": "r-a"}', index=answer_a.index)
    call_b = sim.call("b", 7, idempotency_key="op-b-7")
    sim.send(call_b, _msg("b-progress"))
    sim.cut_and_resume(call_b)
    replayed = sim.resend(call_b, answer_a, accept=False)
    sim.result(call_b, "op-b-7", '{"receipt": "r-a"}', index=replayed.index)
    answer_b = sim.send(
        call_b, '{"jsonrpc": "2.0", "id": 7, "result": {"receipt": "r-b"}}', kind="response", jsonrpc_id="7"
    )
    sim.result(call_b, "op-b-7", '{"receipt": "r-b"}', index=answer_b.index)
    sim.operation("b", "op-b-7", attempts=2)
    g2 = _gate2(sim, tmp_path)
    # Left out: the replay (sent off its home) and a's own answer with it (one result
    # recorded for two writes is neither's receipt); a's write had one result anyway.
    assert g2.measured["wire_different_results"] == 0 and g2.measured["results_not_compared"] == 2
    assert g2.verdict is not Verdict.FAIL and not g2.witnesses, g2.summary
    assert any("gate 1's finding" in n for n in g2.notes)
    g1 = _gate1(sim, tmp_path / "g1")
    assert g1.verdict is Verdict.FAIL and ("sent_off_home", Attribution.SERVER) in _server(g1)


def test_the_wire_and_the_server_ledger_are_both_used_and_their_disagreement_reported(tmp_path: Path) -> None:
    sim = _write_retried(second_result='{"receipt": "r-2"}')
    sim.dispatch("a", "op-a-7", 7, "performed")
    sim.dispatch("a", "op-a-7", 8, "replayed")  # the ledger claims the retry was a replay
    g = _gate2(sim, tmp_path, server=True)
    assert g.verdict is Verdict.FAIL
    assert g.measured["server_performed_twice"] == 0 and g.measured["wire_different_results"] == 1
    assert g.measured["ledger_wire_disagreements"] == 1
    assert any("but the server ledger records the write performed once" in n for n in g.notes)


def test_without_a_server_ledger_or_results_on_the_wire_gate_2_is_inconclusive(tmp_path: Path) -> None:
    sim, _, _ = _two_sessions()
    sim.operation("a", "op-a-7", attempts=2)
    g = _gate2(sim, tmp_path)
    assert g.verdict is Verdict.INCONCLUSIVE
    assert "server side effects visible" in [e.name for e in g.evidence if not e.ok]


def test_an_id_reused_on_another_stream_of_the_session_fails_on_the_server(tmp_path: Path) -> None:
    # A server that counts IDs per stream: two calls of one session both send "0", "1", ...
    sim = Sim(opaque_ids=True, per_stream_ids=True)
    sim.budgets["min_events"] = 5
    sim.initialize("a")
    first, second = sim.call("a", 1), sim.call("a", 2)
    for _ in range(3):
        sim.send(first, _msg("one"))
    for _ in range(3):
        sim.send(second, _msg("two"))
    crossed = sim.send(first, _msg("x"), accept=False)
    sim.forward_foreign(second, crossed, accept=False)
    g = _gate1(sim, tmp_path)
    assert g.verdict is Verdict.FAIL
    reused = [w for w in g.witnesses if w.check == "event_id_reused"]
    # The second call's priming event and its three messages reuse the first call's IDs.
    assert len(reused) >= 1 and int(str(g.measured["server_violations"])) >= 4, g.measured
    assert all(w.attribution is Attribution.SERVER for w in reused)
    assert "unique across a session's streams" in reused[0].explanation
    assert "also sent on" in reused[0].explanation


def test_ids_unique_per_session_but_shared_across_sessions_pass(tmp_path: Path) -> None:
    # Per-session counters: every session has "1", "2", ...; no session reuses one.
    sim, _, _ = _two_sessions(per_session_ids=True)
    g = _gate1(sim, tmp_path)
    assert not [w for w in g.witnesses if w.check == "event_id_reused"], g.summary
