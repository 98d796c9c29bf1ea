"""The ledger's `requests` table: one row per request the reference server answered
(docs/ledgers.md), written by the MCP endpoint and by the admin control alike."""

from __future__ import annotations

import time

from lab.server import ledger as L
from lab.server.http import Request
from lab.wire.revisions import LAST_EVENT_ID_HEADER, PROTOCOL_VERSION_HEADER


def log_request(
    ledger: L.Ledger, req: Request, status: int, reason: str | None, cursor_verdict: str | None = None
) -> None:
    """Record how `req` was answered: its status, the refusal's reason (None: served) and,
    for a GET with Last-Event-ID, the cursor's verdict."""
    if not ledger.enabled:
        return
    ledger.write(
        L.INSERT_REQUEST,
        (
            time.time(),
            req.method,
            req.conn,
            None if req.session is None else req.session.pseudonym,
            status,
            reason,
            req.header("origin"),
            None if req.origin_allowed is None else int(req.origin_allowed),
            req.header(PROTOCOL_VERSION_HEADER),
            req.header(LAST_EVENT_ID_HEADER),
            cursor_verdict,
        ),
    )
