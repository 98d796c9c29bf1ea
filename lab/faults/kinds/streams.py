"""SSE stream faults: what the client receives on a stream is changed, event by event."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from lab.faults.facts import RequestFacts
from lab.faults.kinds.base import (
    DONE,
    ChoiceSpec,
    EventEffect,
    EventScope,
    Evidence,
    FaultKind,
    Fired,
    IntSpec,
    Need,
    NoParams,
    ProxyEnv,
    Unit,
    param,
)
from lab.faults.memory import Memory, Remembered

FAMILY: Final = "SSE streams"


class DropPriming(FaultKind[NoParams]):
    name = "drop_priming"
    not_modern = "2026-07-28 has no priming event"
    number = 1
    family = FAMILY
    unit = Unit.FLOW
    summary = "drops event 0 if it is a priming event (an ID with empty data)"
    applies_to = "POST/GET with an SSE answer"
    evidence = (Evidence.DROPPED,)
    event_order = 40
    params_type = NoParams

    def applies(self, facts: RequestFacts, env: ProxyEnv) -> bool:
        return facts.http_method in ("POST", "GET")

    def on_event(self, scope: EventScope, fired: Fired, params: NoParams) -> EventEffect | None:
        if scope.index == 0 and scope.event.is_priming:
            return EventEffect(drop=True, done=True)
        return DONE  # only event 0 can be dropped


class CrossIds(FaultKind[NoParams]):
    name = "cross_ids"
    not_modern = "2026-07-28 has no SSE event IDs"
    number = 2
    family = FAMILY
    unit = Unit.EVENT
    summary = "forwards the event under the ID of the latest event of another stream of the same session"
    applies_to = "message events with an ID"
    evidence = (Evidence.FORWARDED,)
    feeds = frozenset({1})
    needs = frozenset({Need.MEMORY})
    event_order = 70
    params_type = NoParams

    def on_event(self, scope: EventScope, fired: Fired, params: NoParams) -> EventEffect | None:
        if scope.event_id is None or scope.memory is None:
            return None
        partner = scope.memory.other_stream(scope.session, scope.stream, scope.decision)
        if partner is None or partner.event_id is None:
            return None
        return EventEffect(rename=partner.event_id)


@dataclass(frozen=True, slots=True)
class ReplayParams:
    depth: int = param(1, IntSpec(lo=1, hi=16), "how many already-forwarded events of the stream to re-send")


class ReplayAfterAck(FaultKind[ReplayParams]):
    name = "replay_after_ack"
    not_modern = "2026-07-28 has no event IDs to acknowledge and no resumption"
    number = 3
    family = FAMILY
    unit = Unit.EVENT
    summary = (
        "before the event, re-sends the last `depth` events already forwarded on the same stream — "
        "on a resumption, the events up to the acknowledged `Last-Event-ID`"
    )
    applies_to = "message events"
    evidence = (Evidence.FORWARDED,)
    feeds = frozenset({1})
    needs = frozenset({Need.MEMORY})
    event_order = 60
    params_type = ReplayParams

    def on_event(self, scope: EventScope, fired: Fired, params: ReplayParams) -> EventEffect | None:
        if scope.memory is None:
            return None
        old = scope.memory.recent(scope.session, scope.stream, params.depth)
        return EventEffect(insert=old) if old else None


@dataclass(frozen=True, slots=True)
class ForeignParams:
    source: str = param(
        "any",
        ChoiceSpec(("other_stream", "other_session", "any")),
        "where the injected event comes from: another stream of the same session, another session, or either",
    )


class InjectForeign(FaultKind[ForeignParams]):
    name = "inject_foreign"
    number = 4
    family = FAMILY
    unit = Unit.EVENT
    summary = (
        "inserts, before the event, the latest event of another stream (same session) or another session"
    )
    applies_to = "message events"
    evidence = (Evidence.FORWARDED,)
    feeds = frozenset({1})
    needs = frozenset({Need.MEMORY})
    event_order = 50
    params_type = ForeignParams

    def on_event(self, scope: EventScope, fired: Fired, params: ForeignParams) -> EventEffect | None:
        if scope.memory is None:
            return None
        got = _foreign(scope.memory, scope, params.source)
        return EventEffect(insert=(got,)) if got is not None else None


def _foreign(mem: Memory, scope: EventScope, source: str) -> Remembered | None:
    d = scope.decision
    if scope.session is None:
        # No session (the modern era): nothing to tell streams apart but their requests, so
        # the foreign message is another request's, whatever the source asked for.
        return mem.other_request(scope.stream, scope.jsonrpc_id, d)
    order = {
        "other_stream": ("s",),
        "other_session": ("x",),
        "any": ("s", "x") if d.bits & 1 else ("x", "s"),
    }
    for which in order[source]:
        got = (
            mem.other_stream(scope.session, scope.stream, d)
            if which == "s"
            else mem.other_session(scope.session, d)
        )
        if got is not None:
            return got
    return None


@dataclass(frozen=True, slots=True)
class CutParams:
    min_index: int = param(
        1, IntSpec(lo=0), "never cut before this event index of the flow (0 = even before the first event)"
    )


class CutStream(FaultKind[CutParams]):
    name = "cut_stream"
    number = 13
    family = FAMILY
    unit = Unit.EVENT
    summary = "closes the client connection before the event; every later event of the flow is dropped"
    applies_to = "SSE events at index >= `min_index`"
    evidence = (Evidence.DROPPED,)
    breaks_streams = True
    feeds = frozenset({5})
    event_order = 10
    params_type = CutParams

    def event_applies(self, index: int, params: CutParams) -> bool:
        return index >= params.min_index

    def on_event(self, scope: EventScope, fired: Fired, params: CutParams) -> EventEffect | None:
        return EventEffect(cut=True)


KINDS: Final[tuple[FaultKind[Any], ...]] = (
    DropPriming(),
    CrossIds(),
    ReplayAfterAck(),
    InjectForeign(),
    CutStream(),
)
