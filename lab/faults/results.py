"""Write receipts seen on the wire: the tap's `result` records (pure).

A write call is a `tools/call` carrying `params._meta["mcp-lab/idempotency-key"]`. The
tap notes each one as its request passes (`WriteCalls.note`), and writes one `result`
record for every JSON-RPC response to it that the **server** sent, before any fault: on
the call's own POST stream, on a resumption or standalone GET of the same session (a
response replayed there), or as an `application/json` body. Two different
`result_digest`s for one (auth subject, idempotency key) are a write performed twice,
seen from the wire alone (docs/ledgers.md).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from hashlib import sha256
from typing import Any, Final

from lab.faults.facts import JsonRpcId

MAX_WRITE_CALLS: Final = 65536


@dataclass(frozen=True, slots=True)
class WriteCall:
    """A write call as its request went to the server."""

    jsonrpc_id: JsonRpcId
    idempotency_key: str
    tool: str
    auth: str | None
    """The pseudonym of the bearer token it carried to the server (`t_…`), or None."""


class WriteCalls:
    """The recent write calls by (session pseudonym, JSON-RPC id), bounded (oldest forgotten)."""

    __slots__ = ("_calls", "_limit", "_sessions")

    def __init__(self, limit: int = MAX_WRITE_CALLS) -> None:
        self._calls: OrderedDict[tuple[str, str, JsonRpcId], WriteCall] = OrderedDict()
        self._sessions: dict[str, int] = {}
        self._limit = limit

    def note(self, session: str, call: WriteCall) -> None:
        key = (session, type(call.jsonrpc_id).__name__, call.jsonrpc_id)
        if key not in self._calls:
            self._sessions[session] = self._sessions.get(session, 0) + 1
        self._calls[key] = call
        self._calls.move_to_end(key)
        if len(self._calls) > self._limit:
            (old, _, _), _ = self._calls.popitem(last=False)
            left = self._sessions[old] - 1
            if left:
                self._sessions[old] = left
            else:
                del self._sessions[old]

    def get(self, session: str, rid: JsonRpcId) -> WriteCall | None:
        return self._calls.get((session, type(rid).__name__, rid))

    def has(self, session: str | None) -> bool:
        """Whether any write call of this session is remembered."""
        return session is not None and session in self._sessions


def result_digest(value: object) -> str:
    """SHA-256 hex of the canonical JSON of a response's `result` (or `error`)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return sha256(text.encode()).hexdigest()


class ResultWatch:
    """Finds the answers to write calls among one flow's messages (an SSE event's data or a
    JSON body) and makes their `result` records."""

    __slots__ = ("_calls", "_flow", "_own", "_session")

    def __init__(self, flow: str, session: str | None, own: WriteCall | None, calls: WriteCalls) -> None:
        self._flow = flow
        self._session = session
        self._own = own
        self._calls = calls

    def records(self, data: str, t: float, index: int | None = None) -> list[dict[str, Any]]:
        """A `result` record per response to a write call in `data` (usually none);
        `index`: the SSE event's index in its flow (None for a JSON body), which lets the
        checker find where that event belongs."""
        if '"result"' not in data and '"error"' not in data:
            return []
        if self._own is None and not self._calls.has(self._session):
            return []
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):
            return []
        out = []
        for m in obj if isinstance(obj, list) else [obj]:
            if not isinstance(m, dict) or ("result" not in m and "error" not in m):
                continue
            call = self._call_of(m.get("id"))
            if call is not None:
                out.append(self._record(call, m, t, index))
        return out

    def _call_of(self, rid: object) -> WriteCall | None:
        if not isinstance(rid, str | int) or isinstance(rid, bool):
            return None
        own = self._own
        if own is not None and rid == own.jsonrpc_id and type(rid) is type(own.jsonrpc_id):
            return own
        return self._calls.get(self._session, rid) if self._session is not None else None

    def _record(self, call: WriteCall, m: dict[str, Any], t: float, index: int | None) -> dict[str, Any]:
        result = m.get("result")
        is_error = "result" not in m or (isinstance(result, dict) and result.get("isError") is True)
        return {
            "type": "result",
            "flow": self._flow,
            "t": t,
            "session": self._session,
            "auth": call.auth,
            "jsonrpc_id": call.jsonrpc_id,
            "idempotency_key": call.idempotency_key,
            "tool": call.tool,
            "is_error": is_error,
            "result_digest": result_digest(result if "result" in m else m.get("error")),
            "index": index,
        }
