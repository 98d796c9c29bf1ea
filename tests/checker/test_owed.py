"""Gate 5's `unreplayed_resumption`: a resumption on a known cursor owes the messages the
server had sent on that stream after it, on POST and standalone GET streams alike; runs
built by hand (tests/checker/builders.py), each shape seen failing and the legal ones
(a full replay, a replay paid in instalments, a resumption cut before the server had its
turn) seen passing."""

from __future__ import annotations

import json
from pathlib import Path

from lab.checker.judge.verdict import judge_dir
from lab.checker.model import Attribution, GateResult, Verdict
from tests.checker.builders import Event, Sim, Stream, clean_run


def resume_gate(sim: Sim, tmp_path: Path) -> GateResult:
    _, report = judge_dir(sim.write(tmp_path / "run", server=False))
    return next(g for g in report.gates if g.gate == "resume_p99")


def lost(sim: Sim, st: Stream, n: int) -> list[Event]:
    """The server sends `n` notifications on the stream's connection, which the client
    never gets (the connection is already gone on its side)."""
    out = []
    for _ in range(n):
        sim.messages += 1
        data = json.dumps(
            {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"p": sim.messages}}
        )
        out.append(sim.send(st, data, accept=False))
    return out


def end_flow(sim: Sim, st: Stream, reason: str, after: float = 0.01) -> None:
    sim.tap.append({"type": "flow_end", "flow": st.flow, "t": sim.tick(after), "reason": reason})


def owing_call(sim: Sim, request_id: int = 60) -> tuple[Stream, list[Event], float]:
    """A call that delivered 2 messages, then lost 2 the server sent, then was resumed
    from the last one the client has: the resumption owes the 2 lost ones."""
    st = sim.call("a", request_id)
    sim.notify(st, 2)
    owed = lost(sim, st, 2)
    end_flow(sim, st, "client_gone")
    lost_at = sim.cut_and_resume(st, after=0.2, advised=0.1)
    return st, owed, lost_at


def test_a_resumption_closed_at_once_with_nothing_fails_on_the_server(tmp_path: Path) -> None:
    sim = clean_run().sim
    st, owed, _ = owing_call(sim)
    resumed_flow = st.flow
    end_flow(sim, st, "complete")  # 200, then closed: nothing replayed
    g = resume_gate(sim, tmp_path)
    assert g.verdict is Verdict.FAIL, g.summary
    assert g.measured["unreplayed_resumptions"] == 1 and g.measured["resumptions_owing_events"] == 1
    assert g.attribution_counts.get("server") == 1
    (w,) = [w for w in g.witnesses if w.check == "unreplayed_resumption"]
    assert w.attribution is Attribution.SERVER
    assert w.row["flow"] == resumed_flow and w.row["owed"] == 2 and w.row["paid"] == 0
    assert w.row["shape"] == "nothing"
    assert owed[0].event_id[:40] in w.explanation and "closed it (complete)" in w.explanation


def test_a_standalone_get_resumption_left_silent_fails(tmp_path: Path) -> None:
    sim = clean_run().sim
    get = sim.open_get("a")
    sim.notify(get, 1)
    lost(sim, get, 3)
    end_flow(sim, get, "client_gone")
    sim.cut_and_resume(get, after=0.2, advised=0.1)
    end_flow(sim, get, "client_gone", after=8.0)  # open 8 s (budget 5 s), and nothing came
    g = resume_gate(sim, tmp_path)
    assert g.verdict is Verdict.FAIL and g.measured["unreplayed_resumptions"] == 1, g.summary
    (w,) = [w for w in g.witnesses if w.check == "unreplayed_resumption"]
    assert w.row["owed"] == 3 and "left it open" in w.explanation


def test_a_resumption_that_skips_owed_messages_fails(tmp_path: Path) -> None:
    sim = clean_run().sim
    st, owed, _ = owing_call(sim)
    sim.resend(st, owed[1])  # the second lost one, not the first
    sim.notify(st, 1)  # and goes on live
    end_flow(sim, st, "client_gone")
    g = resume_gate(sim, tmp_path)
    assert g.verdict is Verdict.FAIL, g.summary
    (w,) = [w for w in g.witnesses if w.check == "unreplayed_resumption"]
    assert w.row["shape"] == "skipped" and w.row["paid"] == 1
    assert "while 1 message(s) it had to replay first (owed) never came" in w.explanation


def test_forgetting_the_backlog_but_streaming_on_is_a_skip(tmp_path: Path) -> None:
    sim = clean_run().sim
    st, _, _ = owing_call(sim)
    sim.notify(st, 2)  # live messages only: what was owed is forgotten
    end_flow(sim, st, "client_gone")
    g = resume_gate(sim, tmp_path)
    (w,) = [w for w in g.witnesses if w.check == "unreplayed_resumption"]
    assert g.verdict is Verdict.FAIL and w.row["shape"] == "skipped" and w.row["paid"] == 0


def test_a_full_replay_passes(tmp_path: Path) -> None:
    sim = clean_run().sim
    st, owed, lost_at = owing_call(sim)
    for ev in owed:
        sim.resend(st, ev)
    sim.recovered(st, lost_at, sim.t)
    sim.respond(st)
    end_flow(sim, st, "complete")
    g = resume_gate(sim, tmp_path)
    assert g.verdict is Verdict.PASS, g.summary
    assert g.measured["unreplayed_resumptions"] == 0 and g.measured["resumptions_owing_events"] == 1


def test_a_replay_paid_in_instalments_passes(tmp_path: Path) -> None:
    """A server that pages: the first owed message, a `retry`, a close; the next
    resumption carries the rest. Legal (some deployments poll like this)."""
    sim = clean_run().sim
    st, owed, lost_at = owing_call(sim)
    sim.resend(st, owed[0])
    end_flow(sim, st, "complete")
    sim.cut_and_resume(st, after=0.05, advised=0.0)
    sim.resend(st, owed[1])
    sim.recovered(st, lost_at, sim.t)
    sim.respond(st)
    end_flow(sim, st, "complete")
    g = resume_gate(sim, tmp_path)
    assert g.measured["unreplayed_resumptions"] == 0 and g.measured["resumptions_owing_events"] == 2
    assert g.verdict is Verdict.PASS, g.summary


def test_a_resumption_cut_before_the_server_had_its_turn_is_not_judged(tmp_path: Path) -> None:
    sim = clean_run().sim
    st, owed, lost_at = owing_call(sim)
    end_flow(sim, st, "cut_by_fault", after=0.05)  # the lab cut it at once
    sim.cut_and_resume(st, after=0.1, advised=0.0)
    for ev in owed:
        sim.resend(st, ev)
    sim.recovered(st, lost_at, sim.t)
    sim.respond(st)
    end_flow(sim, st, "complete")
    g = resume_gate(sim, tmp_path)
    assert g.measured["unreplayed_resumptions"] == 0, g.summary
    assert g.verdict is Verdict.PASS, g.summary
