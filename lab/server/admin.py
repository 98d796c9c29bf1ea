"""The admin control of the reference server (`--admin-token`): loopback-only,
token-guarded controls for the fault layer and the run's phases, never on the MCP auth
path.

    POST /lab-admin/expire    header mcp-session-id: expire that session at once
    POST /lab-admin/rollback  start a rollback (new streams are not resumable)
    POST /lab-admin/stats     sessions, open SSE connections, ledger rows written
    POST /lab-admin/knobs     JSON body: change rollout knobs while the server runs
                              (`lab run` sets a phase's `[phases.server]` knobs so):
        {"resumable_fraction": F}   the share of sessions created from now on that are
                                    resumable (0..1; others write the shadow ledger only)
        {"rollback": "keep-index"}  start a rollback: new streams are not resumable, the
                                    old generation's cursors stay valid until their
                                    sessions expire
        {"rollback": "drop-index"}  the unacceptable rollback, to prove the lab catches
                                    it: the old cursors are refused at once
        {"max_rps": R}              the request-rate limit (0: none)
      answers the knobs in force: resumable_fraction, rollback, generation,
      kept_generations, max_rps. A bad body is 400 naming the key, and changes nothing.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any, Protocol

from lab.server.config import ServerConfig
from lab.server.http import Receive, Refused, Request, Send, read_body, send_json
from lab.server.ledger import Ledger
from lab.server.ratelimit import RequestRateLimiter
from lab.server.requestlog import log_request
from lab.server.state import ServerState
from lab.wire.revisions import SESSION_HEADER


class AdminTarget(Protocol):
    """What the admin control reads and changes of the server (`lab.server.app.McpApp`):
    declared here because the app routes `/lab-admin/` to this module, which must not
    import the app back."""

    config: ServerConfig
    state: ServerState
    ledger: Ledger
    max_rps: float
    rate: RequestRateLimiter
    open_sse: int


ROLLBACK_MODES = ("keep-index", "drop-index")


def parse_knobs(raw: bytes) -> dict[str, Any]:
    """The knobs of a `/lab-admin/knobs` body; ValueError naming the bad key."""
    try:
        body = json.loads(raw or b"{}")
    except (ValueError, RecursionError) as e:
        raise ValueError(f"the body is not JSON ({e})") from None
    if not isinstance(body, dict) or not body:
        raise ValueError("expected a JSON object with resumable_fraction, rollback or max_rps")
    knobs: dict[str, Any] = {}
    for key, value in body.items():
        number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
        if key == "resumable_fraction":
            if number is None or not 0.0 <= number <= 1.0:
                raise ValueError(f"resumable_fraction: expected a number in 0..1, got {value!r}")
            knobs[key] = float(number)
        elif key == "rollback":
            if value not in ROLLBACK_MODES:
                raise ValueError(f"rollback: expected one of {', '.join(ROLLBACK_MODES)}, got {value!r}")
            knobs[key] = value
        elif key == "max_rps":
            if number is None or not math.isfinite(number) or number < 0:
                raise ValueError(f"max_rps: expected a number >= 0, got {value!r}")
            knobs[key] = float(number)
        else:
            raise ValueError(f"{key}: unknown knob (known: resumable_fraction, rollback, max_rps)")
    return knobs


def knobs_in_force(app: AdminTarget) -> dict[str, Any]:
    state = app.state
    return {
        "resumable_fraction": state.resumable_fraction,
        "rollback": state.rollback,
        "generation": state.generation,
        "kept_generations": sorted(state.kept_generations),
        "max_rps": app.max_rps,
    }


def apply_knobs(app: AdminTarget, knobs: dict[str, Any], now: float) -> None:
    state = app.state
    if "resumable_fraction" in knobs:
        state.resumable_fraction = knobs["resumable_fraction"]
    if "rollback" in knobs:
        state.start_rollback(keep_index=knobs["rollback"] == "keep-index")
    if "max_rps" in knobs:
        rate = knobs["max_rps"]
        app.max_rps = rate
        app.rate = RequestRateLimiter(rate or float("inf"), burst=max(1.0, rate), now=now)


async def admin_control(app: AdminTarget, req: Request, receive: Receive, send: Send) -> None:
    client = req.scope.get("client") or ("", 0)
    token = app.config.admin_token
    if token is None or req.method != "POST":
        raise Refused(404, "no_admin", "not found")
    if not str(client[0]).startswith("127.") and client[0] != "::1":
        raise Refused(403, "admin_not_loopback", "admin control is loopback only")
    if req.header("x-lab-admin-token") != token:
        raise Refused(403, "bad_admin_token", "bad admin token")
    raw = await read_body(receive, app.config.max_body)
    now = time.time()
    state = app.state
    if req.path == "/lab-admin/expire":
        s = state.sessions.get(req.header(SESSION_HEADER) or "")
        if s is None:
            raise Refused(404, "unknown_session", "session not found")
        req.session = s
        state.end_session(s, "admin_expired", now)
        log_request(app.ledger, req, 200, "admin_expired")
        await send_json(send, 200, {"expired": s.pseudonym})
    elif req.path == "/lab-admin/rollback":
        state.start_rollback()
        log_request(app.ledger, req, 200, "rollback")
        await send_json(send, 200, {"rollback": True, "generation": state.generation})
    elif req.path == "/lab-admin/knobs":
        try:
            knobs = parse_knobs(raw)
        except ValueError as e:
            raise Refused(400, "bad_knobs", str(e)) from None
        apply_knobs(app, knobs, now)
        log_request(app.ledger, req, 200, "knobs")
        await send_json(send, 200, knobs_in_force(app))
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
