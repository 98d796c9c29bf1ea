"""The admin control of the reference server (`--admin-token`): loopback-only,
token-guarded controls for the fault layer, never on the MCP auth path.

    POST /lab-admin/expire    header mcp-session-id: expire that session at once
    POST /lab-admin/rollback  start a rollback (new streams are not resumable)
    POST /lab-admin/stats     sessions, open SSE connections, ledger rows written
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from lab.server.http import Receive, Refused, Request, Send, send_json
from lab.wire.revisions import SESSION_HEADER

if TYPE_CHECKING:
    from lab.server.app import McpApp


async def admin_control(app: McpApp, req: Request, receive: Receive, send: Send) -> None:
    client = req.scope.get("client") or ("", 0)
    token = app.config.admin_token
    if token is None or req.method != "POST":
        raise Refused(404, "no_admin", "not found")
    if not str(client[0]).startswith("127.") and client[0] != "::1":
        raise Refused(403, "admin_not_loopback", "admin control is loopback only")
    if req.header("x-lab-admin-token") != token:
        raise Refused(403, "bad_admin_token", "bad admin token")
    await app._read_body(receive)
    now = time.time()
    state = app.state
    if req.path == "/lab-admin/expire":
        s = state.sessions.get(req.header(SESSION_HEADER) or "")
        if s is None:
            raise Refused(404, "unknown_session", "session not found")
        req.session = s
        state.end_session(s, "admin_expired", now)
        app._log(req, 200, "admin_expired")
        await send_json(send, 200, {"expired": s.pseudonym})
    elif req.path == "/lab-admin/rollback":
        state.start_rollback()
        app._log(req, 200, "rollback")
        await send_json(send, 200, {"rollback": True, "generation": state.generation})
    elif req.path == "/lab-admin/stats":
        await send_json(
            send,
            200,
            {
                "sessions": len(state.sessions),
                "open_sse": app.open_sse,
                "ledger_rows": app.ledger.rows_written,
                "retained_event_bytes": sum(s.retained for s in state.sessions.values()),
                "open_streams": sum(s.open_streams for s in state.sessions.values()),
            },
        )
    else:
        raise Refused(404, "no_admin", "not found")
