"""The Streamable HTTP revisions the lab speaks, and the rules that differ between them.

The handshake (session) era is `REVISIONS`: 2025-03-26 introduced Streamable HTTP with
`Mcp-Session-Id` and resumable SSE; 2025-06-18 added the `MCP-Protocol-Version` header
and removed JSON-RPC batching; 2025-11-25 added the priming event (an event ID with
empty data at the start of a POST stream), server-initiated close with `retry`
("polling"), and made 403 the answer to an invalid `Origin`.

The modern era is `MODERN_REVISIONS`: 2026-07-28 removed the handshake, sessions, the GET
stream, SSE event IDs and resumption; every POST names its revision in the
`MCP-Protocol-Version` header and in `_meta` (docs/eras.md). A request belongs to the
modern era when that header names a modern revision.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

SESSION_HEADER = "mcp-session-id"
"""Header carrying the session ID (HTTP header names are case-insensitive; we use lower case)."""

PROTOCOL_VERSION_HEADER = "mcp-protocol-version"
LAST_EVENT_ID_HEADER = "last-event-id"


@dataclass(frozen=True, slots=True)
class Revision:
    """What one protocol revision requires of the transport."""

    name: str
    version_header: bool
    """Clients send `MCP-Protocol-Version` on every request after initialize."""
    batching: bool
    """A POST body may be a JSON array of messages."""
    priming_event: bool
    """A POST stream starts with an event that has an ID and empty data."""
    polling_close: bool
    """The server may close a connection mid-stream after sending `retry`."""
    modern: bool = False
    """The modern era (2026-07-28): no handshake, session, GET stream or resumption; every
    POST names its revision in headers and `_meta`, and a broken stream is re-issued."""


REVISIONS: dict[str, Revision] = {
    r.name: r
    for r in (
        Revision("2025-03-26", False, True, False, False),
        Revision("2025-06-18", True, False, False, False),
        Revision("2025-11-25", True, False, True, True),
    )
}

SUPPORTED_REVISIONS: tuple[str, ...] = tuple(sorted(REVISIONS))
"""The handshake era's revisions (what `initialize` negotiates)."""

MODERN: dict[str, Revision] = {
    r.name: r for r in (Revision("2026-07-28", True, False, False, False, modern=True),)
}
MODERN_REVISIONS: tuple[str, ...] = tuple(sorted(MODERN))
"""The modern era's revisions: no handshake, no session, no resumption."""

ERAS: tuple[str, ...] = ("handshake", "modern", "both")
"""What a run may test: one era, or both at once (each client speaking one)."""
BOTH_ERAS: frozenset[str] = frozenset({"handshake", "modern"})


def eras_of(era: str) -> frozenset[str]:
    """The eras a run of `era` (one of ERAS) tests: `both` is the two."""
    return BOTH_ERAS if era == "both" else frozenset({era})


def era_of_client(client_id: str) -> str:
    """In a run of both eras, the era of client `client_id`: by a stable hash of its ID, so
    that a client keeps its era across processes and replays, and the checker can tell it
    from the ID alone (about half of the clients each)."""
    return "modern" if zlib.crc32(client_id.encode("utf-8")) & 1 else "handshake"


MCP_METHOD_HEADER = "mcp-method"
MCP_NAME_HEADER = "mcp-name"
META_PROTOCOL_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_CLIENT_INFO = "io.modelcontextprotocol/clientInfo"
META_SERVER_INFO = "io.modelcontextprotocol/serverInfo"
HEADER_MISMATCH = -32020
"""A required header missing, or not what the body says (2026-07-28)."""
UNSUPPORTED_VERSION = -32022
"""A protocol revision the server does not serve (2026-07-28); `data` lists those it does."""


def modern_stamp(
    message: dict[str, Any], version: str, client_name: str
) -> tuple[dict[str, Any], tuple[tuple[str, str], ...]]:
    """A message of the modern era as it goes out (a copy; `message` is left as it was):
    a request's `_meta` with the revision and the client's capabilities and name, and the
    headers that mirror the body (the revision, the method, and the tool's name on a
    `tools/call`), which the server compares with it."""
    params = dict(message.get("params") or {})
    method = str(message.get("method", ""))
    headers = [(PROTOCOL_VERSION_HEADER, version), (MCP_METHOD_HEADER, method)]
    if method == "tools/call":
        headers.append((MCP_NAME_HEADER, str(params.get("name", ""))))
    if "id" in message:
        params["_meta"] = {
            **(params.get("_meta") or {}),
            META_PROTOCOL_VERSION: version,
            META_CLIENT_CAPABILITIES: {},
            META_CLIENT_INFO: {"name": client_name, "version": "1"},
        }
    return {**message, "params": params}, tuple(headers)


def revision(name: str) -> Revision:
    """The rules of revision `name`, of either era; KeyError names what is supported."""
    found = REVISIONS.get(name) or MODERN.get(name)
    if found is None:
        known = ", ".join((*REVISIONS, *MODERN))
        raise KeyError(f"unsupported protocol revision {name!r}; supported: {known}")
    return found


def is_modern(name: str) -> bool:
    """Is `name` a revision of the modern era (2026-07-28 on)?"""
    return name in MODERN


def negotiate(requested: str, supported: tuple[str, ...] = SUPPORTED_REVISIONS) -> str:
    """Server side of version negotiation: the requested revision if supported, else our latest."""
    if requested in supported:
        return requested
    return max(supported)
