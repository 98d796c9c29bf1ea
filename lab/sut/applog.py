"""The application log (`mcpLabAppLog.v1`) as a driver writes it: `AppLog` writes the
lines, `ClientContext` is what a driver reports about one client (deliveries, the JSON-RPC
id of each call's request, reconnects, notices) and turns raw session IDs into pseudonyms
before anything is written.
"""

from __future__ import annotations

import contextvars
import json
import time
from typing import IO, Any

from lab.sut.protocol import ReconnectKind, Scrubber, describe, message_digest
from lab.wire.jsonrpc import JsonRpcId
from lab.wire.redact import Redactor

current_client: contextvars.ContextVar[ClientContext | None] = contextvars.ContextVar(
    "lab_sut_current_client", default=None
)
"""The client whose task is running: tasks an implementation spawns inherit it, so a log
line the implementation writes can be attributed to its client."""


class AppLog:
    """Writes `mcpLabAppLog.v1` lines; flushed at once for lifecycle lines, else every 0.2 s."""

    def __init__(self, out: IO[str]) -> None:
        self._out = out
        self._dirty = False

    def write(self, ev: str, *, flush: bool = False, **fields: Any) -> None:
        rec = {"ev": ev, "t": round(time.time(), 6), **fields}
        self._out.write(json.dumps(rec, separators=(",", ":"), ensure_ascii=False) + "\n")
        self._dirty = True
        if flush:
            self.flush()

    def flush(self) -> None:
        if self._dirty:
            self._out.flush()
            self._dirty = False


class ClientContext:
    """What a driver reports about one client; turns raw session IDs into pseudonyms."""

    def __init__(self, client: str, log: AppLog, redactor: Redactor, keys: dict[str, str]) -> None:
        self.client = client
        self._log = log
        self._redactor = redactor
        self._keys = keys  # idempotency key -> call ID, for this client's calls
        self._rpc_calls: dict[JsonRpcId, str] = {}
        self.call_rpc: dict[str, JsonRpcId] = {}
        self.scrub = Scrubber()
        self._session: str | None = None

    @property
    def session(self) -> str | None:
        """The pseudonym of the session the client uses now (None before it has one)."""
        return self._session

    def set_session_id(self, raw: str | None) -> None:
        self._session = self._redactor.session(raw)
        if raw is not None and self._session is not None:
            self.scrub.add(raw, self._session)

    def request_sent(self, rpc_id: JsonRpcId, idempotency_key: str | None) -> None:
        """The implementation sent a request carrying a call's key: join its JSON-RPC id to the call."""
        call = self._keys.get(idempotency_key) if idempotency_key is not None else None
        if call is not None:
            self._rpc_calls[rpc_id] = call
            self.call_rpc.setdefault(call, rpc_id)

    def deliver(self, message: dict[str, Any]) -> None:
        kind, rid, method = describe(message)
        call = self._rpc_calls.get(rid) if rid is not None and kind in ("response", "error") else None
        self._log.write(
            "deliver",
            client=self.client,
            session=self._session,
            kind=kind,
            id=rid,
            method=method,
            call=call,
            digest=message_digest(message),
        )

    def reconnect(self, kind: ReconnectKind) -> None:
        self._log.write("reconnect", client=self.client, session=self._session, kind=kind)

    def notice(self, text: str) -> None:
        self._log.write("notice", client=self.client, session=self._session, text=self.scrub(text)[:2000])
