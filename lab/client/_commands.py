"""What the client core asks its driver to do (commands) and tells its user (notices).

Events in, commands out: the driver calls `ClientCore.response_head / response_data /
response_end / connection_failed / tick` with what happened and carries out the
commands returned. The application (a Locust user, a test) reads `notices`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from lab.wire.jsonrpc import JsonObject


class Purpose(enum.StrEnum):
    """Why an HTTP request is made (written to the client ledger)."""

    INITIALIZE = "initialize"
    INITIALIZED = "initialized"
    CALL = "call"
    STANDALONE = "standalone"
    RESUME = "resume"
    CANCEL = "cancel"
    DELETE = "delete"


type Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class SendRequest:
    """Open connection `conn_id` with this request and stream its response back."""

    conn_id: int
    purpose: Purpose
    method: str
    headers: Headers
    body: bytes | None

    def header(self, name: str) -> str | None:
        name = name.lower()
        for k, v in self.headers:
            if k == name:
                return v
        return None


@dataclass(frozen=True, slots=True)
class CloseConnection:
    """Abort connection `conn_id` (the core needs nothing more from it)."""

    conn_id: int


type Command = SendRequest | CloseConnection


class CallOutcome(enum.StrEnum):
    OK = "ok"
    ERROR = "error"
    """The server answered with a JSON-RPC error or refused the request (4xx)."""
    UNKNOWN = "unknown"
    """May or may not have happened (Jepsen's `info`): e.g. the session expired while the
    call was in flight. Retry only with the same idempotency key."""
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class CallHandle:
    operation_key: str
    """The logical operation; also the idempotency key sent to the server."""
    tool: str


@dataclass(frozen=True, slots=True)
class SessionEstablished:
    generation: int
    protocol_version: str
    at: float


@dataclass(frozen=True, slots=True)
class SessionLost:
    generation: int
    at: float
    reason: str
    outcome_unknown: tuple[CallHandle, ...]


@dataclass(frozen=True, slots=True)
class CallFinished:
    call: CallHandle
    outcome: CallOutcome
    at: float
    result: JsonObject | None = None
    error: Any = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Progress:
    call: CallHandle
    progress: float | None
    at: float


class LeaveReceipt(enum.StrEnum):
    """How leaving ended. Only DELETED is a deletion receipt."""

    DELETED = "deleted"
    ALREADY_GONE = "already_gone"
    TERMINATION_UNSUPPORTED = "termination_unsupported"
    UNCONFIRMED = "unconfirmed"
    NO_SESSION = "no_session"


@dataclass(frozen=True, slots=True)
class LeaveFinished:
    receipt: LeaveReceipt
    at: float


type Notice = SessionEstablished | SessionLost | CallFinished | Progress | LeaveFinished
