"""What a run folder would hold for a model run, so the checker's real gates can judge it.

The `Link` (tests/client/model_server.py) plays the network between a `ClientCore` and the
model server, like the lab's proxy; it tells the `ModelTap` here what passed, and the tap
writes the records the proxy's tap writes (`mcpLabTap.v1`, docs/ledgers.md):

- `flow` when a response head reaches the client (or the flow ends without one), built
  by the tap addon's own pure builders (`lab.faults.facts.read_request`,
  `lab.faults.records.flow_record`): `conn` is the request's `x-lab-conn`, the session
  and token are pseudonyms under the clients' run key;
- `sent` for every event of the model server as it passes the network (before any
  fault), `forwarded` for what the client then gets: the server's own event untouched,
  or, with a `fault` and the `source` it was copied from, an event the Link replayed or
  injected; `dropped` for the server's events a cut lost, and `flow_end`;
- `result` for every answer to a write call (`lab.faults.results`, as the tap does).

An event "passes" when the Link delivers it, or when a cut drops it: the events the model
server produced for a connection wait in the Link until then (`TapFlow.pending`), and a
stream the server closes the polling way never sends the ones still waiting (they are
replayed to the resumption). The Link names the chunks it puts in a flow's way (`faulted`,
with the fault kind whose effect it has); the server's own are the flow's pending events
(every encoded event is unique: its `e1` ID names session, stream and sequence); a chunk
that is neither, put there by hand in a test, is a replay if it was sent before, else an
injection. Records are timed by the Link's model time, but two are never simultaneous
(`TICK`): in the model a whole exchange happens at one instant, and the checker orders
what the server sent by time.

`server_ledger` gives the server ledger's `dispatches` (the model server knows whether
each write was performed or replayed). No other server table is written: what the server
sent is the tap's, which is the truth the checker prefers anyway.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lab.faults.facts import RequestFacts, read_request
from lab.faults.records import flow_record
from lab.faults.results import ResultWatch, WriteCall, WriteCalls
from lab.wire.event_ids import message_digest, parse_event_id
from lab.wire.redact import Redactor
from lab.wire.revisions import SESSION_HEADER
from lab.wire.sse import SseDecoder, SseEvent

if TYPE_CHECKING:
    from tests.client.model_server import ModelServer

MCP_PATH = "/mcp"
TICK = 1e-6
"""Seconds between tap records written at one model instant (epoch floats near 1.8e9
resolve 2.4e-7 s)."""
RULE = "model"
"""The `rule` of every fault the Link injects (a model run has no fault plan)."""
# The fault kinds (docs/faults.md) whose effect each Link fault has.
REPLAY = "replay_after_ack"
INJECT = "inject_foreign"
CUT = "cut_stream"
LOST_ANSWER = "executed_then_lost"


@dataclass(slots=True)
class TapFlow:
    """One request as the tap follows it."""

    flow: str
    facts: RequestFacts
    headers: dict[str, str]
    write: WriteCall | None
    sse: bool = False
    head_written: bool = False
    ended: bool = False
    sent: int = 0
    forwarded: int = 0
    pending: list[bytes] = field(default_factory=list)
    """The server's events for this flow that the Link holds (not yet passed)."""
    faulted: list[tuple[bytes, str]] = field(default_factory=list)
    """Events the Link put in this flow's way, with the fault kind that did it."""


@dataclass(frozen=True, slots=True)
class SentEvent:
    """An event the server sent, as a fault can copy it: where it was first sent."""

    flow: str
    index: int
    session: str | None
    stream_id: str | None
    has_message: bool
    chunk: bytes


def _event(chunk: bytes) -> SseEvent:
    decoder = SseDecoder()
    events = decoder.feed(chunk)
    decoder.end_of_stream()
    if len(events) != 1:
        raise ValueError(f"the model sends one SSE event per chunk, not {len(events)}: {chunk!r}")
    return events[0]


class ModelTap:
    """The proxy tap of a model run: `records` is what `proxy/tap.jsonl` would hold."""

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor
        self.records: list[dict[str, Any]] = []
        self.writes = WriteCalls()
        self.events: dict[bytes, SentEvent] = {}
        """Every event that was sent, by its bytes: where it was first sent."""
        self._flow_ids = itertools.count(1)
        self._decisions = itertools.count(1)
        self._last_t = 0.0

    def _clock(self, now: float) -> float:
        """The time of a tap record: the Link's model time, but never the same instant as
        the record before. The checker orders what the server sent by time (then by the
        index within a flow); a real tap practically never writes two records at one
        instant, but in the model a whole exchange happens at one."""
        self._last_t = max(now, self._last_t + TICK)
        return self._last_t

    # -- flows -------------------------------------------------------------------------

    def request(self, method: str, headers: Sequence[tuple[str, str]], body: bytes | None) -> TapFlow:
        """A request passes to the server."""
        flow_id = f"m{next(self._flow_ids)}"
        h = {k.lower(): v for k, v in headers}
        facts = read_request(flow_id, method, MCP_PATH, h, body, self.redactor)
        write = None
        if facts.rpc.is_write:  # as the tap addon notes a write call
            auth = self.redactor.token(facts.token)
            write = WriteCall(facts.rpc.id or 0, facts.rpc.idempotency_key or "", facts.rpc.tool or "", auth)
            if facts.session is not None:
                self.writes.note(facts.session, write)
        return TapFlow(flow_id, facts, h, write)

    def head(
        self,
        flow: TapFlow,
        t: float,
        status: int | None,
        headers: Sequence[tuple[str, str]] = (),
        faults: Sequence[str] = (),
    ) -> None:
        """The response head reaches the client (status None: the flow ended without one)."""
        t = self._clock(t)
        h = {k.lower(): v for k, v in headers}
        flow.sse = status == 200 and h.get("content-type", "").startswith("text/event-stream")
        meta = {"answered_by": "server", "faults": [self._fired(f) for f in faults]}
        self.records.append(
            flow_record(flow.facts, t, flow.headers, status, h.get(SESSION_HEADER), meta, (), self.redactor)
        )
        flow.head_written = True

    def end(self, flow: TapFlow, t: float, reason: str) -> None:
        """complete | client_gone | cut_by_fault (docs/ledgers.md)."""
        if not flow.ended:
            flow.ended = True
            t = self._clock(t)
            self.records.append({"type": "flow_end", "flow": flow.flow, "t": t, "reason": reason})

    # -- events ------------------------------------------------------------------------

    def produced(self, flow: TapFlow, chunk: bytes) -> None:
        """The server produced an event for this flow; the Link holds it until it passes."""
        if flow.sse:
            flow.pending.append(chunk)

    def faulted(self, flow: TapFlow, chunk: bytes, fault: str) -> None:
        """The Link put `chunk` in this flow's way (a replay, an injection)."""
        flow.faulted.append((chunk, fault))

    def passed(self, flow: TapFlow, chunk: bytes, t: float) -> None:
        """The Link hands `chunk` to the client on this flow."""
        if not flow.sse:
            return  # a JSON body: no events
        t = self._clock(t)
        fault = next((f for c, f in flow.faulted if c == chunk), None)
        if fault is None and chunk in flow.pending:  # the server's own event
            flow.pending.remove(chunk)
            index, ev = self._sent(flow, chunk, t)
            self._forwarded(flow, ev, t, source=(flow.flow, index), fault=None)
            return
        if fault is not None:
            flow.faulted.remove((chunk, fault))
        else:  # put there by hand (a test): a copy of an event sent before, or made up
            fault = REPLAY if chunk in self.events else INJECT
        origin = self.events.get(chunk)
        source = None if origin is None else (origin.flow, origin.index)
        self._forwarded(flow, _event(chunk), t, source=source, fault=fault)

    def cut(self, flow: TapFlow, t: float, fault: str = CUT) -> None:
        """The Link cut the connection: the server's events it held are sent and dropped."""
        fired = self._fired(fault)
        t = self._clock(t)
        for chunk in flow.pending:
            index, _ = self._sent(flow, chunk, t)
            self.records.append({"type": "dropped", "flow": flow.flow, "t": t, "index": index, **fired})
        flow.pending.clear()
        self.end(flow, t, "cut_by_fault")

    def forget_pending(self, flow: TapFlow) -> None:
        """The server closed the stream before sending what the Link held for it."""
        flow.pending.clear()

    def sent_events(self) -> list[SentEvent]:
        return list(self.events.values())

    def _sent(self, flow: TapFlow, chunk: bytes, t: float) -> tuple[int, SseEvent]:
        ev = _event(chunk)
        index = flow.sent
        flow.sent += 1
        parsed = parse_event_id(ev.id) if ev.id else None
        stream_id = None if parsed is None else parsed.stream_id
        self.records.append(
            {
                "type": "sent",
                "flow": flow.flow,
                "t": t,
                "index": index,
                "event_id": ev.id,
                "digest": message_digest(ev.data),
                "has_data": ev.has_data,
                "priming": ev.is_priming,
                "stream_id": stream_id,
                "session": flow.facts.session,
                "retry": ev.retry,
            }
        )
        self.events.setdefault(
            chunk, SentEvent(flow.flow, index, flow.facts.session, stream_id, ev.is_message, chunk)
        )
        if ev.is_message:
            watch = ResultWatch(flow.flow, flow.facts.session, flow.write, self.writes)
            self.records += watch.records(ev.data, t)
        return index, ev

    def _forwarded(
        self, flow: TapFlow, ev: SseEvent, t: float, *, source: tuple[str, int] | None, fault: str | None
    ) -> None:
        fired = self._fired(fault) if fault is not None else {"fault": None, "rule": None, "decision": None}
        self.records.append(
            {
                "type": "forwarded",
                "flow": flow.flow,
                "t": t,
                "index": flow.forwarded,
                "event_id": ev.id,
                "digest": message_digest(ev.data),
                "source": None if source is None else {"flow": source[0], "index": source[1]},
                **fired,
            }
        )
        flow.forwarded += 1

    def _fired(self, fault: str) -> dict[str, Any]:
        return {"fault": fault, "rule": RULE, "decision": f"d_{next(self._decisions):016x}"}


def server_ledger(server: ModelServer, redactor: Redactor) -> dict[str, list[dict[str, Any]]]:
    """The server ledger's `dispatches` (mcpServerLedger.v1): one row per write call the
    model server handled, `performed` the first time its key was seen, else `replayed`.
    The subject is the bearer token in the model, so it is written as its pseudonym."""
    rows = [
        {
            "idempotency_key": d.idempotency_key,
            "session": redactor.session(d.session_id),
            "auth_subject": redactor.token(d.subject),
            "request_id": str(d.request_id),
            "tool": d.tool,
            "effect": d.effect,
            "receipt": d.receipt,
            "at": d.at,
            "arguments_digest": d.arguments_digest,
        }
        for d in server.dispatches
    ]
    return {"dispatches": rows}
