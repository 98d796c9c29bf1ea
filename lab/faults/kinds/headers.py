"""Request rewrites: a header of the request is changed before it goes to the server."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from lab.faults.facts import RequestFacts, garbage_id, tampered_id
from lab.faults.kinds.base import (
    NOT_APPLIED,
    Applied,
    ChoiceSpec,
    Evidence,
    FaultKind,
    Fired,
    Need,
    NoParams,
    ProxyEnv,
    RequestEffect,
    RequestScope,
    StrSpec,
    Unit,
    param,
)
from lab.wire.jsonrpc import INITIALIZE
from lab.wire.revisions import (
    LAST_EVENT_ID_HEADER,
    MCP_METHOD_HEADER,
    MCP_NAME_HEADER,
    MODERN_REVISIONS,
    PROTOCOL_VERSION_HEADER,
    SESSION_HEADER,
)

FAMILY: Final = "request headers"
ILLEGAL_ORIGIN: Final = "http://evil.invalid"
_ORIGIN = re.compile(r"null|https?://[^/\s?#]+")


@dataclass(frozen=True, slots=True)
class OriginParams:
    origin: str = param(
        ILLEGAL_ORIGIN,
        StrSpec(_ORIGIN, "an origin like 'http://evil.invalid' or 'null'"),
        "the illegal Origin to send (scheme://host[:port], or `null`)",
    )


class RewriteOrigin(FaultKind[OriginParams]):
    name = "rewrite_origin"
    number = 5
    family = FAMILY
    unit = Unit.FLOW
    summary = "sets `Origin` (even when absent) to an illegal value; the server must answer 403"
    applies_to = "any request"
    evidence = (Evidence.FLOW,)
    feeds = frozenset({4})
    params_type = OriginParams

    def on_request(self, scope: RequestScope, fired: Fired, params: OriginParams) -> RequestEffect:
        scope.headers["origin"] = params.origin
        return Applied(origin_illegal=True)


class StripProtocolVersion(FaultKind[NoParams]):
    name = "strip_protocol_version"
    number = 9
    family = FAMILY
    unit = Unit.FLOW
    summary = "removes the `MCP-Protocol-Version` header"
    applies_to = "requests with `MCP-Protocol-Version`"
    evidence = (Evidence.FLOW,)
    params_type = NoParams

    def applies(self, facts: RequestFacts, env: ProxyEnv) -> bool:
        return facts.protocol_version is not None

    def on_request(self, scope: RequestScope, fired: Fired, params: NoParams) -> RequestEffect:
        del scope.headers[PROTOCOL_VERSION_HEADER]
        return Applied()


_CURSORS: Final = ("other_stream", "other_session", "tampered", "garbage")


@dataclass(frozen=True, slots=True)
class LastEventIdParams:
    to: str = param(
        "any",
        ChoiceSpec(("other_stream", "other_session", "garbage", "tampered", "any")),
        "an ID of another stream of the session, of another session, garbage, the real ID with its MAC "
        "altered, or any of those that is available",
    )


class RewriteLastEventId(FaultKind[LastEventIdParams]):
    name = "rewrite_last_event_id"
    not_modern = "2026-07-28 has no Last-Event-ID (no resumption)"
    number = 10
    family = FAMILY
    unit = Unit.FLOW
    summary = (
        "replaces `Last-Event-ID` with an ID of another stream of the session, of another session, a "
        "tampered copy (MAC altered), or garbage; unavailable choices fall back to tampered, then garbage"
    )
    applies_to = "GET with `Last-Event-ID`"
    evidence = (Evidence.FLOW,)
    feeds = frozenset({1})
    needs = frozenset({Need.MEMORY})
    params_type = LastEventIdParams

    def applies(self, facts: RequestFacts, env: ProxyEnv) -> bool:
        return facts.last_event_id is not None

    def on_request(self, scope: RequestScope, fired: Fired, params: LastEventIdParams) -> RequestEffect:
        f, mem, d = scope.facts, scope.memory, scope.decision
        lei = f.last_event_id
        assert lei is not None
        stream = mem.stream_of_id(lei) or f"flow:{f.flow}"
        if params.to == "any":
            start = d.pick(len(_CURSORS))
            order = _CURSORS[start:] + _CURSORS[:start]
        else:
            order = (params.to, "tampered", "garbage")
        value, variant = garbage_id(d.id), "garbage"
        for choice in order:
            if choice == "other_stream":
                r = mem.other_stream(f.session, stream, d)
                if r is not None and r.event_id is not None and r.event_id != lei:
                    value, variant = r.event_id, choice
                    break
            elif choice == "other_session":
                r = mem.other_session(f.session, d)
                if r is not None and r.event_id is not None:
                    value, variant = r.event_id, choice
                    break
            elif choice == "tampered":
                value, variant = tampered_id(lei), choice
                break
            else:
                break
        scope.headers[LAST_EVENT_ID_HEADER] = value
        return Applied({"to": variant})


class OldToken(FaultKind[NoParams]):
    name = "old_token"
    not_modern = "it takes another session's token, and 2026-07-28 has no sessions"
    number = 11
    family = FAMILY
    unit = Unit.FLOW
    summary = "replaces `Authorization` with the token another (earlier) session was initialized with, when one differs"
    applies_to = "requests with a bearer token and a session"
    evidence = (Evidence.FLOW,)
    needs = frozenset({Need.TWO_TOKENS})
    params_type = NoParams

    def applies(self, facts: RequestFacts, env: ProxyEnv) -> bool:
        return facts.token is not None and facts.session is not None

    def on_request(self, scope: RequestScope, fired: Fired, params: NoParams) -> RequestEffect:
        f = scope.facts
        old = scope.memory.other_token(f.session, f.token, scope.decision)
        if old is None:
            return NOT_APPLIED  # no earlier session's token seen yet
        scope.headers["authorization"] = f"Bearer {old}"
        return Applied({"token": scope.token_name(old)})


class StripSessionId(FaultKind[NoParams]):
    name = "strip_session_id"
    not_modern = "2026-07-28 has no MCP-Session-Id"
    number = 15
    family = FAMILY
    unit = Unit.FLOW
    summary = (
        "removes `MCP-Session-Id` from a POST after the handshake; the server must answer 400 "
        "(anything it serves is a violation)"
    )
    applies_to = "POST with `MCP-Session-Id`, other than `initialize`"
    evidence = (Evidence.FLOW,)
    params_type = NoParams

    def applies(self, facts: RequestFacts, env: ProxyEnv) -> bool:
        return facts.http_method == "POST" and facts.session_id is not None and facts.rpc.method != INITIALIZE

    def on_request(self, scope: RequestScope, fired: Fired, params: NoParams) -> RequestEffect:
        del scope.headers[SESSION_HEADER]
        return Applied()


@dataclass(frozen=True, slots=True)
class MismatchParams:
    header: str = param(
        "any",
        ChoiceSpec(("method", "name", "version", "any")),
        "which mirrored header to make disagree with the body: `Mcp-Method` (another method), "
        "`Mcp-Name` (another tool's name, on tools/call), `MCP-Protocol-Version` (a revision no "
        "server serves, which `_meta` does not name either), or any of them (chosen by the "
        "decision; `name` only where there is one)",
    )


UNKNOWN_REVISION: Final = "2099-01-01"
"""The revision `mismatch_header` puts in `MCP-Protocol-Version`: served by no one, so a dual-
era server routes the request as a modern one (it is not a handshake revision) and must
refuse it (400: the header is not `_meta`'s, and the revision is unsupported)."""


class MismatchHeader(FaultKind[MismatchParams]):
    name = "mismatch_header"
    number = 16
    family = FAMILY
    unit = Unit.FLOW
    summary = (
        "in the modern era, makes a header that mirrors the body disagree with it: `Mcp-Method` "
        "names another method, `Mcp-Name` another tool, or `MCP-Protocol-Version` an unknown "
        "revision; the server must answer 400 (`HeaderMismatch` -32020, or -32022 for the "
        "revision), not serve the request"
    )
    applies_to = "modern-era requests (`MCP-Protocol-Version` 2026-07-28)"
    evidence = (Evidence.FLOW,)
    feeds = frozenset({15})
    only_modern = "the handshake era has no headers that mirror the body"
    params_type = MismatchParams

    def applies(self, facts: RequestFacts, env: ProxyEnv) -> bool:
        return facts.protocol_version in MODERN_REVISIONS and facts.rpc.method is not None

    def on_request(self, scope: RequestScope, fired: Fired, params: MismatchParams) -> RequestEffect:
        rpc = scope.facts.rpc
        which = params.header
        if which == "any":
            choices = ("name", "method", "version") if rpc.tool is not None else ("method", "version")
            which = choices[scope.decision.pick(len(choices))]
        if which == "name":
            if rpc.tool is None:
                return NOT_APPLIED
            sent = f"{rpc.tool}-not-this-one"
            scope.headers[MCP_NAME_HEADER] = sent
        elif which == "version":
            sent = UNKNOWN_REVISION
            scope.headers[PROTOCOL_VERSION_HEADER] = sent
        else:
            sent = "tools/list" if rpc.method != "tools/list" else "tools/call"
            scope.headers[MCP_METHOD_HEADER] = sent
        return Applied({"header": which, "sent": sent})


KINDS: Final[tuple[FaultKind[Any], ...]] = (
    RewriteOrigin(),
    StripProtocolVersion(),
    RewriteLastEventId(),
    OldToken(),
    StripSessionId(),
    MismatchHeader(),
)
