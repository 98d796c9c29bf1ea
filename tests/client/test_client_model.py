"""Model-based test: two ClientCores against the model server, with every fault at random
(the state machine is tests/client/model_machine.py).

The lab's gates judge every example, by the checker's own code (`lab.checker`), never by
rules re-written here: at the end of each example the clients' ledgers (what the cores
returned, what their inboxes hold), the Link's tap of what passed (`ModelTap`, records of
`mcpLabTap.v1`) and the model server's dispatches go to `run_data_from_records`, and
- gate 1: no event accepted on a stream it does not belong to;
- gate 2: no duplicate business dispatch (server, wire, outbox, inbox);
- gate 3: every 404 to a request carrying a session ID is followed by a new handshake;
- gate 6: reconnects within the shared budget in every 1-second bin, no wait shorter
  than the server advised;
must not FAIL (a short example may well be INCONCLUSIVE: too little evidence to pass).
A FAIL raises AssertionError with the gate's witnesses; so does a gate whose code raised.

Two checks stay model-side, as they are no gate's: liveness (at the end, with the faults
over, every call ends, even one whose resumed stream stayed silent or whose stream
stalled after its priming event), and no reconnect sent earlier than the client itself
planned (its `planned_delay`; gate 6 judges the server's advice, not the client's plan).

`test_the_invariants_catch_a_client_without_checks` shows the gates are not hollow here:
the same machine, with the acceptance checks switched off, is caught; and
`test_a_real_gate_fails_a_defective_client_and_not_the_pristine_one` shows each gate
failing a client with one defect, and not the pristine client, on the same steps.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from lab.checker.model import Verdict
from lab.checker.rules import cross_stream, duplicates, reconnect, rehandshake
from lab.client._acceptance import Check
from lab.client._commands import Purpose
from lab.client._core import ClientCore
from lab.client._handshake import Handshake
from lab.client._model import Conn
from tests.client.model_ledgers import server_ledger
from tests.client.model_machine import BUDGET, PATIENCE, REDACTOR, ClientAgainstModel
from tests.client.model_server import settle_together

# Each example ends with the gates (~0.15 s of pandas): fewer, longer examples than a
# machine with cheap invariants would run. 60 of 60 steps: 100 took a minute and a half
# of one CI worker on a box the suite keeps busy (the suite must stay well under ten
# minutes). A longer search, by hand: LAB_MODEL_EXAMPLES=1000 pytest tests/client/test_client_model.py
TestClientAgainstModel = ClientAgainstModel.TestCase
TestClientAgainstModel.settings = settings(
    max_examples=int(os.environ.get("LAB_MODEL_EXAMPLES", "60")),
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestClientAgainstModel.pytestmark = [pytest.mark.long(1)]  # type: ignore[attr-defined]  # about a minute of one worker


class ClientWithoutChecks(ClientAgainstModel):
    """The same client with the stream, cursor, duplicate and correlation checks off,
    and no uniqueness guard in its store: the gates must catch it."""

    checks = frozenset({Check.SESSION, Check.VERSION, Check.SUBJECT})
    store_guards = False


def test_the_invariants_catch_a_client_without_checks() -> None:
    # Derandomized, so this shows the same thing on every run rather than usually; not
    # shrunk (the smallest failing example is not the point, and each try runs the gates).
    with pytest.raises(AssertionError, match=r"^gate [12] \(\w+\) FAIL"):
        run_state_machine_as_test(
            ClientWithoutChecks,
            settings=settings(
                max_examples=500,
                stateful_step_count=40,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                database=None,
                derandomize=True,
                print_blob=False,
                report_multiple_bugs=False,
                phases=(Phase.explicit, Phase.generate),
            ),
        )


def faulty_stream(m: ClientAgainstModel, fault: str) -> None:
    """Client c0 gets a notification on its standalone stream, starts a write, and its
    POST stream then delivers, after two events, an event the Link put there: a copy of
    that notification (`foreign_event`) or of its own last event (`replay_after_ack`)."""
    m.connect()
    m.push_notification(c=0)
    m.deliver(c=0, pick=0, n=2)  # the standalone stream delivers the notification
    m.call(c=0, write=True)
    link = m.links[0]
    post = link.conns(Purpose.CALL)[0]
    link.deliver(post, 2)
    if fault == "foreign_event":
        chunk = link.foreign_chunk(
            m.cores[0].session_id or "", same_session=True, not_stream=link.stream_of(post)
        )
        assert chunk is not None
        link.inject(post, chunk)
    else:
        link.replay_delivered(post, which=-1)
    link.deliver(post, 1)


FAULT_GATES = {"foreign_event": cross_stream, "replay_after_ack": duplicates}


@pytest.mark.parametrize("fault", list(FAULT_GATES))
def test_each_fault_breaks_an_invariant_of_a_client_without_checks(fault: str) -> None:
    m = ClientWithoutChecks()
    faulty_stream(m, fault)
    gate = FAULT_GATES[fault]
    with pytest.raises(AssertionError, match=rf"^gate {gate.RULE.number} "):
        m.check_gates(gate)


class IgnoresSessionLoss(Handshake):
    """A 404 to a request with the session ID ends that request, and nothing more: the
    client keeps using the expired session (no new handshake)."""

    def session_not_found(self, conn: Conn, now: float) -> None:
        self.http.abort(conn, now, "session_not_found")


def with_handshake(core: ClientCore, part: type[Handshake]) -> None:
    """Give `core` another handshake part, made of the same state and parts (only the core
    holds its handshake, so nothing else needs to learn of the new one)."""
    h = core.handshake
    core.handshake = part(
        h.state,
        h.config,
        http=h.http,
        reconnector=h.reconnector,
        table=h.table,
        calling=h.calling,
        streaming=h.streaming,
        leaving=h.leaving,
        tools=h.tools,
    )


class ClientIgnoring404(ClientAgainstModel):
    def __init__(self) -> None:
        super().__init__()
        for core in self.cores:
            with_handshake(core, IgnoresSessionLoss)


class ClientOverItsBudget(ClientAgainstModel):
    """Reconnects under ten times the budget that run.json gives the clients."""

    client_budget = (10 * BUDGET, 20.0)


def expired_then_two_calls(m: ClientAgainstModel) -> None:
    m.connect()
    m.expire_session(c=0)
    m.call(c=0, write=True)  # 404
    m.advance(dt=1.0)
    m.call(c=0, write=True)
    m.advance(dt=1.0)
    settle_together(m.links)


def all_streams_cut_at_once(m: ClientAgainstModel) -> None:
    m.connect()
    for c in (0, 1):
        for _ in range(3):
            m.call(c=c, write=False)
        for post in m.links[c].conns(Purpose.CALL):
            m.links[c].deliver(post, 1)  # the priming event: a cursor to resume from
    for c in (0, 1):
        for conn in m.links[c].conns():
            m.links[c].cut(conn)
    settle_together(m.links)


DEFECTS: dict[str, tuple[type[ClientAgainstModel], Any, ModuleType, str]] = {
    # defect: (machine, the steps, the gate that must catch it, the check that does)
    "checks_off_foreign_event": (
        ClientWithoutChecks,
        lambda m: faulty_stream(m, "foreign_event"),
        cross_stream,
        "not_sent_on_stream",
    ),
    "checks_off_replay": (
        ClientWithoutChecks,
        lambda m: faulty_stream(m, "replay_after_ack"),
        duplicates,
        "inbox_duplicate",
    ),
    "ignores_404": (ClientIgnoring404, expired_then_two_calls, rehandshake, "no_rehandshake"),
    "over_budget": (ClientOverItsBudget, all_streams_cut_at_once, reconnect, "over_budget"),
}


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_a_real_gate_fails_a_defective_client_and_not_the_pristine_one(defect: str) -> None:
    machine, steps, gate, check = DEFECTS[defect]
    bad = machine()
    steps(bad)
    result = bad.gate(gate)
    assert result.verdict is Verdict.FAIL, result.summary
    assert check in {w.check for w in result.witnesses}, result.witnesses
    good = ClientAgainstModel()
    steps(good)
    result = good.gate(gate)
    assert result.verdict is not Verdict.FAIL, result.summary
    assert result.violations == 0, result.summary


class ResendsInTheExpiredSession(Handshake):
    """After a 404, the client sends the call again in the expired session, at once, and
    only then the new handshake."""

    def session_not_found(self, conn: Conn, now: float) -> None:
        if conn.call is not None and not conn.call.done:
            self.calling.send(conn.call, now)  # still carries the expired session ID
        super().session_not_found(conn, now)


class ClientResendingInTheExpiredSession(ClientAgainstModel):
    def __init__(self) -> None:
        super().__init__()
        for core in self.cores:
            with_handshake(core, ResendsInTheExpiredSession)


@pytest.mark.parametrize("machine", [ClientAgainstModel, ClientResendingInTheExpiredSession])
def test_gate_3_judges_what_a_client_sends_at_the_instant_of_a_404(machine: type[ClientAgainstModel]) -> None:
    # The core opens its reaction to a 404 in the same step, stamped with the 404's own
    # time: that request is the "next" one, and must be the new initialize.
    m = machine()
    m.connect()
    m.advance(dt=0.3)
    m.expire_session(c=0)
    m.call(c=0, write=True)
    calls = [r for r in m.links[0].requests if r.purpose is Purpose.CALL]
    m.advance(dt=1.0)
    settle_together(m.links)
    result = m.gate(rehandshake)
    assert result.measured["session_404s"] == 1
    if machine is ClientResendingInTheExpiredSession:
        # 404: the call went again in the expired session, then the initialize.
        assert len(calls) == 2 and calls[0].header("mcp-session-id") == calls[1].header("mcp-session-id")
        assert result.verdict is Verdict.FAIL
    else:
        # Judged, and handled (the verdict itself may lack other evidence in so short a run).
        assert result.measured["rehandshaken"] == 1 and result.violations == 0


def test_the_model_ledger_has_the_columns_the_checker_reads() -> None:
    from lab.checker.inputs.schemas import CLIENT_TABLES, SERVER_TABLES, TAP_RECORDS

    m = ClientAgainstModel()
    m.connect()
    m.call(c=0, write=True)
    m.cut(c=0, pick=1)
    m.advance(dt=2.5)
    settle_together(m.links)
    tables = m.client_ledger()
    assert {"inbox", "outbox", "http_exchanges", "reconnects", "recoveries", "operations"} <= set(tables)
    for name, rows in tables.items():
        assert rows, name
        assert set(CLIENT_TABLES[name]) <= set(rows[0]), name
    tap = m.tap.records
    for kind in ("flow", "sent", "forwarded", "dropped", "flow_end", "result"):
        rows = [r for r in tap if r["type"] == kind]
        assert rows, kind
        assert all(set(TAP_RECORDS[kind]) <= set(r) for r in rows), kind
    (dispatches,) = server_ledger(m.server, REDACTOR).values()
    assert [d["effect"] for d in dispatches] == ["performed", "replayed"]  # the write, re-sent
    assert all(set(SERVER_TABLES["dispatches"]) <= set(d) for d in dispatches)
    # The tap tells the model server's truth: every message it says was sent, was sent
    # there, and no raw session ID or token is in it.
    truth = {(REDACTOR.session(sid), stream, digest) for sid, stream, digest in m.server.sent}
    messages = [r for r in tap if r["type"] == "sent" and r["has_data"] and not r["priming"]]
    assert messages and all((r["session"], r["stream_id"], r["digest"]) in truth for r in messages)
    assert not any(sid in repr(tap) for sid in m.server.sessions) and "user0" not in repr(tap)
    g1 = m.gate(cross_stream)
    assert g1.verdict is Verdict.INCONCLUSIVE  # no stream crossing was injected: no evidence
    assert (
        g1.measured["verified"]
        == g1.measured["receipts_checked"]
        == len([r for inbox in m.inboxes for r in inbox.receipts if r.kind != "priming"])
    )


class ClientWithoutSilenceBounds(ClientAgainstModel):
    """The same client, bounds so long that silence is waited out forever."""

    silence_bound = 2 * PATIENCE


def test_liveness_catches_a_client_that_waits_for_a_silent_stream() -> None:
    for machine in (ClientAgainstModel, ClientWithoutSilenceBounds):
        m = machine()
        m.connect()
        m.stalled_call()
        m.call(c=0, write=True)
        if machine is ClientAgainstModel:
            m.teardown()  # the stalled stream is given up on, resumed, and the call ends
        else:
            with pytest.raises(AssertionError, match=r"^liveness: "):
                m.teardown()


def test_a_resend_under_way_when_the_404_arrives_is_not_the_reaction_to_it() -> None:
    """Two calls refused with 429 are resent in one step; the first resend gets 404 and
    the client drops the second, unanswered, at that same instant. That second resend was
    under way, not the client's next request: the new initialize that follows is."""
    m = ClientAgainstModel()
    m.connect()
    m.storm(n=2, retry_after=None, status=429)
    m.call(c=0, write=False)
    m.call(c=0, write=False)
    m.expire_session(c=0)
    m.advance(dt=1.0)
    m.advance(dt=2.5)
    settle_together(m.links)
    result = m.gate(rehandshake)
    assert result.verdict is not Verdict.FAIL, result.summary
    assert result.violations == 0, result.summary
    assert result.measured["rehandshaken"] == 1, result.measured  # judged, and handled
