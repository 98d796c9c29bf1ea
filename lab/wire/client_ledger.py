"""Rows of the client ledger, as the core produces them (the driver writes them).

Schema name `mcpClientLedger.v1`. Every time is Unix epoch seconds (float, the shared
clock of a run); every duration is seconds. No raw session ID or token appears: sessions
are given by `session` (the per-run HMAC pseudonym from `Redactor.session`) and by the
client-side `session_generation` (1 for the first handshake, +1 for each new one).
Inbox receipts and outbox dispatches are rows of the inbox database itself
(`lab.inbox`), written in the same transaction as the acceptance.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar

LEDGER_SCHEMA = "mcpClientLedger.v1"


@dataclass(frozen=True, slots=True)
class HttpExchange:
    """One HTTP request of the client, written when it ends.

    purpose: initialize | initialized | call | standalone | resume | cancel | delete
    status: HTTP status, or None if no response head arrived (network error)
    carried_session: the request carried a session ID (what gate 3 keys on)
    started_at / ended_at: request sent / connection finished
    error: why the connection ended abnormally ("" if it ended normally)
    """

    table: ClassVar[str] = "http_exchanges"
    client_id: str
    conn_id: int
    purpose: str
    method: str
    stream_key: str | None
    status: int | None
    session: str | None
    session_generation: int
    carried_session: bool
    started_at: float
    ended_at: float
    error: str
    last_event_id: str | None


@dataclass(frozen=True, slots=True)
class EventRejected:
    """An event `accept_stream_event` refused (reason: `RejectReason`) or found duplicate
    (reason `duplicate`). digest: SHA-256 hex of the event's data."""

    table: ClassVar[str] = "events_rejected"
    client_id: str
    conn_id: int
    session_generation: int
    stream_key: str
    event_id: str
    digest: str
    reason: str
    detail: str
    at: float


@dataclass(frozen=True, slots=True)
class ReconnectAttempt:
    """One reconnect the client actually made (after the budget granted it).

    kind: resume (GET + Last-Event-ID) | reinitialize | reopen (fresh standalone GET) |
          resend (a call re-sent after 429/503) | delete (DELETE re-sent)
    cause: connection_lost | server_closed | cursor_gap | http_<status> | session_not_found | ...
    advised_delay: what the server advised (`retry` or `Retry-After`), seconds; None if nothing
    planned_delay: max(backoff, advice) chosen at loss time, seconds
    waited: sent_at - lost_at, seconds (>= planned_delay; more when the budget held it back)
    attempt: 0 for the first attempt after a loss
    """

    table: ClassVar[str] = "reconnects"
    client_id: str
    kind: str
    stream_key: str | None
    cause: str
    advised_delay: float | None
    planned_delay: float
    lost_at: float
    sent_at: float
    waited: float
    attempt: int
    conn_id: int
    session_generation: int


@dataclass(frozen=True, slots=True)
class Recovery:
    """One loss and how it ended.

    lost_at: when the loss was detected; recovered_at: the next accepted event on the
    resumed stream, or the completion of the operation by a retry, or (standalone GET
    streams, which may stay silent) the moment the resumed stream was open again;
    None if it never recovered. path: resumed | retried | reopened | abandoned.
    reinitialized: a new handshake happened during the recovery.
    """

    table: ClassVar[str] = "recoveries"
    client_id: str
    stream_key: str
    operation_key: str | None
    cause: str
    lost_at: float
    recovered_at: float | None
    path: str
    attempts: int
    reinitialized: bool


@dataclass(frozen=True, slots=True)
class SessionEvent:
    """A change of the client's session.

    what: established | expired | terminated | termination_unsupported | delete_unconfirmed
          | initialize_failed
    """

    table: ClassVar[str] = "sessions"
    client_id: str
    session: str | None
    session_generation: int
    what: str
    protocol_version: str | None
    at: float


@dataclass(frozen=True, slots=True)
class OperationRecord:
    """A logical operation (tool call) and its outcome (ok | error | unknown | cancelled).

    attempts: how many requests (distinct JSON-RPC IDs) were sent for it.
    """

    table: ClassVar[str] = "operations"
    client_id: str
    operation_key: str
    tool: str
    write: bool
    outcome: str
    reason: str
    attempts: int
    started_at: float
    finished_at: float
    session_generation: int


type Record = HttpExchange | EventRejected | ReconnectAttempt | Recovery | SessionEvent | OperationRecord

RECORD_TYPES: tuple[type[Any], ...] = (
    HttpExchange,
    EventRejected,
    ReconnectAttempt,
    Recovery,
    SessionEvent,
    OperationRecord,
)


def as_row(record: Record) -> dict[str, Any]:
    return asdict(record)
