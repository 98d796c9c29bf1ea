"""What each session declared at initialize, seen on the wire: the tap's `capabilities`
records (pure).

An `initialize` request carries the client's capabilities, its answer (`InitializeResult`,
as a JSON body or an SSE event) the server's; the answer's `MCP-Session-Id` names the
session they hold for. One record per initialize the server answered with a result:
`{"type": "capabilities", "flow", "t", "session", "server": [paths], "client": [paths]}`
(paths as lab.wire.capabilities.declared_paths gives them). The checker's
`declared_capabilities` judges the server's messages against them.
"""

from __future__ import annotations

import json
from typing import Any

from lab.wire.capabilities import initialize_capabilities


def client_declaration(body: bytes | None) -> list[str]:
    """The capabilities an `initialize` request body declares (none if unreadable)."""
    try:
        obj = json.loads(body or b"")
    except (ValueError, RecursionError):
        return []
    return initialize_capabilities(obj) or []


class InitializeWatch:
    """Finds the `InitializeResult` among one initialize flow's messages and makes its
    `capabilities` record (once)."""

    __slots__ = ("_client", "_done", "_flow", "_session")

    def __init__(self, flow: str, session: str | None, client: list[str]) -> None:
        self._flow = flow
        self._session = session
        self._client = client
        self._done = False

    def records(self, data: str, t: float, index: int | None = None) -> list[dict[str, Any]]:
        if self._done or '"capabilities"' not in data:
            return []
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):
            return []
        server = initialize_capabilities(obj) if isinstance(obj, dict) and "result" in obj else None
        if server is None:
            return []
        self._done = True
        return [
            {
                "type": "capabilities",
                "flow": self._flow,
                "t": t,
                "session": self._session,
                "server": server,
                "client": self._client,
            }
        ]
