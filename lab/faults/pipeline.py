"""Per-flow SSE re-framing with the event-level faults, and what the tap records of it.

`SsePipe.feed(chunk) -> bytes` is what the addon hands mitmproxy as
`flow.response.stream`: bytes of the server's SSE response go in, in any chunking; they
are decoded into events (`lab.wire.sse.SseDecoder`), every event is recorded as
*sent* (before any fault), the faults are applied, and what goes on to the client is
re-encoded (`encode_event`) and recorded as *forwarded* (or *dropped*). A chunk that
carried only comments (keep-alives) is passed on as one empty comment, so idle streams
stay alive through the proxy.

Per event, in this order (the first that fires and applies wins where they exclude
each other):
    cut_stream          cut the client connection before this event
    executed_then_lost  this is the request's JSON-RPC response: drop it, then cut
    expiry_race         this is the response: expire the session, then forward
    drop_priming        event 0 is a priming event: drop it
    inject_foreign      insert an event of another stream/session before this one
    replay_after_ack    re-send already-forwarded events of this stream before this one
    cross_ids           forward this event under the ID of another stream's event

`Memory` is the bounded, shared recollection of recent events, IDs and tokens that the
crossing, foreign, replay, Last-Event-ID and old-token faults draw from. It holds raw
tokens and payloads in memory only; nothing of it is written.

Nothing here reads a clock or does I/O: the addon passes a clock and drains the records.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from hashlib import sha256
from typing import Any, Final, NamedTuple

from lab.faults.facts import JsonRpcId, stream_of
from lab.faults.plan import (
    EMPTY_PLAN,
    CutParams,
    Decider,
    Decision,
    EventSampler,
    FaultKind,
    ForeignParams,
    Plan,
    ReplayParams,
    Rule,
    Target,
    Unit,
)
from lab.wire.event_ids import parse_event_id
from lab.wire.sse import SseDecoder, SseEvent, encode_event

type Record = str | dict[str, Any]
"""A tap record: a dict, or (per-event records, the hot path) its JSON text."""

KEEPALIVE: Final = b":\n\n"
MEMORY_KINDS: Final = frozenset(
    {
        FaultKind.CROSS_IDS,
        FaultKind.REPLAY_AFTER_ACK,
        FaultKind.INJECT_FOREIGN,
        FaultKind.REWRITE_LAST_EVENT_ID,
    }
)
"""Faults that need the memory of recent events (without them nothing is remembered)."""


# ---------------------------------------------------------------------- the active plan


@dataclass(frozen=True, slots=True)
class ActivePlan:
    """A plan as the addon runs it: with its decider and the run start it counts from."""

    plan: Plan
    run_start: float
    version: int = 0
    decider: Decider = field(init=False)
    event_rules: tuple[Rule, ...] = field(init=False)
    needs_memory: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "decider", Decider(self.plan.seed))
        object.__setattr__(self, "event_rules", tuple(r for r in self.plan.rules if r.unit is Unit.EVENT))
        object.__setattr__(self, "needs_memory", any(r.kind in MEMORY_KINDS for r in self.plan.rules))

    def decide(self, rule: Rule, key: str, now: float) -> Decision | None:
        return self.decider.decide(rule, key, now - self.run_start)


class PlanHolder:
    """The one mutable reference to the active plan; swapped whole when the plan changes."""

    __slots__ = ("active",)

    def __init__(self, active: ActivePlan | None = None) -> None:
        self.active = active or ActivePlan(EMPTY_PLAN, 0.0)


# ---------------------------------------------------------------------- memory


class Remembered(NamedTuple):
    """An event as the server sent it, with where it came from (a tuple: made per event)."""

    flow: str
    idx: int
    """Its index among the events of its flow (the tap's `index` of its `sent` record)."""
    session: str | None
    stream: str
    event_id: str | None
    data: str
    digest: str
    event: str | None


class Memory:
    """Bounded memory of recent events per (session, stream), event IDs, and session tokens.

    A pipe asks once per stream for its queue (`queue`) and then appends to it directly:
    remembering an event costs one deque append, since it happens for every event.
    """

    def __init__(
        self,
        *,
        sessions: int = 2048,
        streams: int = 8,
        depth: int = 16,
        pool: int = 64,
        ids: int = 65536,
        tokens: int = 1024,
    ) -> None:
        self._max_sessions, self._max_streams, self._depth = sessions, streams, depth
        self._sessions: OrderedDict[str, OrderedDict[str, deque[Remembered]]] = OrderedDict()
        self._recent: deque[deque[Remembered]] = deque(maxlen=pool)
        """Queues of the most recently opened streams, of any session (for other_session)."""
        self._max_ids = ids
        self._ids: OrderedDict[str, str] = OrderedDict()
        self._max_tokens = tokens
        self._tokens: OrderedDict[str, str] = OrderedDict()

    def queue(self, session: str | None, stream: str) -> deque[Remembered]:
        """The queue of recent events of (session, stream), created if needed."""
        skey = session or ""
        streams = self._sessions.get(skey)
        if streams is None:
            streams = self._sessions[skey] = OrderedDict()
            if len(self._sessions) > self._max_sessions:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(skey)
        q = streams.get(stream)
        if q is None:
            q = streams[stream] = deque(maxlen=self._depth)
            if len(streams) > self._max_streams:
                streams.popitem(last=False)
            self._recent.append(q)
        else:
            streams.move_to_end(stream)
        return q

    def remember(self, r: Remembered) -> None:
        self.queue(r.session, r.stream).append(r)
        if r.event_id is not None and stream_of(r.event_id) is None:
            self.note_id(r.event_id, r.stream)

    def note_id(self, event_id: str, stream: str) -> None:
        """Remember where an opaque (not `e1`) ID was seen, for resumptions that cite it."""
        self._ids[event_id] = stream
        if len(self._ids) > self._max_ids:
            self._ids.popitem(last=False)

    def stream_of_id(self, event_id: str) -> str | None:
        """The stream an ID was seen on (the `e1` stream ID when the ID says it)."""
        return stream_of(event_id) or self._ids.get(event_id)

    def recent(self, session: str | None, stream: str, depth: int) -> list[Remembered]:
        """Up to `depth` most recent events of that stream, oldest first."""
        streams = self._sessions.get(session or "")
        q = streams.get(stream) if streams is not None else None
        return list(q)[-depth:] if q else []

    def other_stream(self, session: str | None, stream: str, d: Decision) -> Remembered | None:
        """A recent event with an ID from another stream of the same session."""
        streams = self._sessions.get(session) if session is not None else None
        if streams is None:
            return None
        cands = [q[-1] for key, q in streams.items() if key != stream and q and q[-1].event_id is not None]
        return cands[d.pick(len(cands))] if cands else None

    def other_session(self, session: str | None, d: Decision) -> Remembered | None:
        """A recent event with an ID from another session."""
        cands = [q[-1] for q in self._recent if q and q[-1].session != session and q[-1].event_id is not None]
        return cands[d.pick(len(cands))] if cands else None

    def remember_token(self, session: str, token: str) -> None:
        self._tokens[session] = token
        self._tokens.move_to_end(session)
        if len(self._tokens) > self._max_tokens:
            self._tokens.popitem(last=False)

    def other_token(self, session: str | None, token: str | None, d: Decision) -> str | None:
        """A token an earlier, other session was opened with, different from `token`."""
        cands = [t for s, t in reversed(self._tokens.items()) if s != session and t != token][:16]
        return cands[d.pick(len(cands))] if cands else None


# ---------------------------------------------------------------------- records


_SAFE = re.compile(r"[A-Za-z0-9_.:#/+=@~-]*")


def js(value: str | None) -> str:
    """A JSON string literal (or null), skipping json.dumps for the common safe strings."""
    if value is None:
        return "null"
    if _SAFE.fullmatch(value):
        return f'"{value}"'
    return json.dumps(value)


def as_record(r: Record) -> dict[str, Any]:
    """A record as a dict (the pipe writes its per-event records pre-serialized)."""
    return json.loads(r) if isinstance(r, str) else r


def reencode(ev: SseEvent, event_id: str | None) -> bytes:
    """`encode_event` of the decoded event under `event_id`, with a fast path for the usual
    shape (one data line, no event type, no retry) that gives the same bytes."""
    data = ev.data
    if ev.event is None and ev.retry is None and ev.has_data and data and "\n" not in data:
        if event_id is None:
            return f"data: {data}\n\n".encode()
        return f"id: {event_id}\ndata: {data}\n\n".encode()
    return encode_event(data if ev.has_data else None, id=event_id, event=ev.event, retry=ev.retry)


# ---------------------------------------------------------------------- the pipe


@dataclass(frozen=True, slots=True)
class Fired:
    """A fault that fired: what the tap writes next to what it did."""

    fault: FaultKind
    rule: str
    decision: str

    @staticmethod
    def of(rule: Rule, d: Decision) -> Fired:
        return Fired(rule.kind, rule.id, d.id)

    def tag(self) -> dict[str, str]:
        return {"fault": str(self.fault), "rule": self.rule, "decision": self.decision}


@dataclass(slots=True)
class PipeContext:
    """What a pipe knows about its flow."""

    flow: str
    key: str
    """The decision key of the flow (see `lab.faults.facts.decision_key`)."""
    target: Target
    session: str | None
    jsonrpc_id: JsonRpcId | None = None
    last_event_id: str | None = None
    armed: dict[FaultKind, tuple[Rule, Decision]] = field(default_factory=dict)
    """Flow-level response faults decided when the request passed."""


type ExpireHook = Callable[[Rule, Decision], None]


class SsePipe:
    """One SSE response: `feed(chunk) -> bytes to forward`; `feed(b"")` at the end.

    After a cut (`cut` is set), the caller closes the client connection once the returned
    bytes are written; later chunks are recorded as sent and dropped. Records go to `sink`:
    per-event ones as ready JSON text (they are the hot path), see `as_record`.
    """

    __slots__ = (
        "_decoder",
        "_ended",
        "_expire",
        "_flow_js",
        "_fwd",
        "_head_drop",
        "_head_fwd",
        "_head_sent",
        "_holder",
        "_inherited",
        "_next_hit",
        "_queues",
        "_rules",
        "_samplers",
        "_sent",
        "_session_js",
        "_version",
        "clock",
        "ctx",
        "cut",
        "memory",
        "sink",
    )

    def __init__(
        self,
        ctx: PipeContext,
        holder: PlanHolder,
        sink: list[Record],
        clock: Callable[[], float],
        *,
        memory: Memory | None = None,
        on_expire: ExpireHook | None = None,
    ) -> None:
        self.ctx = ctx
        self._holder = holder
        self.sink = sink
        self.clock = clock
        self.memory = memory
        self._expire = on_expire
        self._decoder = SseDecoder()
        self._sent = 0
        self._fwd = 0
        self._ended = False
        self.cut: Fired | None = None
        self._version = -1
        self._rules: tuple[Rule, ...] = ()
        self._samplers: dict[str, EventSampler] = {}
        self._next_hit = 0
        """No event-level rule fires before this index (most events skip the rules)."""
        self._queues: dict[str, deque[Remembered]] = {}
        lei = ctx.last_event_id
        self._inherited = (
            (memory.stream_of_id(lei) if memory is not None else stream_of(lei)) if lei else None
        )
        self._flow_js = js(ctx.flow)
        self._session_js = js(ctx.session)
        self._head_sent = '{"type":"sent","flow":' + self._flow_js + ',"t":'
        self._head_fwd = '{"type":"forwarded","flow":' + self._flow_js + ',"t":'
        self._head_drop = '{"type":"dropped","flow":' + self._flow_js + ',"t":'

    @property
    def sent_count(self) -> int:
        return self._sent

    def _event_rules(self) -> tuple[Rule, ...]:
        active = self._holder.active
        if active.version != self._version:
            self._version = active.version
            self._rules = tuple(r for r in active.event_rules if r.match.matches(self.ctx.target))
            self._samplers = {r.id: active.decider.sampler(r, self.ctx.key) for r in self._rules}
            self._next_hit = 0
        return self._rules

    def _fires(self, active: ActivePlan, rule: Rule, index: int, now: float) -> Decision | None:
        """The decision for event `index` if `rule` fires on it (see `Decider.sampler`)."""
        if not self._samplers[rule.id].hits(index) or rule.probability(now - active.run_start) <= 0.0:
            return None
        return active.decider.draw(rule.id, f"{self.ctx.key}#{index}")

    def __call__(self, chunk: bytes) -> bytes:
        return self.feed(chunk)

    def feed(self, chunk: bytes) -> bytes:
        if self._ended:
            return b""
        if not chunk:
            self._ended = True
            self._decoder.end_of_stream()
            return b""
        events = self._decoder.feed(chunk)
        if not events:
            # Only comments or a partial block so far: pass keep-alives on, never half an event.
            return KEEPALIVE if not self._decoder.in_block and self.cut is None else b""
        now = self.clock()
        ts = repr(now)
        out: list[bytes] = []
        for ev in events:
            self._one(ev, now, ts, out)
        return b"".join(out)

    # ------------------------------------------------------------------ one event

    def _one(self, ev: SseEvent, now: float, ts: str, out: list[bytes]) -> None:
        ctx = self.ctx
        index = self._sent
        self._sent += 1
        eid = ev.id
        digest = sha256(ev.data.encode()).hexdigest()  # = message_digest, inlined: once per event
        parsed = parse_event_id(eid) if eid else None
        if parsed is not None:
            sid: str | None = parsed.stream_id
            eid_js = f'"{eid}"'  # an e1 ID has only [A-Za-z0-9_.-]: nothing to escape
            sid_js = f'"{sid}"'
        else:
            sid, eid_js, sid_js = None, js(eid), "null"
        self.sink.append(
            f'{self._head_sent}{ts},"index":{index},"event_id":{eid_js},"digest":"{digest}",'
            f'"has_data":{"true" if ev.has_data else "false"},"priming":{"true" if ev.is_priming else "false"},'
            f'"stream_id":{sid_js},"session":{self._session_js},'
            f'"retry":{"null" if ev.retry is None else ev.retry}}}'
        )
        if self.cut is not None:
            self._drop(index, ts, self.cut)
            return
        active = self._holder.active
        rules = self._event_rules()
        if rules and index >= self._next_hit:
            # Some rule may fire here; afterwards, skip to the next index one may fire on.
            self._next_hit = index + 1
        else:
            rules = ()
        for rule in rules:
            if rule.kind is FaultKind.CUT_STREAM:
                p = rule.params
                if isinstance(p, CutParams) and index >= p.min_index:
                    d = self._fires(active, rule, index, now)
                    if d is not None:
                        self.cut = Fired.of(rule, d)
                        self._drop(index, ts, self.cut)
                        return

        armed = ctx.armed
        if armed:
            if ev.is_message and self._is_response(ev.data):
                lost = armed.get(FaultKind.EXECUTED_THEN_LOST)
                if lost is not None:
                    self.cut = Fired.of(*lost)
                    self._drop(index, ts, self.cut)
                    return
                race = armed.get(FaultKind.EXPIRY_RACE)
                if race is not None and self._expire is not None:
                    self._expire(*race)
            if index == 0 and ev.is_priming:
                drop = armed.get(FaultKind.DROP_PRIMING)
                if drop is not None:
                    self._drop(index, ts, Fired.of(*drop))
                    return

        mem = self.memory if active.needs_memory else None
        if mem is None or not ev.is_message:
            if rules:
                self._next_hit = min(s.next for s in self._samplers.values())
            self._forward(reencode(ev, eid), eid_js, digest, self._flow_js, index, ts, None, out)
            return
        stream = sid or self._inherited or f"flow:{ctx.flow}"
        crossed: tuple[str, Fired] | None = None
        for rule in rules:
            kind = rule.kind
            if kind is FaultKind.CUT_STREAM:
                continue
            d = self._fires(active, rule, index, now)
            if d is None:
                continue
            if kind is FaultKind.INJECT_FOREIGN:
                src = self._foreign(mem, rule, d, stream)
                if src is not None:
                    self._forward_copy(src, ts, Fired.of(rule, d), out)
            elif kind is FaultKind.REPLAY_AFTER_ACK:
                p = rule.params
                depth = p.depth if isinstance(p, ReplayParams) else 1
                fired = Fired.of(rule, d)
                for old in mem.recent(ctx.session, stream, depth):
                    self._forward_copy(old, ts, fired, out)
            elif kind is FaultKind.CROSS_IDS and eid is not None and crossed is None:
                partner = mem.other_stream(ctx.session, stream, d)
                if partner is not None and partner.event_id is not None:
                    crossed = (partner.event_id, Fired.of(rule, d))
        if rules:
            self._next_hit = min(s.next for s in self._samplers.values())
        if crossed is not None:
            self._forward(
                reencode(ev, crossed[0]), js(crossed[0]), digest, self._flow_js, index, ts, crossed[1], out
            )
        else:
            self._forward(reencode(ev, eid), eid_js, digest, self._flow_js, index, ts, None, out)
        q = self._queues.get(stream)
        if q is None:
            q = self._queues[stream] = mem.queue(ctx.session, stream)
        q.append(Remembered(ctx.flow, index, ctx.session, stream, eid, ev.data, digest, ev.event))
        if eid is not None and parsed is None:
            mem.note_id(eid, stream)

    def _is_response(self, data: str) -> bool:
        rid = self.ctx.jsonrpc_id
        if rid is None or ('"result"' not in data and '"error"' not in data):
            return False
        try:
            obj = json.loads(data)
        except ValueError:
            return False
        return (
            isinstance(obj, dict)
            and ("result" in obj or "error" in obj)
            and obj.get("id") == rid
            and type(obj.get("id")) is type(rid)
        )

    def _foreign(self, mem: Memory, rule: Rule, d: Decision, stream: str) -> Remembered | None:
        p = rule.params
        source = p.source if isinstance(p, ForeignParams) else "any"
        order = {
            "other_stream": ("s",),
            "other_session": ("x",),
            "any": ("s", "x") if d.bits & 1 else ("x", "s"),
        }
        for which in order[source]:
            got = (
                mem.other_stream(self.ctx.session, stream, d)
                if which == "s"
                else mem.other_session(self.ctx.session, d)
            )
            if got is not None:
                return got
        return None

    # ------------------------------------------------------------------ output

    def _forward(
        self,
        raw: bytes,
        eid_js: str,
        digest: str,
        source_flow_js: str | None,
        source_index: int,
        ts: str,
        fired: Fired | None,
        out: list[bytes],
    ) -> None:
        out.append(raw)
        source = "null" if source_flow_js is None else f'{{"flow":{source_flow_js},"index":{source_index}}}'
        tail = (
            '"fault":null,"rule":null,"decision":null}'
            if fired is None
            else f'"fault":"{fired.fault}","rule":{js(fired.rule)},"decision":"{fired.decision}"}}'
        )
        self.sink.append(
            f'{self._head_fwd}{ts},"index":{self._fwd},"event_id":{eid_js},"digest":"{digest}",'
            f'"source":{source},{tail}'
        )
        self._fwd += 1

    def _forward_copy(self, r: Remembered, ts: str, fired: Fired, out: list[bytes]) -> None:
        ev = SseEvent(data=r.data, event=r.event, id=r.event_id)
        self._forward(reencode(ev, r.event_id), js(r.event_id), r.digest, js(r.flow), r.idx, ts, fired, out)

    def _drop(self, index: int, ts: str, fired: Fired) -> None:
        self.sink.append(
            f'{self._head_drop}{ts},"index":{index},"fault":"{fired.fault}","rule":{js(fired.rule)},'
            f'"decision":"{fired.decision}"}}'
        )
