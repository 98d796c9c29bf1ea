"""What each session declared at initialize, seen on the wire: the tap's `capabilities`
records; and what each `tools/list` answer says of its tools: the tap's `tools` records
(pure).

An `initialize` request carries the client's capabilities, its answer (`InitializeResult`,
as a JSON body or an SSE event) the server's; the answer's `MCP-Session-Id` names the
session they hold for. One record per initialize the server answered with a result:
`{"type": "capabilities", "flow", "t", "session", "server": [paths], "client": [paths]}`
(paths as lab.wire.capabilities.declared_paths gives them). The modern era's
`server/discover` makes the same record, with no session: its request's `_meta` holds
the client's capabilities, its result the server's (they hold for the client that asked,
named by its flow's `x-lab-conn`). The checker's
`declared_capabilities` judges the server's messages against them.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from lab.wire.capabilities import initialize_capabilities
from lab.wire.extensions import IDEMPOTENCY_META

if TYPE_CHECKING:
    from lab.faults.pipeline import MessageWatch


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


ANNOTATIONS = ("readOnlyHint", "idempotentHint")
"""The tool annotations the retry rule reads (lab.checker.rules.client_resend)."""
KEY_HONOURED = IDEMPOTENCY_META
"""A tool whose `_meta` says `true` under this name performs a call once per idempotency
key (lab.wire.extensions): recorded beside the annotations, under the same name."""


def tool_annotations(obj: object) -> dict[str, dict[str, bool]] | None:
    """name -> the retry rule's annotations each tool of a `tools/list` result declares
    (only the booleans given); None if `obj` is not such a result."""
    result = obj.get("result") if isinstance(obj, dict) else None
    tools = result.get("tools") if isinstance(result, dict) else None
    if not isinstance(tools, list):
        return None
    out: dict[str, dict[str, bool]] = {}
    for tool in tools:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            continue
        given = tool.get("annotations")
        pairs = given.items() if isinstance(given, dict) else ()
        hints = {k: v for k, v in pairs if k in ANNOTATIONS and isinstance(v, bool)}
        meta = tool.get("_meta")
        if isinstance(meta, dict) and meta.get(KEY_HONOURED) is True:
            hints[KEY_HONOURED] = True
        out[tool["name"]] = hints
    return out


class ToolsWatch:
    """Finds a `tools/list` answer among one flow's messages and makes its `tools` record
    (`{"type": "tools", "flow", "t", "session", "tools": {name: {annotation: bool}}}`),
    once; what `inner` watches for on the same flow is still looked for."""

    __slots__ = ("_done", "_flow", "_inner", "_session")

    def __init__(self, flow: str, session: str | None, inner: MessageWatch | None) -> None:
        self._flow = flow
        self._session = session
        self._inner = inner
        self._done = False

    def records(self, data: str, t: float, index: int | None = None) -> list[dict[str, Any]]:
        out = self._inner.records(data, t, index) if self._inner is not None else []
        if self._done or '"tools"' not in data:
            return out
        try:
            tools = tool_annotations(json.loads(data))
        except (ValueError, RecursionError):
            return out
        if tools is not None:
            self._done = True
            out.append(
                {"type": "tools", "flow": self._flow, "t": t, "session": self._session, "tools": tools}
            )
        return out
