"""Every state transition of the client lives in this file, as data.

The rules the lab checks draw one diagram for a session and its streams:

    SESSION_ACTIVE -> STREAM_OPEN -> DISCONNECTED -> RESUME_PENDING
    RESUME_PENDING -> STREAM_OPEN | CURSOR_REJECTED | SESSION_EXPIRED
    SESSION_ACTIVE -> DELETE_REQUESTED -> TERMINATED
    SESSION_EXPIRED | TERMINATED -> REINITIALIZE_REQUIRED

A client has one session and many streams at once (the standalone GET stream and one
stream per POST request), so the table has two roles, as h11 has CLIENT and SERVER:

- SESSION: one machine per client. `SESSION_ACTIVE -> STREAM_OPEN` is not a move of the
  session but the rule that a stream may only be opened while the session is active
  (`STREAM_OPEN_REQUIRES`).
- STREAM: one machine per stream, created in STREAM_OPEN.

Additions to that diagram, because a working client needs them:
- INITIALIZING (SESSION): a handshake is in flight, so no second one is started.
- CLOSED (STREAM): the stream ended normally (its response arrived, or it was cancelled).
- DISCONNECTED -> CURSOR_REJECTED on NO_VALID_CURSOR: the client's own check of its cursor
  failed (none was ever received, or it does not belong to this session and stream), so it
  does not even ask the server.
- DELETE_REQUESTED -> SESSION_ACTIVE on DELETE_REFUSED (405): the server does not let
  clients terminate sessions; that is not a deletion receipt.
- ABANDONED (STREAM): the client stops waiting for a stream without cancelling the
  request: its resumption was given up (the call is re-sent instead), or the client
  leaves or stops. Unlike CANCELLED, no `notifications/cancelled` is sent.

An illegal move raises LocalProtocolError and leaves the state as it was. The diagram in
docs/state-machine.md is generated from these tables (`lab diagram`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from lab.wire.errors import LocalProtocolError


class State(enum.StrEnum):
    # SESSION role
    REINITIALIZE_REQUIRED = "REINITIALIZE_REQUIRED"
    INITIALIZING = "INITIALIZING"
    SESSION_ACTIVE = "SESSION_ACTIVE"
    DELETE_REQUESTED = "DELETE_REQUESTED"
    TERMINATED = "TERMINATED"
    SESSION_EXPIRED = "SESSION_EXPIRED"
    # STREAM role (SESSION_EXPIRED is shared: a stream ends that way when its session does)
    STREAM_OPEN = "STREAM_OPEN"
    DISCONNECTED = "DISCONNECTED"
    RESUME_PENDING = "RESUME_PENDING"
    CURSOR_REJECTED = "CURSOR_REJECTED"
    CLOSED = "CLOSED"


class Trigger(enum.StrEnum):
    """What happened (named for the fact, not for the reaction)."""

    # session
    INITIALIZE_SENT = "INITIALIZE_SENT"
    INITIALIZE_OK = "INITIALIZE_OK"
    INITIALIZE_FAILED = "INITIALIZE_FAILED"
    SESSION_NOT_FOUND = "SESSION_NOT_FOUND"  # a 404 to a request that carried the session ID
    DELETE_SENT = "DELETE_SENT"
    DELETE_CONFIRMED = "DELETE_CONFIRMED"  # 2xx to DELETE
    DELETE_REFUSED = "DELETE_REFUSED"  # 405 to DELETE: termination unsupported
    DELETE_ABANDONED = "DELETE_ABANDONED"  # DELETE outcome never learned; client leaves anyway
    REINITIALIZE = "REINITIALIZE"
    # stream
    CONNECTION_LOST = "CONNECTION_LOST"
    SERVER_CLOSED = "SERVER_CLOSED"  # connection ended before the stream's end (polling close)
    RESUME_SCHEDULED = "RESUME_SCHEDULED"
    NO_VALID_CURSOR = "NO_VALID_CURSOR"
    RESUMED = "RESUMED"  # GET with Last-Event-ID answered with an event stream
    RESUME_FAILED = "RESUME_FAILED"  # network error, 429, 503: try again later
    CURSOR_REFUSED = "CURSOR_REFUSED"  # the server rejected the cursor
    COMPLETED = "COMPLETED"  # the response arrived, or the server ended a stream it owed nothing on
    CANCELLED = "CANCELLED"  # we sent notifications/cancelled
    ABANDONED = "ABANDONED"  # the client stops waiting: it gave up resuming, or it leaves or stops
    SESSION_GONE = "SESSION_GONE"  # the session this stream belongs to expired or ended
    REISSUED = "REISSUED"  # modern era: a lost stream is never resumed; its call goes again as a new request


class Role(enum.StrEnum):
    SESSION = "SESSION"
    STREAM = "STREAM"


S, T = State, Trigger

TRANSITIONS: Mapping[Role, Mapping[State, Mapping[Trigger, State]]] = {
    Role.SESSION: {
        S.REINITIALIZE_REQUIRED: {T.INITIALIZE_SENT: S.INITIALIZING},
        S.INITIALIZING: {T.INITIALIZE_OK: S.SESSION_ACTIVE, T.INITIALIZE_FAILED: S.REINITIALIZE_REQUIRED},
        S.SESSION_ACTIVE: {T.DELETE_SENT: S.DELETE_REQUESTED, T.SESSION_NOT_FOUND: S.SESSION_EXPIRED},
        S.DELETE_REQUESTED: {
            T.DELETE_CONFIRMED: S.TERMINATED,
            T.SESSION_NOT_FOUND: S.TERMINATED,
            T.DELETE_ABANDONED: S.TERMINATED,
            T.DELETE_REFUSED: S.SESSION_ACTIVE,
        },
        S.SESSION_EXPIRED: {T.REINITIALIZE: S.REINITIALIZE_REQUIRED},
        S.TERMINATED: {T.REINITIALIZE: S.REINITIALIZE_REQUIRED},
    },
    Role.STREAM: {
        S.STREAM_OPEN: {
            T.CONNECTION_LOST: S.DISCONNECTED,
            T.SERVER_CLOSED: S.DISCONNECTED,
            T.COMPLETED: S.CLOSED,
            T.CANCELLED: S.CLOSED,
            T.ABANDONED: S.CLOSED,
            T.SESSION_GONE: S.SESSION_EXPIRED,
        },
        S.DISCONNECTED: {
            T.RESUME_SCHEDULED: S.RESUME_PENDING,
            T.NO_VALID_CURSOR: S.CURSOR_REJECTED,
            T.REISSUED: S.CLOSED,
            T.CANCELLED: S.CLOSED,
            T.ABANDONED: S.CLOSED,
            T.SESSION_GONE: S.SESSION_EXPIRED,
        },
        S.RESUME_PENDING: {
            T.RESUMED: S.STREAM_OPEN,
            T.CURSOR_REFUSED: S.CURSOR_REJECTED,
            T.SESSION_NOT_FOUND: S.SESSION_EXPIRED,
            T.RESUME_FAILED: S.DISCONNECTED,
            T.CANCELLED: S.CLOSED,
            T.ABANDONED: S.CLOSED,
            T.SESSION_GONE: S.SESSION_EXPIRED,
        },
        S.CURSOR_REJECTED: {},
        S.SESSION_EXPIRED: {},
        S.CLOSED: {},
    },
}

INITIAL: Mapping[Role, State] = {Role.SESSION: S.REINITIALIZE_REQUIRED, Role.STREAM: S.STREAM_OPEN}

STREAM_OPEN_REQUIRES = S.SESSION_ACTIVE
"""The rules' `SESSION_ACTIVE -> STREAM_OPEN`: a stream may be opened only in this session state."""

TERMINAL_STREAM_STATES = frozenset(s for s, moves in TRANSITIONS[Role.STREAM].items() if not moves)


class Machine:
    """One role's state, moved only through the table."""

    __slots__ = ("history", "role", "state")

    def __init__(self, role: Role, state: State | None = None) -> None:
        self.role = role
        self.state = INITIAL[role] if state is None else state
        if self.state not in TRANSITIONS[role]:
            raise LocalProtocolError(f"{self.state} is not a {role} state")
        self.history: list[tuple[State, Trigger, State]] = []

    def can(self, trigger: Trigger) -> bool:
        return trigger in TRANSITIONS[self.role][self.state]

    def process(self, trigger: Trigger) -> State:
        """Apply `trigger`; LocalProtocolError (state unchanged) if the table has no such move."""
        moves = TRANSITIONS[self.role][self.state]
        try:
            new = moves[trigger]
        except KeyError:
            raise LocalProtocolError(
                f"{self.role}: {trigger} is not allowed in {self.state} "
                f"(allowed: {', '.join(moves) or 'nothing, terminal'})"
            ) from None
        self.history.append((self.state, trigger, new))
        self.state = new
        return new
