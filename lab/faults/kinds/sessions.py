"""Session-ending races: the session ends exactly as a request's response passes the proxy.

Both kinds make an HTTP call of their own (`side_call`) when the response passes: with
order `before` the proxy holds the response back (awaiting the call, never blocking its
event loop) so the session is gone before the client sees it; with `concurrent` the call
and the response race. The raw session ID is used in memory only; the tap gets its
pseudonym.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from lab.faults.facts import RequestFacts
from lab.faults.kinds.base import (
    ChoiceSpec,
    EventEffect,
    EventScope,
    Evidence,
    FaultKind,
    Fired,
    HttpCall,
    Need,
    ProxyEnv,
    Unit,
    Upstream,
    param,
)
from lab.wire.revisions import PROTOCOL_VERSION_HEADER, SESSION_HEADER

FAMILY: Final = "session races"
ADMIN_PATH: Final = "/lab-admin/expire"
ADMIN_TOKEN_HEADER: Final = "x-lab-admin-token"


@dataclass(frozen=True, slots=True)
class RaceParams:
    order: str = param(
        "before",
        ChoiceSpec(("before", "concurrent")),
        "before: the proxy holds the response back until the call returned (at most the call timeout), so "
        "the session is gone before the client sees its response (an SSE answer is then passed on whole "
        "when it ends); concurrent: the call and the response race",
    )


class _SessionRace(FaultKind[RaceParams]):
    unit = Unit.FLOW
    family = FAMILY
    evidence = (Evidence.FAULT,)
    feeds = frozenset({3})
    event_order = 30
    params_type = RaceParams

    def applies(self, facts: RequestFacts, env: ProxyEnv) -> bool:
        return facts.session_id is not None and facts.rpc.is_request

    def holds(self, params: RaceParams) -> bool:
        return params.order == "before"

    def on_event(self, scope: EventScope, fired: Fired, params: RaceParams) -> EventEffect | None:
        return EventEffect(race=True, done=True) if scope.is_response() else None


class ExpiryRace(_SessionRace):
    name = "expiry_race"
    not_modern = "it expires a session, and 2026-07-28 has no sessions"
    number = 12
    summary = (
        "as the response passes, calls the reference server's admin control `POST /lab-admin/expire` "
        "(header `x-lab-admin-token`, and `mcp-session-id`: the raw ID, memory only)"
    )
    applies_to = "requests with a session ID and a JSON-RPC request"
    needs = frozenset({Need.ADMIN_CONTROL})

    def applies(self, facts: RequestFacts, env: ProxyEnv) -> bool:
        return env.admin_token != "" and super().applies(facts, env)

    def side_call(
        self, facts: RequestFacts, upstream: Upstream, env: ProxyEnv, params: RaceParams
    ) -> HttpCall | None:
        if facts.session_id is None or not env.admin_token:
            return None
        host, port, path = upstream.host, upstream.port, ADMIN_PATH
        if env.admin_url:
            u = urlsplit(env.admin_url)
            host, port, path = u.hostname or host, u.port or 80, u.path or ADMIN_PATH
        headers = (
            ("host", f"{host}:{port}"),
            (ADMIN_TOKEN_HEADER, env.admin_token),
            (SESSION_HEADER, facts.session_id),
        )
        return HttpCall("POST", host, port, path, headers, env.call_timeout)

    def side_detail(self, status: int, facts: RequestFacts, params: RaceParams) -> dict[str, object]:
        return {"admin_status": status, "order": params.order, "session": facts.session}


class KillSession(_SessionRace):
    name = "kill_session"
    not_modern = "it ends a session, and 2026-07-28 has no sessions"
    number = 14
    summary = (
        "as the response passes, sends the server a real `DELETE` of the session (the request's path, "
        "its `mcp-session-id` — the raw ID, memory only — and its `Authorization`, `MCP-Protocol-Version` "
        "and `Origin` as they went to the server); works on any server that lets clients end sessions. A "
        "405 answer means the target does not: the fault is then not applicable"
    )
    applies_to = "requests with a session ID and a JSON-RPC request"

    def side_call(
        self, facts: RequestFacts, upstream: Upstream, env: ProxyEnv, params: RaceParams
    ) -> HttpCall | None:
        if facts.session_id is None:
            return None
        h = upstream.headers
        headers = [("host", h.get("host") or f"{upstream.host}:{upstream.port}")]
        headers.append((SESSION_HEADER, facts.session_id))
        for name in ("authorization", PROTOCOL_VERSION_HEADER, "origin"):
            value = h.get(name)
            if value is not None:
                headers.append((name, value))
        return HttpCall(
            "DELETE", upstream.host, upstream.port, upstream.path, tuple(headers), env.call_timeout
        )

    def side_detail(self, status: int, facts: RequestFacts, params: RaceParams) -> dict[str, object]:
        return {"delete_status": status, "session": facts.session, "order": params.order}

    def not_applicable(self, detail: Mapping[str, object]) -> str | None:
        if detail.get("delete_status") == 405:
            return "the target answered the DELETE with 405: it does not let clients end sessions"
        return None


KINDS: Final[tuple[FaultKind[Any], ...]] = (ExpiryRace(), KillSession())
