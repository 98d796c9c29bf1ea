"""The model-based test's state machine: two ClientCores against the model server, with
every fault at random, judged at the end of each example by the checker's own gates.

`ClientAgainstModel` drives the clients through a `Link` each (tests/client/model_server.py)
that shares one `ModelTap` (tests/client/model_ledgers.py); `run_data()` hands the checker
what the run folder of the example would hold: the clients' ledgers (what the cores
returned, what their inboxes hold), the tap, and the model server's dispatches. The tests
are in tests/client/test_client_model.py; subclasses there give the clients defects.
"""

from __future__ import annotations

import random
from dataclasses import asdict
from types import ModuleType
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from lab.checker import gate_check, run_data_from_records
from lab.checker.context import Context, parse_budgets
from lab.checker.inputs.load import RunData
from lab.checker.judge.verdict import run_rule
from lab.checker.model import GateResult, Verdict
from lab.checker.rules import cross_stream, duplicates, reconnect, rehandshake
from lab.client._acceptance import ALL_CHECKS, Check
from lab.client._commands import CallFinished, CallOutcome
from lab.client._config import ClientConfig
from lab.client._core import ClientCore
from lab.client._memory_inbox import MemoryInbox
from lab.client._reconnect import BackoffPolicy, ReconnectBudget
from lab.wire.client_ledger import ReconnectAttempt
from lab.wire.redact import Redactor
from tests.client.model_ledgers import ModelTap, server_ledger
from tests.client.model_server import Link, ModelServer, settle_together

BUDGET = 4.0
PATIENCE = 600.0
"""Liveness: with the faults over, nothing a client waits for may be more than this many
seconds (of model time) away."""
T0 = 1_800_000_000.0
REDACTOR = Redactor(b"k" * 32)
"""The run key: the clients' pseudonyms and the tap's are the same, as in a run."""
RUN = {"budgets": {"reconnect_qps": BUDGET, "min_events": 1, "min_404": 1, "min_recoveries": 1}}
"""run.json as the gates read it: the clients' shared budget, and evidence minima a
short example can meet (the gate table's 100,000 events are a load run's)."""
GATES = (cross_stream, duplicates, rehandshake, reconnect)

clients = st.integers(0, 1)
conn_pick = st.integers(0, 7)


class ClientAgainstModel(RuleBasedStateMachine):
    checks: frozenset[Check] = ALL_CHECKS
    store_guards = True
    silence_bound = 2.0
    """`resume_silence_s`; `stream_idle_s` is twice as long."""
    client_budget = (BUDGET, 2.0)
    """The reconnect budget the clients share (per second, burst); run.json says BUDGET."""

    def __init__(self) -> None:
        super().__init__()
        self.server = ModelServer(progress_events=2, seed=1)
        self.budget = ReconnectBudget(self.client_budget[0], burst=self.client_budget[1], now=T0)
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
                redactor=REDACTOR,
                rng=random.Random(i),
            )
            for i in range(2)
        ]
        self.tap = ModelTap(REDACTOR)  # one proxy between every client and the server
        self.links = [Link(c, self.server, self.tap) for c in self.cores]
        self.calls = 0
        self.finished = False

    # -- helpers -----------------------------------------------------------------------

    def _conn(self, c: int, pick: int) -> int | None:
        conns = self.links[c].conns()
        return conns[pick % len(conns)] if conns else None

    # -- rules -------------------------------------------------------------------------

    @initialize()
    def connect(self) -> None:
        for core, link in zip(self.cores, self.links, strict=True):
            link.now = T0
            link.run(core.connect(link.now))
        settle_together(self.links)

    @rule(c=clients, write=st.booleans())
    def call(self, c: int, write: bool) -> None:
        self.calls += 1
        _, cmds = self.cores[c].call_tool(
            "ledger.append" if write else "echo", {"n": self.calls}, self.links[c].now, write=write
        )
        self.links[c].run(cmds)

    @rule(c=clients, pick=conn_pick, n=st.integers(1, 4))
    def deliver(self, c: int, pick: int, n: int) -> None:
        conn = self._conn(c, pick)
        if conn is not None:
            self.links[c].deliver(conn, n)

    @rule()
    def deliver_everything(self) -> None:
        """Every open connection delivers what it holds (no time passes): the events that
        pass are the ones a proxy can later replay or inject elsewhere."""
        settle_together(self.links, patience=0.0)

    @rule(c=clients, pick=conn_pick)
    def cut(self, c: int, pick: int) -> None:
        conn = self._conn(c, pick)
        if conn is not None:
            self.links[c].cut(conn)

    @rule(c=clients, pick=conn_pick, retry_ms=st.sampled_from([0, 200, 1500]))
    def polling_close(self, c: int, pick: int, retry_ms: int) -> None:
        conn = self._conn(c, pick)
        if conn is not None:
            self.links[c].polling_close(conn, retry_ms)

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
        `outbox`), built from what the cores returned and what their inboxes hold."""
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

    def finish(self) -> None:
        """End the run as a worker does when it quits: every client closes what is still
        open (each connection gets its exchange record, each call its outcome)."""
        if not self.finished:
            self.finished = True
            for core, link in zip(self.cores, self.links, strict=True):
                link.run(core.close_all(link.now))

    def run_data(self) -> RunData:
        """What the run folder of this example holds, as the checker reads it (the run
        is finished first: a folder is judged once its run has ended)."""
        self.finish()
        return run_data_from_records(
            run=RUN,
            client=[r for link in self.links for r in link.records],
            inbox=[r for inbox in self.inboxes for r in inbox.receipts],
            outbox=[d for inbox in self.inboxes for d in inbox.dispatches],
            server=server_ledger(self.server, REDACTOR),
            tap=self.tap.records,
        )

    # -- the gates ---------------------------------------------------------------------

    def gate(self, module: ModuleType, ctx: Context | None = None) -> GateResult:
        """One gate's result on this example, as `lab report` would decide it (`gate_check`;
        several gates share one `Context`, as in `judge`, so its joins are built once)."""
        result = gate_check(self.run_data(), module) if ctx is None else run_rule(module.RULE, ctx)
        assert result.error is None, f"gate {result.number} could not judge the model run: {result.error}"
        if module is cross_stream:
            # The tap saw everything the server sent: every receipt can be judged.
            assert result.measured["unverifiable"] == 0, result.notes
        return result

    def check_gates(self, *modules: ModuleType) -> None:
        """The gates (default: 1, 2, 3 and 6) must not FAIL on this example."""
        data = self.run_data()
        ctx = Context(data, parse_budgets(data.run))
        for module in modules or GATES:
            passed_or_unsure(self.gate(module, ctx))

    def no_cross_stream_acceptance(self) -> None:
        self.check_gates(cross_stream)

    def no_duplicate_dispatch(self) -> None:
        self.check_gates(duplicates)

    def every_404_is_followed_by_a_new_handshake(self) -> None:
        self.check_gates(rehandshake)

    def reconnects_within_the_budget(self) -> None:
        self.check_gates(reconnect)

    def reconnects_never_earlier_than_planned(self) -> None:
        """The client's own plan (not a gate: gate 6 judges the server's advice)."""
        for r in self.client_ledger().get(ReconnectAttempt.table, []):
            # Epoch seconds near 1.8e9 are floats with a resolution of 2.4e-7 s.
            assert r["sent_at"] - r["lost_at"] >= r["planned_delay"] - 1e-6, r

    def teardown(self) -> None:
        # With the faults over, everything is delivered; then the gates judge the whole
        # example (once: they build pandas frames), and every call must have ended.
        self.server.refuse_next.clear()
        settle_together(self.links, patience=PATIENCE)
        waiting = {
            core.config.client_id: [k for k, call in core.calls.items() if not (call.done or call.queued)]
            for core in self.cores
        }
        self.check_gates()
        self.reconnects_never_earlier_than_planned()
        assert not any(waiting.values()), f"liveness: calls that never ended: {waiting}"


def passed_or_unsure(result: GateResult) -> None:
    """A gate's FAIL as an AssertionError naming the gate, with its witnesses."""
    if result.verdict is Verdict.FAIL:
        lines = "\n".join(f"  - [{w.check}] {w.explanation}" for w in result.witnesses)
        raise AssertionError(f"gate {result.number} ({result.gate}) FAIL: {result.summary}\n{lines}")
