"""The event faults of one SSE flow: which kinds act on each event, and what they do (pure).

`EventFaults` is what the fault addon hands the tap's SSE pipe for a flow: called once
per event the server sent, it returns None (forward it untouched: almost always) or an
`EventOutcome` (copies to forward first, a new ID, a drop or a cut), each effect with the
fault that caused it. It runs two sorts of hooks, in the kinds' `event_order`:
- event-level rules of the active plan that match the flow, sampled per event index
  (`Decider.sampler`; a plan change takes effect from the next event), or, for a rule
  pinned to triggers (`lab.faults.pins`), at the indexes its pins give this request;
- flow-level kinds armed when the request passed (drop the priming event, lose the
  response, race the session's end), until they say they are done.
It also feeds the proxy's `Memory` with the events it forwarded, when the plan needs it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lab.faults.decisions import Decision, EventSampler
from lab.faults.facts import RequestFacts
from lab.faults.kinds import FaultKind, Need
from lab.faults.kinds.base import EventScope, Fired
from lab.faults.memory import Memory, Remembered
from lab.faults.pins import FixedIndexes, Place
from lab.faults.plan import PlanHolder, Rule
from lab.wire.sse import SseEvent


@dataclass(frozen=True, slots=True)
class Armed:
    """A flow-level rule that fired on a request and acts later, at its response."""

    kind: FaultKind[Any]
    rule: Rule
    decision: Decision

    @property
    def fired(self) -> Fired:
        return Fired(self.kind.name, self.rule.id, self.decision.id)


@dataclass(slots=True)
class EventOutcome:
    """What happens to one event besides being forwarded as it came."""

    before: list[tuple[Remembered, Fired]] = field(default_factory=list)
    """Copies of other events forwarded before it."""
    rename: tuple[str, Fired] | None = None
    """Forward it under this ID."""
    drop: Fired | None = None
    """Do not forward it."""
    cut: Fired | None = None
    """Do not forward it nor any later event, and close the client connection."""


@dataclass(slots=True)
class _Hook:
    kind: FaultKind[Any]
    rule: Rule
    sampler: EventSampler | FixedIndexes | None
    """An event-level rule's sampler (its pins' indexes, if pinned); None for an armed
    flow-level kind."""
    armed: Armed | None = None
    message_only: bool = False


def _has_event_hook(kind: FaultKind[Any]) -> bool:
    return type(kind).on_event is not FaultKind.on_event


class EventFaults:
    """The event faults of one flow; `(index, event, stream_id, digest, now)` per event."""

    __slots__ = (
        "_flow_stream",
        "_holder",
        "_hooks",
        "_inherited",
        "_memory",
        "_next_hit",
        "_queues",
        "_samplers",
        "_version",
        "armed",
        "facts",
        "on_race",
        "place",
    )

    def __init__(
        self,
        facts: RequestFacts,
        holder: PlanHolder,
        memory: Memory,
        armed: list[Armed],
        *,
        last_event_id: str | None = None,
        on_race: Callable[[Armed], None] | None = None,
        place: Place | None = None,
    ) -> None:
        self.facts = facts
        self.place = place
        """The request's place among its client's requests (pinned rules need it)."""
        self._holder = holder
        self._memory = memory
        self.armed = [a for a in armed if _has_event_hook(a.kind)]
        self.on_race = on_race
        """Called when an armed race's moment comes (the response passes): start its side call."""
        self._version = -1
        self._hooks: list[_Hook] = []
        self._samplers: list[EventSampler | FixedIndexes] = []
        self._next_hit = 0
        """No event-level rule fires before this index (most events skip the rules)."""
        self._queues: dict[str, deque[Remembered]] = {}
        self._inherited = memory.stream_of_id(last_event_id) if last_event_id else None
        self._flow_stream = f"flow:{facts.flow}"

    def disarm(self, kind: str) -> None:
        """An armed kind acted already (e.g. a held-back race made its call): skip it from now on."""
        self.armed = [a for a in self.armed if a.kind.name != kind]
        self._hooks = [h for h in self._hooks if h.armed is None or h.armed.kind.name != kind]

    def quiet(self, start: int, end: int) -> bool:
        """Whether, under the plan active now, no fault can act on the events with indexes
        `start` .. `end - 1`: no armed kind waits for them, and every event-level rule's
        next firing is later. Each would be forwarded as it came; `passed` must still be
        told of each (the memory may need it)."""
        if not self._hooks_now():
            return True
        return not self.armed and bool(self._samplers) and end <= self._next_hit

    def passed(self, index: int, ev: SseEvent, stream_id: str | None, digest: str) -> None:
        """Event `index` went on as it came, no fault asked (see `quiet`): what a call
        that changed nothing would have done with it (remember it, when the plan needs)."""
        if self._holder.active.needs_memory and ev.is_message:
            stream = stream_id or self._inherited or self._flow_stream
            self._remember(self._memory, index, ev, stream, stream_id, digest)

    def _hooks_now(self) -> list[_Hook]:
        active = self._holder.active
        if active.version != self._version:
            self._version = active.version
            target = self.facts.target
            hooks = [
                _Hook(r.spec, r, sampler, message_only=Need.MEMORY in r.spec.needs)
                for r in active.event_rules
                if r.match.matches(target) and (sampler := self._sampler(r)) is not None
            ]
            self._samplers = [h.sampler for h in hooks if h.sampler is not None]
            hooks += [_Hook(a.kind, a.rule, None, a) for a in self.armed]
            hooks.sort(key=lambda h: h.kind.event_order)
            self._hooks = hooks
            self._next_hit = 0
        return self._hooks

    def _sampler(self, rule: Rule) -> EventSampler | FixedIndexes | None:
        """Where `rule` may fire on this flow: its sampler, or its pins' indexes for this
        request (None: a pinned rule with no pin here)."""
        active = self._holder.active
        if not rule.pins:
            return active.decider.sampler(rule.id, rule.rate, self.facts.key)
        indexes = active.pins_by_rule[rule.id].get(self.place) if self.place is not None else None
        return FixedIndexes(indexes) if indexes else None

    def __call__(
        self, index: int, ev: SseEvent, stream_id: str | None, digest: str, now: float
    ) -> EventOutcome | None:
        active = self._holder.active
        hooks = self._hooks_now()
        due = bool(self._samplers) and index >= self._next_hit
        if due:
            self._next_hit = index + 1  # some rule may fire here; recomputed below
        mem = self._memory if active.needs_memory else None
        outcome: EventOutcome | None = None
        stream = stream_id or self._inherited or self._flow_stream
        if due or self.armed:
            scope: EventScope | None = None
            since = now - active.run_start
            for h in hooks:
                kind = h.kind
                if h.armed is not None:
                    d, fired = h.armed.decision, h.armed.fired
                else:
                    if not due or (h.message_only and (mem is None or not ev.is_message)):
                        continue
                    if not kind.event_applies(index, h.rule.params):
                        continue
                    assert h.sampler is not None
                    if not h.sampler.hits(index):
                        continue
                    if not h.rule.pins and h.rule.probability(since) <= 0.0:
                        continue  # (a pinned rule fires at its pins, whatever its window)
                    d = active.decider.draw(h.rule.id, f"{self.facts.key}#{index}")
                    fired = Fired(kind.name, h.rule.id, d.id)
                if scope is None:
                    scope = EventScope(index, ev, stream, self.facts.session, self.facts.rpc.id, mem, d)
                scope.decision = d
                eff = kind.on_event(scope, fired, h.rule.params)
                if eff is None:
                    continue
                if eff.done and h.armed is not None:
                    self.disarm(kind.name)
                if eff.race and h.armed is not None and self.on_race is not None:
                    self.on_race(h.armed)
                if eff.cut or eff.drop or eff.insert or eff.rename:
                    outcome = outcome or EventOutcome()
                if eff.cut:
                    assert outcome is not None
                    outcome.cut = fired
                    break
                if eff.drop:
                    assert outcome is not None
                    outcome.drop = fired
                    break
                if eff.insert:
                    assert outcome is not None
                    outcome.before.extend((r, fired) for r in eff.insert)
                if eff.rename is not None and outcome is not None and outcome.rename is None:
                    outcome.rename = (eff.rename, fired)
            if due:
                self._next_hit = min(s.next for s in self._samplers)
        if mem is not None and ev.is_message and (outcome is None or not (outcome.cut or outcome.drop)):
            self._remember(mem, index, ev, stream, stream_id, digest)
        return outcome

    def _remember(
        self, mem: Memory, index: int, ev: SseEvent, stream: str, stream_id: str | None, digest: str
    ) -> None:
        q = self._queues.get(stream)
        if q is None:
            q = self._queues[stream] = mem.queue(self.facts.session, stream)
        eid = ev.id
        q.append(
            Remembered(self.facts.flow, index, self.facts.session, stream, eid, ev.data, digest, ev.event)
        )
        if eid is not None and stream_id is None:
            mem.note_id(eid, stream)  # an opaque ID: remember its stream for resumptions citing it
