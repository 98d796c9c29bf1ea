"""The server checks that `lab selftest` needed and the gates lacked, each seen catching
the bad case and passing the good one, on runs built by hand (tests/checker/builders.py):

- gate 3 `terminated_session_not_404`: after a DELETE answered 2xx, a request carrying
  the session must get 404 (defects unknown-session-400, deleted-session-alive);
- gate 3 `served_without_session`: a POST whose session ID the proxy removed must not be
  served (serve-without-session);
- gate 5 `no_priming`: a 2025-11-25 POST stream starts with its priming event (no-priming);
- gate 5 `silent_resumption`: a cursor the server never sent is not answered with a
  silent stream (unknown-cursor-silent);
- gate 6 `close_without_retry`: a server-initiated close mid-stream advises `retry`
  (no-retry-field).
"""

from __future__ import annotations

import json
from pathlib import Path

from lab.checker.judge.verdict import judge_dir
from lab.checker.model import Attribution, GateResult, RunReport, Verdict
from lab.wire.event_ids import message_digest
from tests.checker.builders import Event, Sim, Stream, clean_run

STRIPPED = [{"fault": "strip_session_id", "rule": "strip_session_id#0", "decision": "d-strip"}]


def check(sim: Sim, tmp_path: Path, **write: bool) -> RunReport:
    _, report = judge_dir(sim.write(tmp_path / "run", **write))
    return report


def gate(report: RunReport, name: str) -> GateResult:
    return next(g for g in report.gates if g.gate == name)


def failing(report: RunReport) -> list[str]:
    return [g.gate for g in report.gates if g.verdict is Verdict.FAIL]


def server_checks(g: GateResult) -> set[str]:
    return {w.check for w in g.witnesses if w.attribution is Attribution.SERVER}


# ------------------------------------------------------------------- gate 3: after a DELETE


def kill(sim: Sim, client: str, status: int = 200) -> None:
    """The proxy's kill_session DELETE of the client's session, answered `status`."""
    sim.tap.append(
        {
            "type": "fault",
            "t": sim.tick(),
            "fault": "kill_session",
            "rule": "kill_session#0",
            "decision": "d_kill",
            "flow": "f-raced",
            "detail": {"delete_status": status, "session": sim.clients[client].session, "order": "before"},
        }
    )


def test_gate3_a_terminated_session_answered_400_is_the_servers_violation(tmp_path: Path) -> None:
    sim = clean_run().sim
    kill(sim, "a")
    conn = sim.request("a", "call", "POST", 400, stream_key="post:30")
    report = check(sim, tmp_path, server=False)
    assert failing(report) == ["missing_rehandshake"]
    g = gate(report, "missing_rehandshake")
    assert g.attribution_counts == {"client": 0, "server": 1}
    assert g.measured["terminated_session_not_404"] == 1 and g.measured["after_termination"] == 1
    (w,) = g.witnesses
    assert w.check == "terminated_session_not_404" and w.attribution is Attribution.SERVER
    assert w.row["conn"] == conn and w.row["status"] == 400 and w.row["deleted_by"] == "kill_session"
    assert "got 400" in w.explanation and "fault:d_kill" in w.refs


def test_gate3_a_deleted_session_still_served_fails_even_without_any_404(tmp_path: Path) -> None:
    sim = clean_run().sim
    # The client leaves: its own DELETE is answered 200, yet the session keeps working.
    sim.request("a", "delete", "DELETE", 200)
    sim.request("a", "call", "POST", 200, stream_key="post:31")
    report = check(sim, tmp_path, server=False)
    g = gate(report, "missing_rehandshake")
    assert g.verdict is Verdict.FAIL and server_checks(g) == {"terminated_session_not_404"}
    assert g.witnesses[0].row["deleted_by"] == "client"
    assert "served it instead of 404" in g.witnesses[0].explanation


def test_gate3_404_after_the_delete_then_a_new_handshake_passes(tmp_path: Path) -> None:
    sim = clean_run().sim
    kill(sim, "a")
    sim.request("a", "call", "POST", 404, stream_key="post:30")
    sim.tick(0.05)
    sim.initialize("a")
    g = gate(check(sim, tmp_path, server=False), "missing_rehandshake")
    assert g.verdict is Verdict.PASS, g.summary
    assert g.measured["after_termination"] == 1 and g.measured["terminated_session_not_404"] == 0


def test_gate3_in_flight_requests_and_refusals_not_about_the_session_are_not_judged(tmp_path: Path) -> None:
    sim = clean_run().sim
    started = sim.tick()  # this request left the client before the DELETE was answered
    kill(sim, "a")
    sim.request("a", "call", "POST", 200, stream_key="post:30", started_at=started)
    # An illegal Origin is refused before the session is looked at: 403 is not about it.
    sim.request(
        "a",
        "call",
        "POST",
        403,
        stream_key="post:31",
        origin_out="http://evil.example",
        faults=[{"fault": "rewrite_origin", "rule": "r", "decision": "d-o2"}],
    )
    # Its session ID removed by the proxy: the server never saw the terminated session.
    sim.request("a", "call", "POST", 400, stream_key="post:35", faults=STRIPPED)
    # A DELETE the target refused (405) terminated nothing.
    kill(sim, "b", status=405)
    sim.request("b", "call", "POST", 200, stream_key="post:32")
    g = gate(check(sim, tmp_path, server=False), "missing_rehandshake")
    assert g.verdict is Verdict.PASS, g.summary
    assert g.measured["after_termination"] == 1 and g.attribution_counts["server"] == 0


def test_gate3_a_request_without_its_session_id_served_is_the_servers_violation(tmp_path: Path) -> None:
    sim = clean_run().sim
    conn = sim.request("a", "call", "POST", 200, stream_key="post:33", faults=STRIPPED)
    report = check(sim, tmp_path, server=False)
    assert failing(report) == ["missing_rehandshake"]
    g = gate(report, "missing_rehandshake")
    assert g.measured["without_session_id"] == 1 and g.measured["served_without_session"] == 1
    assert g.attribution_counts == {"client": 0, "server": 1}
    (w,) = g.witnesses
    assert w.check == "served_without_session" and w.attribution is Attribution.SERVER
    assert w.row["conn"] == conn and w.row["status"] == 200
    assert "fault:d-strip" in w.refs and "the rule is 400" in w.explanation


def test_gate3_a_request_without_its_session_id_refused_passes(tmp_path: Path) -> None:
    sim = clean_run().sim
    sim.request("a", "call", "POST", 400, stream_key="post:33", faults=STRIPPED)
    # Refused before the session is looked at (an illegal Origin as well): not judged.
    sim.request("a", "call", "POST", 403, stream_key="post:34", faults=STRIPPED)
    g = gate(check(sim, tmp_path, server=False), "missing_rehandshake")
    assert g.verdict is Verdict.PASS, g.summary
    assert g.measured["without_session_id"] == 1 and g.measured["served_without_session"] == 0
    assert "0 of 1 requests without their session ID served" in g.summary


# --------------------------------------------------------------------- gate 5: no priming


def speak(sim: Sim, version: str = "2025-11-25") -> None:
    """Every request carries `MCP-Protocol-Version: version` to the server (the tap's view)."""
    for r in sim.tap:
        if r["type"] == "flow":
            r["protocol_version_out"] = version


def unprimed_call(sim: Sim) -> Stream:
    """A call whose stream the server started without its priming event."""
    st = sim.call("a", 40)
    sim.tap[:] = [r for r in sim.tap if not (r["type"] == "sent" and r["flow"] == st.flow and r["priming"])]
    sim.notify(st, 2)
    sim.respond(st)
    return st


def test_gate5_a_2025_11_25_post_stream_without_priming_fails(tmp_path: Path) -> None:
    sim = clean_run().sim
    st = unprimed_call(sim)
    speak(sim)
    report = check(sim, tmp_path, server=False)
    assert failing(report) == ["resume_p99"]
    g = gate(report, "resume_p99")
    assert g.measured["no_priming"] == 1 and g.attribution_counts == {"server": 1}
    (w,) = g.witnesses
    assert w.check == "no_priming" and w.attribution is Attribution.SERVER
    assert w.row["flow"] == st.flow and w.row["jsonrpc_id"] == "40"
    assert "request 40" in w.explanation and "priming event" in w.explanation
    assert "server: 1 POST stream(s) that did not start with a priming event" in g.summary


def test_gate5_primed_streams_and_older_revisions_pass(tmp_path: Path) -> None:
    sim = clean_run().sim
    speak(sim)
    g = gate(check(sim, tmp_path / "primed", server=False), "resume_p99")
    assert g.verdict is Verdict.PASS and g.measured["no_priming"] == 0
    assert g.measured["post_streams_judged_for_priming"] == 2
    # 2025-06-18 has no priming event: the same unprimed stream is no violation there.
    sim = clean_run().sim
    unprimed_call(sim)
    speak(sim, "2025-06-18")
    g = gate(check(sim, tmp_path / "older", server=False), "resume_p99")
    assert g.verdict is Verdict.PASS and g.measured["post_streams_judged_for_priming"] == 0


# ----------------------------------------------------------- gate 5: a silent resumption


def resume_with(sim: Sim, cursor: str, status: int, *, silent_for: float, message: bool = False) -> str:
    """A resumption GET of client a with Last-Event-ID `cursor` (as the server got it)."""
    c = sim.clients["a"]
    conn, n = sim._conn("a")
    flow = sim._flow()
    sim.tick()
    sim.flow_record(
        flow, conn, "GET", c.session, last_event_id_in=cursor, last_event_id_out=cursor, status=status
    )
    sim.exchange("a", n, "resume", "GET", "post:2", status, last_event_id=cursor)
    if message:
        t = sim.tick(silent_for)
        data = '{"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "late"}}'
        sim.tap.append(
            {
                "type": "sent",
                "flow": flow,
                "t": t,
                "index": 0,
                "event_id": "fresh-1",
                "digest": message_digest(data),
                "has_data": True,
                "priming": False,
                "stream_id": None,
                "session": c.session,
            }
        )
    sim.tap.append({"type": "flow_end", "flow": flow, "t": sim.tick(silent_for), "reason": "client_gone"})
    return flow


def test_gate5_an_unknown_cursor_answered_with_a_silent_stream_fails(tmp_path: Path) -> None:
    sim = clean_run().sim
    flow = resume_with(sim, "garbage-d_1", 200, silent_for=10.0)
    report = check(sim, tmp_path, server=False)
    g = gate(report, "resume_p99")
    assert g.verdict is Verdict.FAIL and g.measured["silent_resumptions"] == 1
    (w,) = g.witnesses
    assert w.check == "silent_resumption" and w.attribution is Attribution.SERVER
    assert w.row["flow"] == flow and w.row["silent_s"] is not None and float(w.row["silent_s"]) >= 10.0
    assert "never sent" in w.explanation


def test_gate5_a_refused_cursor_a_prompt_answer_or_a_known_cursor_pass(tmp_path: Path) -> None:
    sim = clean_run().sim
    resume_with(sim, "garbage-d_1", 400, silent_for=10.0)  # refused: what a server should do
    resume_with(sim, "garbage-d_2", 200, silent_for=0.2, message=True)  # a new stream that speaks
    inbox = sim.client_rows["inbox"]
    known = next(r["event_id"] for r in reversed(inbox) if r["client_id"] == "a")  # one it did send
    resume_with(sim, str(known), 200, silent_for=10.0)
    g = gate(check(sim, tmp_path, server=False), "resume_p99")
    assert g.measured["unknown_cursor_resumptions_served"] == 1
    assert g.measured["silent_resumptions"] == 0 and g.verdict is Verdict.PASS, g.summary


# ------------------------------------------------------- gate 6: a close without `retry`


def polling_close(sim: Sim, *, advise: bool) -> Stream:
    """The server ends a call's connection mid-stream (advising `retry` or not); the client
    resumes and the stream goes on."""
    st = sim.call("a", 50)
    sim.notify(st, 2)
    if advise:
        sim.tap.append(
            {
                "type": "sent",
                "flow": st.flow,
                "t": sim.tick(0.001),
                "index": st.index,
                "event_id": None,
                "digest": message_digest(""),
                "has_data": False,
                "priming": False,
                "stream_id": None,
                "session": st.session,
                "retry": 200,
            }
        )
        st.index += 1
    sim.tap.append({"type": "flow_end", "flow": st.flow, "t": sim.tick(), "reason": "complete"})
    lost = sim.cut_and_resume(st, after=0.3, advised=0.2 if advise else None)
    sim.notify(st, 1)
    sim.recovered(st, lost, sim.t)
    sim.respond(st)
    sim.tap.append({"type": "flow_end", "flow": st.flow, "t": sim.tick(), "reason": "complete"})
    return st


def test_gate6_a_server_close_mid_stream_without_retry_fails(tmp_path: Path) -> None:
    sim = clean_run().sim
    polling_close(sim, advise=False)
    report = check(sim, tmp_path, server=False)
    assert failing(report) == ["reconnect_qps"]
    g = gate(report, "reconnect_qps")
    assert g.attribution_counts == {"client": 0, "server": 1}
    assert g.measured["server_closes_mid_stream"] == 1 and g.measured["close_without_retry"] == 1
    (w,) = g.witnesses
    assert w.check == "close_without_retry" and w.attribution is Attribution.SERVER
    assert "request 50" in w.explanation and "without an SSE `retry` field" in w.explanation


def test_gate6_a_close_with_retry_and_a_stream_that_ended_pass(tmp_path: Path) -> None:
    sim = clean_run().sim
    polling_close(sim, advise=True)
    report = check(sim, tmp_path, server=False)
    g = gate(report, "reconnect_qps")
    # The resumed connection ended after the response: the stream did not go on.
    assert g.measured["server_closes_mid_stream"] == 1 and g.measured["close_without_retry"] == 0
    assert g.verdict is Verdict.PASS and failing(report) == [], g.summary


def test_gate6_a_connection_ended_because_the_client_resumed_elsewhere_is_no_server_close(
    tmp_path: Path,
) -> None:
    """The client resumed the stream on a new connection first; then the server ended the
    old one (one connection per stream): the client's move, owing no `retry`. The same close
    before the resumption arrived is a violation (test_gate6_a_server_close_mid_stream...)."""
    sim = clean_run().sim
    st = sim.call("a", 51)
    sim.notify(st, 2)
    old = st.flow
    lost = sim.cut_and_resume(st, after=0.3, advised=None)
    sim.tap.append({"type": "flow_end", "flow": old, "t": sim.tick(), "reason": "complete"})
    sim.notify(st, 1)
    sim.recovered(st, lost, sim.t)
    sim.respond(st)
    sim.tap.append({"type": "flow_end", "flow": st.flow, "t": sim.tick(), "reason": "complete"})
    g = gate(check(sim, tmp_path, server=False), "reconnect_qps")
    assert g.measured["close_without_retry"] == 0, g.witnesses
    assert "close_without_retry" not in {w.check for w in g.witnesses}


def test_gate6_a_stream_a_proxy_storm_answered_in_the_servers_place_is_no_server_close(
    tmp_path: Path,
) -> None:
    """The same close without `retry`, but the proxy answered that connection 503 (a storm):
    the server never had that stream, so it is not a server close."""
    sim = clean_run().sim
    polling_close(sim, advise=False)
    (head,) = [r for r in sim.tap if r["type"] == "flow" and r.get("jsonrpc_id") == 50]
    head.update(status=503, answered_by="proxy")
    report = check(sim, tmp_path, server=False)
    g = gate(report, "reconnect_qps")
    assert g.measured["server_closes_mid_stream"] == 0 and g.measured["close_without_retry"] == 0, g.measured
    assert "close_without_retry" not in {w.check for w in g.witnesses}


# ------------------------------------------------------------------- gate 1: broadcast


def broadcasts(g: GateResult) -> object:
    by_check = measured(g, "server_by_check")
    assert isinstance(by_check, dict)
    return by_check["broadcast"]


def progress(sim: Sim, st: Stream) -> str:
    sim.messages += 1
    return json.dumps(
        {
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {"progressToken": 2, "progress": sim.messages},
        }
    )


def test_gate1_one_message_on_two_streams_of_a_session_is_the_servers_violation(tmp_path: Path) -> None:
    run = clean_run()
    sim = run.sim
    sim.opaque_ids = True  # the copy comes under a new ID, so no ID says it is off its stream
    post = sim.call("a", 7)
    for _ in range(3):
        data = progress(sim, post)
        sim.send(post, data)
        sim.send(run.get_a, data, accept=False)  # the client rejects the copy: still the server's
    report = check(sim, tmp_path, server=False)
    g = gate(report, "cross_stream")
    assert g.verdict is Verdict.FAIL and server_checks(g) == {"broadcast"}
    assert broadcasts(g) == 3 and g.attribution_counts["server"] == 3
    w = g.witnesses[0]
    assert w.row["flow"] == run.get_a.flow
    assert post.flow in w.explanation and "also sent on" in w.explanation
    assert len([r for r in w.refs if r.startswith("proxy/tap.jsonl:")]) == 2


def test_gate1_equal_messages_far_apart_or_in_two_sessions_are_not_a_broadcast(tmp_path: Path) -> None:
    run = clean_run()
    sim = run.sim
    sim.opaque_ids = True
    post = sim.call("a", 7)
    data = progress(sim, post)
    sim.send(post, data)
    sim.tick(5.0)  # the same content, seconds later, on another stream: two messages
    sim.send(run.get_a, data)
    other = progress(sim, post)
    sim.send(run.get_a, other)
    sim.send(run.get_b, other)  # at once, but in another session: each its own message
    report = check(sim, tmp_path, server=False)
    g = gate(report, "cross_stream")
    assert g.verdict is Verdict.PASS, g.witnesses
    assert broadcasts(g) == 0


# ------------------------------------------------------- gate 1: every rejection explained


def measured(g: GateResult, name: str) -> dict[str, int]:
    """One of the gate's per-kind counts (an object in report.json)."""
    got = g.measured[name]
    assert isinstance(got, dict)
    return {str(k): int(v) for k, v in got.items()}  # type: ignore[arg-type]


def progress_of_another_call(sim: Sim) -> tuple[Stream, Event]:
    """The server sends, on a's POST stream, a progress notification the client refuses."""
    post = sim.call("a", 40)
    data = json.dumps(
        {
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {"progressToken": "other", "progress": 1},
        }
    )
    ev = sim.send(post, data, accept=False)
    sim.reject(post, ev, "progress_token_mismatch", "progress token 'other' is not this stream's")
    sim.respond(post)
    return post, ev


def test_gate1_a_rejection_no_fault_explains_is_the_servers_finding(tmp_path: Path) -> None:
    sim = clean_run().sim
    post, ev = progress_of_another_call(sim)
    report = check(sim, tmp_path, server=False)
    assert failing(report) == ["cross_stream"]
    g = gate(report, "cross_stream")
    assert g.attribution_counts["server"] == 1 and server_checks(g) == {"rejected_unexplained"}
    assert measured(g, "server_by_check")["rejected_unexplained"] == 1
    assert measured(g, "rejections_explained")["unexplained"] == 1
    (w,) = [w for w in g.witnesses if w.check == "rejected_unexplained"]
    assert w.row["flow"] == post.flow and w.row["digest"] == ev.digest
    assert "rejected it on that connection (progress_token_mismatch: progress token 'other'" in w.explanation
    assert any("1 unexplained" in n for n in g.notes), g.notes


def test_gate1_the_same_rejection_explained_by_a_fault_is_no_finding(tmp_path: Path) -> None:
    sim = clean_run().sim
    post, ev = progress_of_another_call(sim)
    # The proxy, not the server, put it there: the tap's faulted forward of that message.
    sim.tap.append(
        {
            "type": "forwarded",
            "flow": post.flow,
            "t": sim.tick(),
            "index": 0,
            "event_id": ev.event_id,
            "digest": ev.digest,
            "source": None,
            "fault": "inject_foreign",
            "rule": "inject_foreign#0",
            "decision": "d-inject",
        }
    )
    report = check(sim, tmp_path, server=False)
    assert "cross_stream" not in failing(report)
    g = gate(report, "cross_stream")
    assert (
        measured(g, "rejections_explained")["fault"] >= 1
        and measured(g, "rejections_explained")["unexplained"] == 0
    )
    assert measured(g, "proxy_faults_rejected").get("inject_foreign") == 1


def gap_then_abandon(sim: Sim, *, dropped: bool) -> Stream:
    """On a's POST stream: one event accepted; the next one lost (`dropped`: sent by the
    server and dropped by a fault of the proxy; else the server skipped it); the one after
    it refused as a cursor gap, and one more read after the client gave the connection up."""
    post = sim.call("a", 41)
    sim.notify(post, 1)
    message = '{{"jsonrpc":"2.0","method":"notifications/message","params":{{"n":{n}}}}}'
    if dropped:
        lost = sim.send(post, message.format(n=1), accept=False)
        sim.tap.append(
            {
                "type": "dropped",
                "flow": post.flow,
                "t": sim.tick(),
                "index": lost.index,
                "fault": "cut_stream",
                "rule": "cut_stream#0",
                "decision": "d-cut",
            }
        )
    after = sim.send(post, message.format(n=2), accept=False)
    sim.reject(post, after, "cursor_gap", "sequence 3 skips from 1")
    late = sim.send(post, message.format(n=3), accept=False)
    sim.reject(post, late, "connection_abandoned", "read after the close")
    return post


def test_gate1_a_gap_a_fault_made_is_explained_and_one_the_server_made_is_not(tmp_path: Path) -> None:
    sim = clean_run().sim
    gap_then_abandon(sim, dropped=True)
    g = gate(check(sim, tmp_path / "dropped", server=False), "cross_stream")
    explained = measured(g, "rejections_explained")
    assert (explained["after_fault"], explained["consequence"], explained["unexplained"]) == (1, 1, 0)
    assert "rejected_unexplained" not in server_checks(g)

    sim = clean_run().sim
    post = gap_then_abandon(sim, dropped=False)
    report = check(sim, tmp_path / "skipped", server=False)
    g = gate(report, "cross_stream")
    explained = measured(g, "rejections_explained")
    assert (explained["after_fault"], explained["consequence"], explained["unexplained"]) == (0, 1, 1)
    (w,) = [w for w in g.witnesses if w.check == "rejected_unexplained"]
    assert w.row["flow"] == post.flow and "cursor_gap: sequence 3 skips from 1" in w.explanation
    assert failing(report) == ["cross_stream"]
