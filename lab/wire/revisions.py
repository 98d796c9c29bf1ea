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

from dataclasses import dataclass

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

MODERN_REVISIONS: tuple[str, ...] = ("2026-07-28",)
"""The modern era's revisions: no handshake, no session, no resumption."""

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


def revision(name: str) -> Revision:
    """The rules of revision `name`; KeyError names what is supported."""
    try:
        return REVISIONS[name]
    except KeyError:
        raise KeyError(f"unsupported protocol revision {name!r}; supported: {', '.join(REVISIONS)}") from None


def negotiate(requested: str, supported: tuple[str, ...] = SUPPORTED_REVISIONS) -> str:
    """Server side of version negotiation: the requested revision if supported, else our latest."""
    if requested in supported:
        return requested
    return max(supported)
