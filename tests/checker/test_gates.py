"""The six gates on hand-built ledgers: a clean run passes; one known violation of each
gate fails that gate (and only that gate) with the right witness and attribution."""

from __future__ import annotations

import io
import json
import sqlite3
from pathlib import Path

import pytest

from lab.checker.judge.verdict import judge_dir
from lab.checker.model import Attribution, GateResult, RunReport, Verdict
from lab.report.document import rules_of
from lab.wire.event_ids import message_digest
from tests.checker.builders import T0, Event, Sim, Stream, clean_run


def check(sim: Sim, tmp_path: Path, **write: bool) -> RunReport:
    _, report = judge_dir(sim.write(tmp_path / "run", **write))
    return report


def gate(report: RunReport, name: str) -> GateResult:
    return next(g for g in report.gates if g.gate == name)


def verdicts(report: RunReport) -> dict[str, Verdict]:
    return {g.gate: g.verdict for g in report.gates}


def only_failing(report: RunReport) -> list[str]:
    return [g.gate for g in report.gates if g.verdict is Verdict.FAIL]


def test_clean_run_passes_every_gate(tmp_path: Path) -> None:
    report = check(clean_run().sim, tmp_path)
    assert verdicts(report) == dict.fromkeys(verdicts(report), Verdict.PASS), [
        g.summary for g in report.gates
    ]
    assert report.verdict is Verdict.PASS
    assert report.event_count == 15 and report.event_count_source == "tap"
    fired = {f.fault: f.total for f in report.faults}
    assert fired == {"cross_stream": 1, "origin_rewrite": 1, "toxic:latency": 1}
    g1 = gate(report, "cross_stream")
    assert g1.attribution_counts[Attribution.PROXY_FAULT_REJECTED] == 1
    assert g1.measured["verified"] == 15


# ---------------------------------------------------------------------------- gate 1


def test_gate1_client_accepts_an_event_a_proxy_fault_crossed(tmp_path: Path) -> None:
    run = clean_run()
    sim = run.sim
    # The proxy moves an event of a's GET stream, before a got it there, onto its POST stream.
    ev = sim.send(run.get_a, json.dumps({"jsonrpc": "2.0", "method": "m"}), accept=False)
    sim.forward_foreign(run.post_a, ev, accept=True)
    report = check(sim, tmp_path)
    assert only_failing(report) == ["cross_stream"]
    g = gate(report, "cross_stream")
    assert g.violations == 1
    (w,) = g.witnesses
    assert w.attribution is Attribution.CLIENT
    assert w.row["event_id"] == ev.event_id and w.row["stream_key"] == "post:2" and w.row["client_id"] == "a"
    assert "client a accepted event" in w.explanation
    assert "proxy fault cross_stream" in w.explanation
    assert f"the proxy saw the server send it on flow {ev.flow}" in w.explanation


def test_gate1_client_accepts_an_event_the_proxy_made_up(tmp_path: Path) -> None:
    run = clean_run()
    sim = run.sim
    data = json.dumps({"jsonrpc": "2.0", "method": "forged"})
    forged = Event("e1.forged", message_digest(data), data, "nowhere", 0, run.post_a)
    sim.forward_foreign(run.post_a, forged, accept=True, fault="inject_foreign", made_up=True)
    report = check(sim, tmp_path)
    assert only_failing(report) == ["cross_stream"]
    (w,) = gate(report, "cross_stream").witnesses
    assert w.attribution is Attribution.CLIENT and w.row["event_id"] == "e1.forged"
    assert "neither the proxy nor the server ledger has a record of the server sending it" in w.explanation
    assert "inject_foreign" in w.explanation


def test_gate1_server_sends_an_event_of_another_stream(tmp_path: Path) -> None:
    run = clean_run()
    sim = run.sim
    ev = sim.send(run.post_b, json.dumps({"jsonrpc": "2.0", "method": "x"}), minted_for=run.get_b)
    report = check(sim, tmp_path)
    assert only_failing(report) == ["cross_stream"]
    # The server sent it off its home (its own violation), and the client accepted it.
    server, client = gate(report, "cross_stream").witnesses
    assert (server.check, server.attribution) == ("sent_off_home", Attribution.SERVER)
    assert server.row["event_id"] == client.row["event_id"] == ev.event_id
    assert (client.check, client.attribution) == ("not_sent_on_stream", Attribution.CLIENT)
    assert "the server itself sent it" in client.explanation


def test_gate1_resumption_replays_another_streams_events(tmp_path: Path) -> None:
    # The failure the lab exists to catch: the client resumes its POST stream and the server replays the
    # events of the standalone GET stream on it; the client files them under post:2.
    run = clean_run()
    sim = run.sim
    sim.cut_and_resume(run.post_b, after=0.5, advised=0.1)
    replayed = sim.send(run.post_b, json.dumps({"jsonrpc": "2.0", "method": "g"}), minted_for=run.get_b)
    report = check(sim, tmp_path)
    assert only_failing(report) == ["cross_stream"]
    server, client = gate(report, "cross_stream").witnesses
    assert server.attribution is Attribution.SERVER and server.row["event_id"] == replayed.event_id
    assert "resumption GET" in server.explanation and str(server.row["home"]).endswith(run.get_b.stream_id)
    assert client.attribution is Attribution.CLIENT and client.row["event_id"] == replayed.event_id


def test_gate1_response_to_another_request_on_a_post_stream(tmp_path: Path) -> None:
    # The server mints the POST stream's own ID for a response to request 5: only the
    # correlation check sees it.
    run = clean_run()
    sim = run.sim
    data = json.dumps({"jsonrpc": "2.0", "id": 5, "result": {}})
    sim.send(run.post_b, data, kind="response", jsonrpc_id="5")
    report = check(sim, tmp_path)
    g = gate(report, "cross_stream")
    assert g.verdict is Verdict.FAIL
    assert g.measured["response_on_wrong_stream"] == 1 and g.measured["not_sent_on_stream"] == 0
    server, client = g.witnesses
    assert server.check == "response_to_another_request" and server.attribution is Attribution.SERVER
    assert client.check == "response_on_wrong_stream" and client.attribution is Attribution.CLIENT


def test_gate1_events_the_tap_missed_are_taken_from_the_server_ledger(tmp_path: Path) -> None:
    # The tap stopped recording (a proxy that stopped its tap while streams went on):
    # the client accepted events the tap has no `sent` record of.
    run = clean_run()
    sim = run.sim
    missed = sim.notify(run.get_a, 2)
    sim.tap = [r for r in sim.tap if r.get("event_id") not in {e.event_id for e in missed}]
    g = gate(check(sim, tmp_path / "both"), "cross_stream")
    assert g.verdict is Verdict.PASS and g.measured["truth_source"] == "tap+server"
    assert g.measured["verified"] == g.measured["receipts_checked"]
    # With the tap alone they cannot be judged: unverifiable, never violations.
    g = gate(check(sim, tmp_path / "tap", server=False), "cross_stream")
    assert g.verdict is Verdict.INCONCLUSIVE and g.violations == 0
    assert g.measured["unverifiable"] == 2


def test_gate1_with_an_empty_server_events_table(tmp_path: Path) -> None:
    sim = clean_run().sim
    sim.server_rows["events_sent"] = []
    report = check(sim, tmp_path)
    assert report.verdict is Verdict.PASS, [g.summary for g in report.gates]


def test_gate1_without_tap_uses_the_server_ledger(tmp_path: Path) -> None:
    run = clean_run()
    sim = run.sim
    # The proxy moves an event of a's GET stream, before a got it there, onto its POST stream.
    ev = sim.send(run.get_a, json.dumps({"jsonrpc": "2.0", "method": "m"}), accept=False)
    sim.forward_foreign(run.post_a, ev, accept=True)
    report = check(sim, tmp_path, tap=False)
    g = gate(report, "cross_stream")
    assert g.verdict is Verdict.FAIL and g.measured["truth_source"] == "server"
    assert g.witnesses[0].row["event_id"] == ev.event_id
    assert report.event_count_source == "server"


def test_gate1_without_tap_cannot_pass(tmp_path: Path) -> None:
    report = check(clean_run().sim, tmp_path, tap=False)
    g = gate(report, "cross_stream")
    assert g.verdict is Verdict.INCONCLUSIVE and g.violations == 0
    assert [e.name for e in g.evidence if not e.ok] == ["stream crossings injected"]


def test_gate1_a_plain_json_answer_belongs_to_its_own_post(tmp_path: Path) -> None:
    sim = clean_run().sim
    sim.json_call("a", 7)
    report = check(sim, tmp_path)
    g = gate(report, "cross_stream")
    assert g.verdict is Verdict.PASS and g.measured["json_responses"] == 1


def _opaque_run() -> tuple[Sim, Stream, Stream]:
    """A server with opaque event IDs: only the tap's flows say which stream is which."""
    sim = Sim(opaque_ids=True)
    sim.fault_windows = []
    sim.initialize("a")
    get = sim.open_get("a")
    post = sim.call("a", 2)
    sim.notify(get, 4)
    sim.notify(post, 3)
    ev = sim.send(get, json.dumps({"jsonrpc": "2.0", "method": "crossed"}), accept=False)
    sim.forward_foreign(post, ev, accept=False)
    lost = sim.cut_and_resume(post, after=0.3, advised=0.2)
    sim.notify(post, 2)  # live events first seen on the resumption flow
    sim.recovered(post, lost, sim.t)
    return sim, get, post


@pytest.mark.parametrize("server_ledger", [True, False])
def test_gate1_opaque_ids_resumption_is_followed_through_last_event_id(
    tmp_path: Path, server_ledger: bool
) -> None:
    sim, _, _ = _opaque_run()
    g = gate(check(sim, tmp_path, server=server_ledger), "cross_stream")
    assert g.measured["verified"] == g.measured["receipts_checked"] == 9
    assert g.violations == 0 and g.measured["unverifiable"] == 0


def test_gate1_opaque_ids_resumption_carrying_another_streams_events(tmp_path: Path) -> None:
    sim, get, post = _opaque_run()
    pending = sim.send(get, json.dumps({"jsonrpc": "2.0", "method": "of-get"}), accept=False)
    sim.resend(post, pending)  # the server replays a GET event on the POST's resumption
    g = gate(check(sim, tmp_path, server=False), "cross_stream")
    assert g.verdict is Verdict.FAIL
    server, client = g.witnesses
    assert server.row["event_id"] == pending.event_id and server.attribution is Attribution.SERVER
    assert server.check == "sent_off_home" and client.attribution is Attribution.CLIENT


# ---------------------------------------------------------------------------- gate 2


def test_gate2_server_performs_one_key_twice(tmp_path: Path) -> None:
    sim = clean_run().sim
    sim.dispatch("b", "op-b-7", 4, "performed")
    sim.dispatch("b", "op-b-7", 5, "performed")
    report = check(sim, tmp_path)
    assert only_failing(report) == ["duplicate_dispatch"]
    g = gate(report, "duplicate_dispatch")
    (w,) = g.witnesses
    assert w.check == "server_performed_twice" and w.attribution is Attribution.SERVER
    assert w.row["idempotency_key"] == "op-b-7" and w.row["performed"] == 2
    assert "2 times for idempotency key op-b-7 (authenticated as subject-b)" in w.explanation


def test_gate2_same_write_performed_again_under_a_new_key(tmp_path: Path) -> None:
    # A client that lost the answer and re-ran the write as a new operation (new key):
    # each key was performed once, so only the arguments show the duplicate.
    sim = clean_run().sim
    sim.dispatch("b", "op-b-8", 4, "performed", arguments="pay 10")
    sim.dispatch("b", "op-b-9", 5, "performed", arguments="pay 10")
    report = check(sim, tmp_path)
    assert only_failing(report) == ["duplicate_dispatch"]
    (w,) = gate(report, "duplicate_dispatch").witnesses
    assert w.check == "same_write_under_new_key" and w.attribution is Attribution.CLIENT
    assert w.row["keys"] == "op-b-8, op-b-9" and w.row["performed"] == 2
    assert "re-run as a new operation" in w.explanation


def test_gate2_equal_arguments_under_one_key_are_a_replay_not_a_duplicate(tmp_path: Path) -> None:
    sim = clean_run().sim
    sim.dispatch("b", "op-b-8", 4, "performed", arguments="pay 10")
    sim.dispatch("b", "op-b-8", 5, "replayed", arguments="pay 10")
    report = check(sim, tmp_path)
    assert gate(report, "duplicate_dispatch").verdict is Verdict.PASS


def test_gate2_client_dispatches_a_message_more_often_than_it_was_sent(tmp_path: Path) -> None:
    run = clean_run()
    sim = run.sim
    (ev,) = sim.notify(run.get_a, 1)
    # The same message dispatched again under another key (as after a re-handshake that
    # forgot what was dispatched): the server sent it once.
    sim.client_row(
        "outbox",
        client_id="a",
        dispatch_key="ev:2:get:1:again",
        session_generation=2,
        stream_key="get:1",
        event_id=ev.event_id,
        message_digest=ev.digest,
        kind="notification",
        created_at=sim.tick(),
    )
    report = check(sim, tmp_path)
    assert only_failing(report) == ["duplicate_dispatch"]
    (w,) = gate(report, "duplicate_dispatch").witnesses
    assert w.check == "client_dispatched_more_than_sent" and w.attribution is Attribution.CLIENT
    assert w.row["message_digest"] == ev.digest and w.row["dispatched"] == 2 and w.row["sent"] == 1
    assert f"client a handed message {ev.digest[:12]} to its application 2 times" in w.explanation
    assert "but the server sent it to that client 1 time" in w.explanation


def test_gate2_same_dedup_key_twice_across_worker_files(tmp_path: Path) -> None:
    run_dir = clean_run().sim.write(tmp_path / "run")
    src = sqlite3.connect(run_dir / "clients" / "worker-1.sqlite")
    row = src.execute("SELECT * FROM inbox WHERE kind != 'priming' LIMIT 1").fetchone()
    src.close()
    from lab.inbox import connect

    other = connect(run_dir / "clients" / "worker-2.sqlite")
    other.execute(f"INSERT INTO inbox VALUES ({','.join('?' * len(row))})", row)
    other.close()
    _, report = judge_dir(run_dir)
    g = gate(report, "duplicate_dispatch")
    assert g.verdict is Verdict.FAIL and g.measured["inbox_duplicate"] == 1
    (w,) = g.witnesses
    assert w.check == "inbox_duplicate" and w.row["event_id"] == row[3] and w.row["receipts"] == 2
    assert f"accepted event {row[3]} on {row[2]} 2 times" in w.explanation
    assert "a client must accept each event once" in w.explanation


# ---------------------------------------------------------------------------- gate 3


def test_gate3_call_with_the_expired_session_after_a_404(tmp_path: Path) -> None:
    sim = clean_run().sim
    conn = sim.request("a", "call", "POST", 404, stream_key="post:20")
    sim.tick(0.05)
    sim.request("a", "call", "POST", 404, stream_key="post:21")  # no initialize came first
    report = check(sim, tmp_path)
    assert only_failing(report) == ["missing_rehandshake"]
    g = gate(report, "missing_rehandshake")
    # The second 404 is not followed by any request: counted, not a violation.
    assert g.violations == 1 and g.measured["no_next_request"] == 1
    (w,) = g.witnesses
    assert w.attribution is Attribution.CLIENT
    assert f"a:{w.row['conn_id']}" == conn and w.row["next_purpose"] == "call"
    assert "got 404" in w.explanation and "expired session" in w.explanation


def test_gate3_from_the_client_ledger_alone(tmp_path: Path) -> None:
    sim = clean_run().sim
    sim.request("a", "call", "POST", 404, stream_key="post:20")
    sim.tick(0.05)
    sim.request("a", "call", "POST", 200, stream_key="post:21")
    g = gate(check(sim, tmp_path, tap=False), "missing_rehandshake")
    assert g.verdict is Verdict.FAIL and g.measured["tap_cross_checked"] is False
    assert g.witnesses[0].explanation.endswith(
        "— it carried the expired session, with no initialize without a session ID before it"
    )


def test_gate3_the_next_request_in_a_newer_generation_is_fine(tmp_path: Path) -> None:
    # Two requests of generation 1 both get 404; the first 404 already led to the new
    # handshake, so after the second one the client is in generation 2.
    sim = clean_run().sim
    before = sim.t
    sim.request("a", "call", "POST", 404, stream_key="post:20")
    sim.tick(0.05)
    sim.initialize("a")
    sim.request("a", "call", "POST", 404, stream_key="post:21", started_at=before, generation=1)
    sim.tick(0.05)
    sim.call("a", 3)
    g = gate(check(sim, tmp_path), "missing_rehandshake")
    assert g.verdict is Verdict.PASS, [w.explanation for w in g.witnesses]
    assert g.measured["already_newer_session"] == 1


def test_gate3_a_request_already_in_flight_is_not_the_next_one(tmp_path: Path) -> None:
    sim = clean_run().sim
    started_before = sim.t
    sim.tick(0.02)
    sim.request("a", "call", "POST", 404, stream_key="post:20")
    # Started before the 404 arrived (still carrying the session), ended after it.
    sim.request("a", "call", "POST", 200, stream_key="post:22", started_at=started_before)
    sim.tick(0.05)
    sim.initialize("a")
    report = check(sim, tmp_path)
    g = gate(report, "missing_rehandshake")
    assert g.verdict is Verdict.PASS, g.summary
    assert g.measured["rehandshaken"] == 2  # b's 404 in the clean run, and this one


def test_gate3_tap_sees_the_old_session_on_the_next_request(tmp_path: Path) -> None:
    # The client ledger claims the next request belongs to a newer generation, but on
    # the wire it carried the session that got the 404.
    sim = clean_run().sim
    sim.request("a", "call", "POST", 404, stream_key="post:20")
    sim.tick(0.05)
    sim.request("a", "call", "POST", 200, stream_key="post:23")
    sim.client_rows["http_exchanges"][-1]["session_generation"] = 2
    report = check(sim, tmp_path)
    g = gate(report, "missing_rehandshake")
    assert g.verdict is Verdict.FAIL
    assert "the proxy saw it carry the expired session" in g.witnesses[0].explanation
    assert (
        "(connection a:" in g.witnesses[0].explanation
        and "session generation 2)" in g.witnesses[0].explanation
    )


def test_gate3_a_tap_404_the_client_ledger_lacks_is_said_in_words_not_nan(tmp_path: Path) -> None:
    sim = clean_run().sim
    sim.request("a", "call", "POST", 404, stream_key="post:20")
    sim.client_rows["http_exchanges"].pop()  # the client never wrote it down
    sim.tick(0.05)
    sim.initialize("a")
    (note,) = gate(check(sim, tmp_path), "missing_rehandshake").notes
    assert "(not in the client ledger)" in note and "nan" not in note


# ---------------------------------------------------------------------------- gate 4


def test_gate4_illegal_origin_answered_200(tmp_path: Path) -> None:
    sim = clean_run().sim
    sim.request(
        "a",
        "call",
        "POST",
        200,
        stream_key="post:30",
        origin_out="http://evil.example",
        faults=[{"fault": "origin_rewrite", "rule": "r-origin", "decision": "d-2"}],
    )
    report = check(sim, tmp_path)
    assert only_failing(report) == ["illegal_origin"]
    g = gate(report, "illegal_origin")
    assert g.measured["illegal_origin_requests"] == 2 and g.measured["rejected_403"] == 1
    (w,) = g.witnesses
    assert w.attribution is Attribution.SERVER and w.row["status"] == 200
    assert "'http://evil.example'" in w.explanation and "origin_rewrite" in w.explanation


def test_gate4_only_403_counts_as_rejected(tmp_path: Path) -> None:
    sim = clean_run().sim
    sim.request("a", "call", "POST", 400, stream_key="post:31", origin_out="http://evil.example")
    g = gate(check(sim, tmp_path), "illegal_origin")
    assert g.verdict is Verdict.FAIL and g.witnesses[0].row["status"] == 400


def test_gate4_from_the_server_ledger_without_tap(tmp_path: Path) -> None:
    sim = clean_run().sim
    sim.request("a", "call", "POST", 200, stream_key="post:30", origin_out="http://evil.example")
    g = gate(check(sim, tmp_path, tap=False), "illegal_origin")
    assert g.verdict is Verdict.FAIL and g.measured["source"] == "server"


# ---------------------------------------------------------------------------- gate 5


def test_gate5_a_loss_that_never_recovered_makes_p99_infinite(tmp_path: Path) -> None:
    run = clean_run()
    sim = run.sim
    sim.recovered(run.get_a, T0 + 0.05, None, path="abandoned")
    sim.tick(20.0)  # the run went on long enough for it to have recovered
    report = check(sim, tmp_path)
    assert only_failing(report) == ["resume_p99"]
    g = gate(report, "resume_p99")
    assert g.measured["p99_unbounded"] is True and g.measured["p99_s"] is None
    (w,) = g.witnesses
    assert w.row["stream_key"] == "get:1" and "never recovered" in w.explanation
    assert w.attribution is Attribution.UNATTRIBUTED


def test_gate5_slow_recovery(tmp_path: Path) -> None:
    run = clean_run()
    sim = run.sim
    sim.recovered(run.get_a, T0 + 0.05, T0 + 9.05)
    g = gate(check(sim, tmp_path), "resume_p99")
    assert g.verdict is Verdict.FAIL and g.measured["p99_s"] == pytest.approx(9.0)


def test_gate5_a_loss_still_open_at_the_end_is_censored(tmp_path: Path) -> None:
    run = clean_run()
    sim = run.sim
    sim.recovered(run.get_a, sim.t, None, path="abandoned")  # 1 s before run.json stopped_at
    g = gate(check(sim, tmp_path), "resume_p99")
    assert g.verdict is Verdict.PASS and g.measured["censored"] == 1
    assert "1 loss(es) still open when the run stopped were left out" in " ".join(g.notes)
    assert "the run gave them no chance to recover (censored)" in " ".join(g.notes)


# ---------------------------------------------------------------------------- gate 6


def test_gate6_more_reconnects_in_one_second_than_the_budget(tmp_path: Path) -> None:
    run = clean_run()
    sim = run.sim
    second = float(int(sim.t) + 2)
    for i in range(6):
        sim.client_row(
            "reconnects",
            client_id=f"c{i}",
            kind="reopen",
            stream_key="get:1",
            cause="http_503",
            advised_delay=None,
            planned_delay=0.5,
            lost_at=second - 0.5,
            sent_at=second + 0.1 * i,
            waited=0.5 + 0.1 * i,
            attempt=0,
            conn_id=9,
            session_generation=1,
        )
    report = check(sim, tmp_path)
    assert only_failing(report) == ["reconnect_qps"]
    g = gate(report, "reconnect_qps")
    assert g.measured["peak_per_s"] == 6
    (w,) = g.witnesses
    assert w.check == "over_budget" and w.row["second"] == int(second) and w.row["clients"] == 6


def test_gate6_a_wait_shorter_than_the_servers_advice(tmp_path: Path) -> None:
    run = clean_run()
    sim = run.sim
    sim.cut_and_resume(run.get_b, after=0.5, advised=2.0)
    report = check(sim, tmp_path)
    assert only_failing(report) == ["reconnect_qps"]
    (w,) = gate(report, "reconnect_qps").witnesses
    assert w.check == "waited_less_than_advised" and w.attribution is Attribution.CLIENT
    assert w.row["advised_delay"] == 2.0 and "advised to wait 2.000 s" in w.explanation


# ---------------------------------------------------------------------------- evidence


def test_a_run_without_evidence_is_inconclusive_gate_by_gate(tmp_path: Path) -> None:
    sim = Sim()
    sim.initialize("a")
    get = sim.open_get("a")
    post = sim.call("a", 2)
    sim.notify(get, 6)
    sim.notify(post, 4)
    sim.respond(post)
    report = check(sim, tmp_path)
    assert report.verdict is Verdict.INCONCLUSIVE
    assert set(verdicts(report).values()) == {Verdict.INCONCLUSIVE}
    unmet = {g.gate: [e.name for e in g.evidence if not e.ok] for g in report.gates}
    assert unmet == {
        "cross_stream": ["stream crossings injected"],
        "duplicate_dispatch": ["writes retried"],
        "missing_rehandshake": ["404s to requests with a session"],
        "illegal_origin": ["illegal-Origin requests"],
        "resume_p99": ["recoveries"],
        "reconnect_qps": ["reconnects"],
    }


def test_too_few_events_make_a_clean_run_inconclusive(tmp_path: Path) -> None:
    sim = clean_run().sim
    sim.budgets["min_events"] = 1000
    report = check(sim, tmp_path)
    assert report.verdict is Verdict.INCONCLUSIVE
    for g in report.gates:
        assert [e.name for e in g.evidence if not e.ok] == ["events"], g.gate


def test_a_violation_fails_even_with_thin_evidence(tmp_path: Path) -> None:
    sim = clean_run().sim
    sim.budgets["min_events"] = 1000
    sim.dispatch("b", "op-b-7", 4, "performed")
    sim.dispatch("b", "op-b-7", 5, "performed")
    report = check(sim, tmp_path)
    assert gate(report, "duplicate_dispatch").verdict is Verdict.FAIL
    assert report.verdict is Verdict.FAIL  # fail outranks inconclusive


# ---------------------------------------------------------------------------- raw evidence


def test_witnesses_point_at_their_raw_rows_and_report_html_links_them(tmp_path: Path) -> None:
    from lab.report.evidence import raw_rows
    from lab.report.outputs import report_run

    run = clean_run()
    sim = run.sim
    sim.dispatch("b", "op-b-7", 4, "performed")
    sim.dispatch("b", "op-b-7", 5, "performed")
    sim.request(
        "b",
        "call",
        "POST",
        200,
        origin="http://evil.example",
        faults=[{"fault": "origin_rewrite", "rule": "r", "decision": "d_00000000000000aa"}],
    )
    run_dir = sim.write(tmp_path / "run")
    _, report = judge_dir(run_dir)
    (dup,) = gate(report, "duplicate_dispatch").witnesses
    assert dup.refs == ("server/ledger.sqlite#dispatches/3", "server/ledger.sqlite#dispatches/4")
    (origin,) = gate(report, "illegal_origin").witnesses
    assert origin.refs[1] == "fault:d_00000000000000aa"
    raw = raw_rows(run_dir, [*dup.refs, *origin.refs])
    assert json.loads(raw[dup.refs[1]])["request_id"] == "5"
    tap_line = json.loads(raw[origin.refs[0]])
    assert tap_line["type"] == "flow" and tap_line["origin_out"] == "http://evil.example"
    assert raw["fault:d_00000000000000aa"].startswith(f"{origin.refs[0]}: ")

    report_run(run_dir, witness_limit=5, figures=False, quiet=True, out=io.StringIO(), err=io.StringIO())
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    anchor = "ev-server-ledger-sqlite-dispatches-4"
    assert f'href="#{anchor}"' in page and f'<dt id="{anchor}">' in page
    doc = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    assert rules_of(doc)[1]["witnesses"][0]["refs"] == list(dup.refs)
