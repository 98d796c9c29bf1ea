"""Model-based test: two ClientCores against the model server, with every fault at random.

Invariants (the lab's gates, on the ground truth of the model server):
- no cross-stream acceptance: every accepted message was sent by the server on the
  stream (of the session) the client filed it under;
- no duplicate dispatch: no idempotency key caused two side effects on the server, and no
  message was dispatched twice by a client;
- every 404 to a request carrying a session ID is followed by a new initialize without one;
- reconnect attempts of the process never exceed the shared budget in any 1-second bin;
- liveness (at the end): with the faults over, every call ends, even one whose resumed
  stream stayed silent or whose stream stalled after its priming event.

And `test_the_invariants_catch_a_client_without_checks` shows the invariants are not
hollow: the same machine, with the acceptance checks switched off, is caught.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import asdict
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from lab.client._acceptance import ALL_CHECKS, Check, MemoryInbox
from lab.client._commands import CallFinished, CallOutcome, Purpose
from lab.client._config import ClientConfig
from lab.client._core import ClientCore
from lab.client._reconnect import BackoffPolicy, ReconnectBudget
from lab.wire.client_ledger import ReconnectAttempt
from lab.wire.event_ids import post_stream_id, session_tag
from lab.wire.redact import Redactor
from tests.client.model_server import Link, ModelServer

BUDGET = 4.0
PATIENCE = 600.0
"""Liveness: with the faults over, nothing a client waits for may be more than this many
seconds (of model time) away."""
T0 = 1_800_000_000.0

clients = st.integers(0, 1)
conn_pick = st.integers(0, 7)


class ClientAgainstModel(RuleBasedStateMachine):
    checks: frozenset[Check] = ALL_CHECKS
    store_guards = True
    silence_bound = 2.0
    """`resume_silence_s`; `stream_idle_s` is twice as long."""

    def __init__(self) -> None:
        super().__init__()
        self.server = ModelServer(progress_events=2, seed=1)
        self.budget = ReconnectBudget(BUDGET, burst=2.0, now=T0)
        self.inboxes = [MemoryInbox(enforce_unique=self.store_guards) for _ in range(2)]
        self.cores = [
            ClientCore(
                ClientConfig(
                    client_id=f"c{i}",
                    token=f"user{i}",
                    auth_subject=f"user{i}",
                    backoff=BackoffPolicy(0.1, 1.0),
                    max_attempts=6,
                    resume_silence_s=self.silence_bound,
                    stream_idle_s=2 * self.silence_bound,
                    checks=self.checks,
                ),
                inbox=self.inboxes[i],
                budget=self.budget,  # one budget for every client of the process
                redactor=Redactor(b"k" * 32),
                rng=random.Random(i),
            )
            for i in range(2)
        ]
        self.links = [Link(c, self.server) for c in self.cores]
        self.gen_sid: dict[tuple[int, int], str] = {}
        self.calls = 0

    # -- helpers -----------------------------------------------------------------------

    def _note_sessions(self) -> None:
        for i, core in enumerate(self.cores):
            if core.session_id is not None:
                self.gen_sid.setdefault((i, core.generation), core.session_id)

    def _conn(self, c: int, pick: int) -> int | None:
        conns = self.links[c].conns()
        return conns[pick % len(conns)] if conns else None

    # -- rules -------------------------------------------------------------------------

    @initialize()
    def connect(self) -> None:
        for core, link in zip(self.cores, self.links, strict=True):
            link.now = T0
            link.run(core.connect(link.now))
            link.settle()
        self._note_sessions()

    @rule(c=clients, write=st.booleans())
    def call(self, c: int, write: bool) -> None:
        self.calls += 1
        _, cmds = self.cores[c].call_tool(
            "ledger.append" if write else "echo", {"n": self.calls}, self.links[c].now, write=write
        )
        self.links[c].run(cmds)
        self._note_sessions()

    @rule(c=clients, pick=conn_pick, n=st.integers(1, 4))
    def deliver(self, c: int, pick: int, n: int) -> None:
        conn = self._conn(c, pick)
        if conn is not None:
            self.links[c].deliver(conn, n)
        self._note_sessions()

    @rule(c=clients, pick=conn_pick)
    def cut(self, c: int, pick: int) -> None:
        conn = self._conn(c, pick)
        if conn is not None:
            self.links[c].cut(conn)
        self._note_sessions()

    @rule(c=clients, pick=conn_pick, retry_ms=st.sampled_from([0, 200, 1500]))
    def polling_close(self, c: int, pick: int, retry_ms: int) -> None:
        conn = self._conn(c, pick)
        if conn is not None:
            self.links[c].polling_close(conn, retry_ms)
        self._note_sessions()

    @rule(c=clients, pick=conn_pick)
    def replay_after_ack(self, c: int, pick: int) -> None:
        conn = self._conn(c, pick)
        if conn is not None:
            self.links[c].replay_delivered(conn)

    @rule(c=clients, pick=conn_pick, same_session=st.booleans())
    def inject_foreign_event(self, c: int, pick: int, same_session: bool) -> None:
        conn = self._conn(c, pick)
        sid = self.cores[c].session_id
        if conn is None or sid is None:
            return
        chunk = self.links[c].foreign_chunk(
            sid, same_session=same_session, not_stream=self.links[c].stream_of(conn)
        )
        if chunk is not None:
            self.links[c].inject(conn, chunk)

    @rule(c=clients)
    def expire_session(self, c: int) -> None:
        sid = self.cores[c].session_id
        if sid is not None and sid in self.server.sessions:
            self.server.expire(sid)

    @rule(
        status=st.sampled_from([429, 503]),
        retry_after=st.sampled_from([None, "0", "1", "2"]),
        n=st.integers(1, 3),
    )
    def storm(self, status: int, retry_after: str | None, n: int) -> None:
        self.server.refuse_next += [(status, retry_after)] * n

    @rule(n=st.integers(1, 3))
    def silent_resumptions(self, n: int) -> None:
        """The next resumptions are answered with a stream that never carries anything."""
        self.server.silent_resumes += n

    @rule()
    def stalled_call(self) -> None:
        """The next call's stream sends its priming event, then nothing, held open."""
        self.server.stalled_calls += 1

    @rule(c=clients)
    def push_notification(self, c: int) -> None:
        sid = self.cores[c].session_id
        if sid is not None and sid in self.server.sessions and self.server.sessions[sid].alive:
            self.links[c].push(sid)

    @rule(dt=st.sampled_from([0.05, 0.3, 1.0, 2.5]))
    def advance(self, dt: float) -> None:
        t = self.links[0].now + dt
        for link in self.links:
            link.advance_to(t)
        self._note_sessions()

    @rule(c=clients)
    def retry_unknown(self, c: int) -> None:
        core = self.cores[c]
        for n in self.links[c].notices:
            if isinstance(n, CallFinished) and n.outcome is CallOutcome.UNKNOWN:
                call = core.calls[n.call.operation_key]
                if call.done:
                    self.links[c].run(core.retry_call(n.call, self.links[c].now))
                    return

    # -- the ledgers, as the checker reads them ----------------------------------------

    def client_ledger(self) -> dict[str, list[dict[str, Any]]]:
        """Both clients' ledgers as rows of the tables of `mcpClientLedger.v1` (the names
        and columns of the SQLite files: the record types' tables, plus `inbox` and
        `outbox`), built from what the cores returned and what their inboxes hold. The
        invariants below read it, and so can any function that checks ledgers."""
        tables: dict[str, list[dict[str, Any]]] = {"inbox": [], "outbox": []}
        for link in self.links:
            for r in link.records:
                tables.setdefault(r.table, []).append(asdict(r))
        for inbox in self.inboxes:
            for rec in inbox.receipts:
                row = {k: v for k, v in asdict(rec).items() if k != "key"}
                tables["inbox"].append({**row, **asdict(rec.key)})
            for d in inbox.dispatches:
                row = {k: v for k, v in asdict(d).items() if k != "key"}
                tables["outbox"].append({**row, **asdict(d.key)})
        return tables

    # -- invariants --------------------------------------------------------------------

    def _server_stream(self, c: int, generation: int, stream_key: str) -> tuple[str, str]:
        sid = self.gen_sid[(c, generation)]
        if stream_key.startswith("post:"):
            return sid, post_stream_id(session_tag(sid), int(stream_key.split(":")[1]))
        return self.links[c].standalone[stream_key]

    @invariant()
    def no_cross_stream_acceptance(self) -> None:
        for c, inbox in enumerate(self.inboxes):
            for r in inbox.receipts:
                if r.kind == "priming":
                    continue
                sid, stream = self._server_stream(c, r.key.session_generation, r.key.stream_key)
                assert (sid, stream, r.key.message_digest) in self.server.sent, (
                    f"client c{c} accepted on {r.key.stream_key} a message the server never sent there: {r.data}"
                )

    @invariant()
    def no_duplicate_dispatch(self) -> None:
        assert all(n <= 1 for n in self.server.effects.values()), self.server.effects
        for c, inbox in enumerate(self.inboxes):
            seen: Counter[tuple[str, str, str]] = Counter()
            for d in inbox.dispatches:
                seen[
                    (
                        *self._server_stream(c, d.key.session_generation, d.key.stream_key),
                        d.key.message_digest,
                    )
                ] += 1
            assert all(n == 1 for n in seen.values()), f"client c{c} dispatched a message twice"
            keys = [d.dispatch_key for d in inbox.dispatches]
            assert len(keys) == len(set(keys))
            # The business layer reads the inbox: a message in it twice is delivered twice.
            received = [r.key for r in inbox.receipts]
            assert len(received) == len(set(received)), f"client c{c} accepted an event twice"

    @invariant()
    def every_404_is_followed_by_a_new_handshake(self) -> None:
        for link in self.links:
            for req, after in zip(link.requests, link.after_404, strict=True):
                if after:
                    assert req.purpose is Purpose.INITIALIZE and req.header("mcp-session-id") is None

    @invariant()
    def reconnects_within_the_budget(self) -> None:
        bins: Counter[int] = Counter()
        for r in self.client_ledger().get(ReconnectAttempt.table, []):
            bins[math.floor(r["sent_at"])] += 1
            assert r["sent_at"] - r["lost_at"] >= r["planned_delay"] - 1e-9  # never earlier than planned
        assert max(bins.values(), default=0) <= math.floor(BUDGET)

    def teardown(self) -> None:
        # Liveness: with the faults over, every call ends, and writes happened at most once.
        self.server.refuse_next.clear()
        for link in self.links:
            link.settle(patience=PATIENCE)
        for core in self.cores:
            assert all(call.done or call.queued for call in core.calls.values())


TestClientAgainstModel = ClientAgainstModel.TestCase
TestClientAgainstModel.settings = settings(
    max_examples=max(150, settings().max_examples),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class ClientWithoutChecks(ClientAgainstModel):
    """The same client with the stream, cursor, duplicate and correlation checks off,
    and no uniqueness guard in its store: the invariants must catch it."""

    checks = frozenset({Check.SESSION, Check.VERSION, Check.SUBJECT})
    store_guards = False


def test_the_invariants_catch_a_client_without_checks() -> None:
    # Derandomized, so this shows the same thing on every run rather than usually.
    with pytest.raises(AssertionError):
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
            ),
        )


@pytest.mark.parametrize("fault", ["foreign_event", "replay_after_ack"])
def test_each_fault_breaks_an_invariant_of_a_client_without_checks(fault: str) -> None:
    m = ClientWithoutChecks()
    m.connect()
    m.push_notification(c=0)
    m.deliver(c=0, pick=0, n=2)  # the standalone stream delivers the notification
    m.call(c=0, write=True)
    post = m.links[0].conns(Purpose.CALL)[0]
    m.links[0].deliver(post, 2)
    if fault == "foreign_event":
        chunk = m.links[0].foreign_chunk(
            m.cores[0].session_id or "", same_session=True, not_stream=m.links[0].stream_of(post)
        )
        assert chunk is not None
        m.links[0].inject(post, chunk)
    else:
        m.links[0].replay_delivered(post)
        m.links[0].open[post].chunks.insert(0, m.links[0].open[post].delivered[-1])
    m.links[0].deliver(post, 1)
    with pytest.raises(AssertionError):
        m.no_cross_stream_acceptance()
        m.no_duplicate_dispatch()


def test_the_model_ledger_has_the_columns_the_checker_reads() -> None:
    from lab.checker.schemas import CLIENT_TABLES

    m = ClientAgainstModel()
    m.connect()
    m.call(c=0, write=True)
    m.cut(c=0, pick=1)
    m.advance(dt=2.5)
    m.links[0].settle()
    tables = m.client_ledger()
    assert {"inbox", "outbox", "http_exchanges", "reconnects", "recoveries", "operations"} <= set(tables)
    for name, rows in tables.items():
        assert rows, name
        assert set(CLIENT_TABLES[name]) <= set(rows[0]), name


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
            with pytest.raises(AssertionError):
                m.teardown()
