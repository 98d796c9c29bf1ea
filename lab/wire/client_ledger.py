"""Rows of the client ledger, as the core produces them (the driver writes them).

Schema name `mcpClientLedger.v1`. Every time is Unix epoch seconds (float, the shared
clock of a run); every duration is seconds. No raw session ID or token appears: sessions
are given by `session` (the per-run HMAC pseudonym from `Redactor.session`) and by the
client-side `session_generation` (1 for the first handshake, +1 for each new one).
Inbox receipts and outbox dispatches are rows of the inbox database itself
(`lab.inbox`), written in the same transaction as the acceptance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from lab.wire.frozen import frozen_record

LEDGER_SCHEMA = "mcpClientLedger.v1"


@frozen_record
class HttpExchange:
    """One HTTP request of the client, written when it ends.

    purpose: initialize | initialized | call | standalone | resume | cancel | delete
    status: HTTP status, or None if no response head arrived (network error)
    carried_session: the request carried a session ID (what gate 3 keys on)
    started_at / ended_at: request sent / connection finished
    error: why the connection ended abnormally ("" if it ended normally): a transport
           cause in the lab's words (connection_refused, connection_reset, read_timeout,
           peer_closed_mid_body, protocol_error, ... : `lab.drivers.causes`), or the
           client's own reason to close it (cut_mid_event, cursor_gap, resume_silent,
           stream_idle, left, client_stopped, cancelled, http_<status>, ...)
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


@frozen_record
class EventRejected:
    """An event the client did not take: refused by `accept_stream_event` (reason: a
    `RejectReason` value), found duplicate (reason `duplicate`), or refused unread around
    the door (`connection_abandoned`: read in the same chunk after the client gave up on
    the connection; `no_stream`; `not_initialize_result`). Every event the client drops
    has a row. digest: SHA-256 hex of the event's data; event_id: as sent, or `~<conn>.<n>`
    for an event without an ID."""

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
          resend (a call re-sent: same idempotency key, new request ID) | delete (DELETE re-sent)
    stream_key: the stream first lost in this recovery (None for reinitialize and delete)
    cause: why this attempt is needed (the latest failure): a transport cause (see
           `HttpExchange.error`), server_closed, cut_mid_event, cursor_gap, http_<status>,
           session_not_found, no_valid_cursor, cursor_refused_http_<status>,
           resume_silent, stream_idle, gave_up_resuming_after_<cause>, ...
    advised_delay: what the server advised (`retry` or `Retry-After`), seconds; None if nothing
    planned_delay: max(backoff, advice) chosen when the attempt was planned, seconds
    lost_at: when the recovery's first loss was detected
    waited: sent_at - lost_at, seconds (>= planned_delay; more when the budget held it back)
    attempt: 0 for the first attempt of this kind in this recovery
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


@frozen_record
class Recovery:
    """One loss of a call or of the standalone stream, and how it ended (one row each).

    stream_key: the stream first lost; operation_key: the call's (None for a GET stream)
    cause: the first loss's cause (as `ReconnectAttempt.cause`; `left` / `client_stopped`
           for a call still waiting, with no loss seen, when its client left or stopped)
    lost_at: when the loss was detected (for a call still waiting at the end: the last
           time it moved: sent, or a message accepted)
    recovered_at: the next accepted message on the resumed stream, or the completion of
           the operation (ok or error) by a retry, or (standalone GET streams, which may
           stay silent) the moment the stream was open again; None: never recovered
    path: how it got back: resumed | retried | reopened; or why it never did (with
          recovered_at None): abandoned (every attempt used up) | session_lost (the
          session ended meanwhile, 404, so the call cannot complete; a standalone
          stream instead comes back with the next session's: reopened, reinitialized)
          | cancelled | left (the client left still waiting) | client_stopped (its
          process quit still waiting)
    attempts: reconnect attempts made during the recovery (all kinds)
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

    reason: why, for an outcome other than ok: jsonrpc_error, http_<status>,
            session_not_found, gave_up_after_<cause>, left, client_stopped, or the
            application's cancel reason
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
