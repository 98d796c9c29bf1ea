"""Whose latency: a recovery split into the client's, the lab's and the target's share on
the wire (lab.checker.truth.shares), and gate 5 judging the target on its own share.

Each case slows one segment of one recovery past the budget and checks whose share grows
and what gate 5 says: the target's segment fails the gate against the server; the lab's
or the client's leaves the target's share small, and the gate is inconclusive, "limited by
the lab", never failed. A tap without `t_request` cannot be split: the gate then judges
the whole latency, as it always did."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.checker import judge_dir
from lab.checker.model import Attribution, GateResult, Verdict
from lab.checker.truth.shares import judge_share
from tests.checker.builders import Sim, Stream, clean_run

BUDGET = 5.0
SLOW = 6.0


def resume_timed(
    sim: Sim,
    st: Stream,
    *,
    after: float = 0.2,
    advised: float = 0.1,
    request_hop: float = 0.01,
    target: float = 0.05,
    delivery: float = 0.01,
    timed: bool = True,
) -> None:
    """One cut and resumption of `st`, each segment as long as given (s): the client's wait
    (`after`, of which `advised` was the server's advice), the request's way to the proxy,
    the target's answer (the proxy has the request -> the target's first event), the
    event's way to the client."""
    lost = sim.cut_and_resume(st, after=after, advised=advised)
    flow = next(r for r in reversed(sim.tap) if r["type"] == "flow" and r["flow"] == st.flow)
    sent_at = sim.t
    if timed:
        flow["t_request"] = sent_at + request_hop
    flow["t"] = sent_at + request_hop + 0.001
    sim.t = sent_at + request_hop + target
    data = '{"jsonrpc": "2.0", "method": "notifications/progress", "params": {"p": 1}}'
    event = sim.send(st, data, accept=False)
    sim.t += delivery
    sim.accept(st, event, kind="notification")
    sim.recovered(st, lost, sim.t)


def resume_again(
    sim: Sim, st: Stream, cause: str, advised: float | None, planned: float, lost_at: float, sent_at: float
) -> None:
    """A second resumption of `st`, sent at `sent_at` on a new connection (its reconnect
    row says `lost_at`), which the target answers with an event the client accepts."""
    st.conn, st.conn_id = sim._conn(st.client)
    st.flow = sim._flow()
    st.index = 0
    sim.flow_record(st.flow, st.conn, "GET", st.session, t_request=sent_at + 0.005)
    sim.exchange(st.client, st.conn_id, "resume", "GET", st.key, 200, started_at=sent_at)
    sim.reconnect_row(st, cause, advised, planned, lost_at, sent_at, attempt=1)
    sim.t = sent_at + 0.05
    event = sim.send(
        st, '{"jsonrpc": "2.0", "method": "notifications/progress", "params": {"p": 2}}', accept=False
    )
    sim.accept(st, event, kind="notification")


def p99(g: GateResult, share: str) -> float:
    """The p99 (s) of one share in gate 5's measures."""
    shares = g.measured["shares"]
    assert isinstance(shares, dict)
    figures = shares[share]
    assert isinstance(figures, dict) and isinstance(figures["p99_s"], float)
    return figures["p99_s"]


def gate5(sim: Sim, tmp_path: Path) -> GateResult:
    sim.tick(20.0)
    _, report = judge_dir(sim.write(tmp_path / "run"))
    return next(g for g in report.gates if g.gate == "resume_p99")


def test_a_slow_target_fails_gate_5_against_the_server(tmp_path: Path) -> None:
    run = clean_run()
    resume_timed(run.sim, run.get_a, target=SLOW)
    g = gate5(run.sim, tmp_path)
    assert g.verdict is Verdict.FAIL, g.summary
    assert g.measured["judged_on"] == "target_share"
    assert p99(g, "target") >= SLOW and p99(g, "lab") < 0.1 and p99(g, "client") < 0.5
    (w,) = g.witnesses
    target_s = w.row["target_s"]
    assert w.attribution is Attribution.SERVER and isinstance(target_s, float) and target_s >= SLOW
    assert "shares: client" in w.explanation and "target 6.1" in w.explanation


def test_a_slow_target_beside_a_recovery_that_cannot_be_split_is_still_judged_on_its_share(
    tmp_path: Path,
) -> None:
    # One slow recovery split on the wire (the target's 6 s) and one the tap cannot place
    # (judged on its whole latency): the target's share alone fails the budget, so the
    # failure is the target's, which no saturated lab process may excuse.
    run = clean_run()
    resume_timed(run.sim, run.get_a, target=SLOW)
    resume_timed(run.sim, run.get_b, request_hop=SLOW, timed=False)
    g = gate5(run.sim, tmp_path)
    assert g.verdict is Verdict.FAIL, g.summary
    assert g.measured["judged_on"] == "target_share", g.summary
    assert g.attribution_counts.get("server", 0) >= 1


def test_a_server_advising_a_long_wait_owns_that_wait(tmp_path: Path) -> None:
    run = clean_run()
    resume_timed(run.sim, run.get_a, after=SLOW, advised=SLOW)
    g = gate5(run.sim, tmp_path)
    assert g.verdict is Verdict.FAIL and g.witnesses[0].attribution is Attribution.SERVER


@pytest.mark.parametrize(
    ("segment", "share"),
    [
        ({"request_hop": SLOW}, "lab"),
        ({"delivery": SLOW}, "lab"),
        ({"after": SLOW, "advised": 0.1}, "client"),
    ],
)
def test_a_slow_lab_or_client_is_limited_by_the_lab_never_a_failure(
    tmp_path: Path, segment: dict[str, float], share: str
) -> None:
    run = clean_run()
    resume_timed(
        run.sim,
        run.get_a,
        after=segment.get("after", 0.2),
        advised=segment.get("advised", 0.1),
        request_hop=segment.get("request_hop", 0.01),
        delivery=segment.get("delivery", 0.01),
    )
    g = gate5(run.sim, tmp_path)
    assert g.verdict is Verdict.INCONCLUSIVE, g.summary
    assert "limited by the lab" in g.summary and g.violations == 0
    assert p99(g, share) >= SLOW - 0.5 and p99(g, "target") < 1.0
    assert any(e.name == "the target's share explains the latency" and not e.ok for e in g.evidence)


def test_a_tap_without_request_times_is_judged_on_the_whole_latency(tmp_path: Path) -> None:
    run = clean_run()
    resume_timed(run.sim, run.get_a, request_hop=SLOW, timed=False)
    g = gate5(run.sim, tmp_path)
    assert g.verdict is Verdict.FAIL and g.measured["judged_on"] == "total"
    assert g.measured["shares"] is None and g.witnesses[0].attribution is Attribution.UNATTRIBUTED


def test_judge_share_is_one_rule_for_any_split_latency() -> None:
    assert judge_share(7.0, 6.0, BUDGET, share="target").failed
    limited = judge_share(7.0, 0.4, BUDGET, share="target")
    assert limited.limited_by_lab and not limited.failed and "limited by the lab" in limited.text
    fine = judge_share(1.0, 0.4, BUDGET, share="client")
    assert not fine.failed and not fine.limited_by_lab and "client's share" in fine.text
    assert judge_share(float("inf"), float("inf"), BUDGET, share="target").failed


def test_a_wait_a_proxys_storm_advised_is_the_labs_not_the_targets(tmp_path: Path) -> None:
    """The first resumption is answered 429 by the proxy (an injected storm) with
    Retry-After 6 s; the client waits as advised and the second one succeeds at once."""
    run = clean_run()
    sim, st = run.sim, run.get_a
    lost = sim.cut_and_resume(st, after=0.1, advised=0.1)
    storm = next(r for r in reversed(sim.tap) if r["type"] == "flow" and r["flow"] == st.flow)
    storm.update(status=429, answered_by="proxy", t_request=sim.t + 0.001, t=sim.t + 0.002)
    refused_at = sim.tick(0.01)
    resume_again(sim, st, "http_429", SLOW, SLOW, refused_at, sim.tick(SLOW))
    sim.recovered(st, lost, sim.t)
    g = gate5(sim, tmp_path)
    assert g.verdict is Verdict.INCONCLUSIVE and "limited by the lab" in g.summary, g.summary
    assert p99(g, "lab") >= SLOW and p99(g, "target") < 1.0


def test_an_answer_a_toxic_held_back_is_the_labs_not_the_targets_nor_the_clients(tmp_path: Path) -> None:
    """The first resumption reaches the target, which answers at once; a TCP toxic holds
    the answer back 6 s and resets the connection; the client resumes again and recovers.
    As the lab's client does, every attempt's `lost_at` is the recovery's first loss: the
    6 s are found from the first attempt's own end in the client's ledger."""
    run = clean_run()
    sim, st = run.sim, run.get_a
    lost = sim.cut_and_resume(st, after=0.1, advised=0.1)
    held = next(r for r in reversed(sim.tap) if r["type"] == "flow" and r["flow"] == st.flow)
    held.update(t_request=sim.t + 0.001, t=sim.t + 0.002)
    sim.t += 0.003
    sim.send(st, '{"jsonrpc": "2.0", "method": "notifications/progress", "params": {"p": 1}}', accept=False)
    exchange = next(
        r
        for r in reversed(sim.client_rows["http_exchanges"])
        if r["client_id"] == st.client and r["conn_id"] == st.conn_id
    )
    exchange.update(status=None, error="connection_reset", ended_at=sim.t + SLOW)
    sim.tick(SLOW)
    resume_again(sim, st, "connection_reset", None, 0.3, lost, sim.tick(0.3))
    sim.recovered(st, lost, sim.t)
    g = gate5(sim, tmp_path)
    assert g.verdict is Verdict.INCONCLUSIVE and "limited by the lab" in g.summary, g.summary
    assert p99(g, "lab") >= SLOW and p99(g, "target") < 0.5 and p99(g, "client") < 0.5


def test_a_loss_the_client_declined_to_recover_by_the_retry_rule_is_no_latency(tmp_path: Path) -> None:
    # A write's stream lost without a cursor: the client, by the retry rule, does not re-send
    # it (outcome unknown, `not_resent_<cause>`), so its recovery never ends. That is the
    # client's rule working, not a slow target: left out, and said in a note.
    run = clean_run()
    sim = run.sim
    lost = sim.tick()
    sim.client_row(
        "recoveries", client_id="b", stream_key="post:9", operation_key="op-b-9", cause="peer_closed_mid_body",
        lost_at=lost, recovered_at=None, path="abandoned", attempts=0, reinitialized=0,
    )  # fmt: skip
    sim.client_row(
        "operations", client_id="b", operation_key="op-b-9", tool="ledger.append", write=1, outcome="unknown",
        reason="not_resent_peer_closed_mid_body", attempts=1, started_at=lost - 0.1, finished_at=lost,
        session_generation=sim.clients["b"].generation,
    )  # fmt: skip
    g = gate5(sim, tmp_path / "declined")
    assert g.verdict is Verdict.PASS, g.summary
    assert g.measured["declined"] == 1 and any("chose not to recover" in n for n in g.notes)
    # The same loss without the client's word that it declined: never recovered, a failure.
    sim.client_rows["operations"][-1]["reason"] = "gave_up_after_peer_closed_mid_body"
    g = gate5(sim, tmp_path / "gave-up")
    assert g.verdict is Verdict.FAIL and g.measured["declined"] == 0, g.summary


def test_a_new_handshake_the_target_answered_is_not_its_silence(tmp_path: Path) -> None:
    # A recovery that never ended, whose last attempt was a new handshake the target
    # answered 200 (in JSON: no event): the session was made again, so what kept it from
    # ending came after (behind round-robin replicas: the next request went to a replica
    # without the session). The target's share is what it took to answer, not "never".
    run = clean_run()
    sim, st = run.sim, run.get_b
    lost = sim.tick()
    sent = sim.tick(0.2)
    conn, conn_id = sim._conn(st.client)
    sim.flow_record(sim._flow(), conn, "POST", None, t_request=sent + 0.005, jsonrpc_method="initialize")
    sim.exchange(st.client, conn_id, "reinitialize", "POST", None, 200, started_at=sent, ended_at=sent + 0.05)
    sim.client_row(
        "reconnects", client_id=st.client, kind="reinitialize", stream_key=None, cause="session_gone",
        advised_delay=None, planned_delay=0.2, lost_at=lost, sent_at=sent, waited=0.2, attempt=0,
        conn_id=conn_id, session_generation=sim.clients[st.client].generation,
    )  # fmt: skip
    sim.client_row(
        "recoveries", client_id=st.client, stream_key=st.key, operation_key=None, cause="session_gone",
        lost_at=lost, recovered_at=None, path="session_lost", attempts=1, reinitialized=1,
    )  # fmt: skip
    g = gate5(sim, tmp_path)
    assert g.verdict is not Verdict.FAIL, g.summary  # never recovered, but not the target's doing
    assert p99(g, "target") < 1.0 and "limited by the lab" in g.summary
