"""Lost answers: the server performs the request, the client never learns the outcome."""

from __future__ import annotations

from typing import Any, Final

from lab.faults.facts import RequestFacts
from lab.faults.kinds.base import (
    Answered,
    EventEffect,
    EventScope,
    Evidence,
    FaultKind,
    Fired,
    Kill,
    NoParams,
    ProxyEnv,
    Unit,
)

FAMILY: Final = "lost answers"


class ExecutedThenLost(FaultKind[NoParams]):
    name = "executed_then_lost"
    number = 7
    family = FAMILY
    unit = Unit.FLOW
    summary = (
        "lets the server run the request; drops the JSON-RPC response event (the one whose `id` is the "
        "request's) and cuts the client connection; a 2xx JSON answer is withheld instead (connection closed)"
    )
    applies_to = "POST carrying a JSON-RPC request"
    evidence = (Evidence.DROPPED, Evidence.FLOW)
    breaks_streams = True
    feeds = frozenset({2, 5})
    event_order = 20
    params_type = NoParams

    def applies(self, facts: RequestFacts, env: ProxyEnv) -> bool:
        return facts.http_method == "POST" and facts.rpc.is_request

    def on_body(self, answered: Answered, params: NoParams) -> Kill | None:
        # Only a success is "performed, then lost": a refusal (4xx/5xx) performed nothing.
        return Kill({"status": answered.status}) if answered.ok and not answered.sse else None

    def on_event(self, scope: EventScope, fired: Fired, params: NoParams) -> EventEffect | None:
        return EventEffect(cut=True, done=True) if scope.is_response() else None


class LoseDeleteResponse(FaultKind[NoParams]):
    name = "lose_delete_response"
    not_modern = "2026-07-28 has no session to DELETE"
    number = 8
    family = FAMILY
    unit = Unit.FLOW
    summary = (
        "lets the server delete; on a 2xx answer closes the client connection without the response "
        "(a refusal is passed on: nothing was performed)"
    )
    applies_to = "DELETE"
    evidence = (Evidence.FLOW,)
    params_type = NoParams

    def applies(self, facts: RequestFacts, env: ProxyEnv) -> bool:
        return facts.http_method == "DELETE"

    def on_head(self, answered: Answered, params: NoParams) -> Kill | None:
        return Kill({"status": answered.status}) if answered.ok else None


KINDS: Final[tuple[FaultKind[Any], ...]] = (ExecutedThenLost(), LoseDeleteResponse())
