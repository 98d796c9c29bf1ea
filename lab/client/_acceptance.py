"""`accept_stream_event`: the only door through which a server message enters the client.

In one step it checks, in this order (the first failing check decides; the order is the
code's):

1. session      the connection was opened in the client's *current* session generation,
                and that session is active (a stream of an expired session delivers nothing);
2. version      the connection carried the negotiated `MCP-Protocol-Version`, and the
                server did not answer with another one;
3. subject      the connection carried a token of the session's authorization subject;
4. event ID     known (`e1`) scheme: the ID belongs to this session (tag), the server
                generation, this stream, and its digest matches the content;
5. duplicate    the dedup key (sessionGeneration, streamId, eventId, messageDigest) was
                accepted before: the event is a DUPLICATE (not an error, not accepted twice);
6. other stream (both schemes) an event ID already accepted on another stream of this
                session is refused (`crossed_stream`);
7. cursor       known scheme: the sequence is exactly the watermark + 1 (lower = regression,
                higher = gap: something was lost, so resume from the watermark instead);
8. digest       the same event ID never comes with different content;
9. message      the data parses as JSON-RPC;
10. correlation a response ends only its own POST stream (its ID is the POST's request ID):
                a response to a request that already completed is refused, on its own
                stream (nothing comes after the response) as on any other (another
                request's ID); a standalone GET stream never carries a response unless it
                is the resumption of that POST stream; progress carries the token of the
                request in flight on this stream;

then writes the inbox receipt and the business dispatch in one transaction through the
`InboxStore`. The dispatch key of a response is the logical operation (idempotency key),
so a late response and a retried call's response cannot both be dispatched: the response
to a new attempt (a new request) of a completed operation is taken, as that attempt's
answer, but not dispatched again.

Checks are pure; the store is the only effect, and an in-memory store (`MemoryInbox`, in
`_memory_inbox`) and a durable SQLite one (`lab.inbox.SqliteInbox`) implement the same
protocol.
"""

from __future__ import annotations

import enum
from typing import Protocol

from lab.wire import jsonrpc
from lab.wire.errors import RemoteProtocolError
from lab.wire.event_ids import (
    CursorVerdict,
    ParsedEventId,
    classify_structured,
    message_digest,
    parse_event_id,
)
from lab.wire.frozen import frozen_record
from lab.wire.sse import SseEvent


class Outcome(enum.StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"


class RejectReason(enum.StrEnum):
    """Why an event was refused. Stable strings: they are written to ledgers."""

    STALE_SESSION = "stale_session"
    PROTOCOL_VERSION_MISMATCH = "protocol_version_mismatch"
    SUBJECT_MISMATCH = "subject_mismatch"
    MALFORMED_EVENT_ID = "malformed_event_id"
    FOREIGN_SESSION = "foreign_session"
    OTHER_GENERATION = "other_generation"
    CROSSED_STREAM = "crossed_stream"
    CONTENT_TAMPERED = "content_tampered"
    CONTENT_MISMATCH = "content_mismatch"
    CURSOR_REGRESSION = "cursor_regression"
    CURSOR_GAP = "cursor_gap"
    MALFORMED_MESSAGE = "malformed_message"
    RESPONSE_ON_STANDALONE_STREAM = "response_on_standalone_stream"
    RESPONSE_ID_MISMATCH = "response_id_mismatch"
    PROGRESS_TOKEN_MISMATCH = "progress_token_mismatch"
    STREAM_ALREADY_ENDED = "stream_already_ended"
    # Refused by the core around the door, not by `accept_stream_event`:
    CONNECTION_ABANDONED = "connection_abandoned"
    """Read in the same chunk after the client gave up on the connection (untrusted)."""
    NO_STREAM = "no_stream"
    """An event on a connection that carries no stream (no stream was opened for it)."""
    NOT_INITIALIZE_RESULT = "not_initialize_result"
    """A message other than the InitializeResult on an initialize stream (no session yet)."""


class Check(enum.StrEnum):
    """The checks, by name, so a test can switch one off and show what it guards against."""

    SESSION = "session"
    VERSION = "version"
    SUBJECT = "subject"
    EVENT_ID = "event_id"
    DUPLICATE = "duplicate"
    CURSOR = "cursor"
    CORRELATION = "correlation"
    DIGEST = "digest"


ALL_CHECKS = frozenset(Check)


@frozen_record
class SessionView:
    """The client's current session at the moment of acceptance."""

    generation: int
    """Client-side session generation: 1 for the first handshake, +1 for every new one."""
    active: bool
    protocol_version: str
    auth_subject: str | None
    session_tag: str | None
    """`session_tag(session_id)`; None for a server without sessions."""
    structured_ids: bool
    """The server announced `e1` event IDs at initialize (else IDs are opaque)."""
    server_generation: int | None = None
    """The server's cursor generation, bound by the first structured ID of this session."""


@frozen_record
class ConnectionView:
    """How the HTTP connection that delivered the event was opened (and answered)."""

    conn_id: int
    session_generation: int
    protocol_version: str
    auth_subject: str | None
    answered_protocol_version: str | None = None
    """A `MCP-Protocol-Version` header on the response, if the server sent one."""


@frozen_record
class StreamView:
    """What the client knows of the stream the connection belongs to."""

    stream_key: str
    """The client's own name for the stream: `post:<request-id>` or `get:<n>`."""
    request_id: jsonrpc.JsonRpcId | None
    """The POST's request ID; None for a standalone GET stream."""
    progress_token: jsonrpc.JsonRpcId | None
    operation_key: str | None
    """The logical operation (idempotency key) a response completes; dispatch key."""
    server_stream_id: str | None
    """Expected server stream ID (derived for POST streams, bound for GET streams)."""
    ended: bool = False
    """The response of this stream was already accepted."""


@frozen_record
class DedupKey:
    session_generation: int
    stream_key: str
    event_id: str
    message_digest: str


@frozen_record
class Watermark:
    event_id: str
    sequence: int | None


@frozen_record
class SeenEvent:
    stream_key: str
    message_digest: str


@frozen_record
class InboxReceipt:
    """One accepted event (a row of the inbox). Times in Unix epoch seconds."""

    client_id: str
    key: DedupKey
    sequence: int | None
    server_stream_id: str | None
    kind: str
    """`priming`, or the JSON-RPC kind: request / notification / response / error."""
    jsonrpc_id: str | None
    method: str | None
    conn_id: int
    accepted_at: float
    data: str


@frozen_record
class OutboxDispatch:
    """One business dispatch (a row of the outbox): exactly once per dispatch key."""

    client_id: str
    dispatch_key: str
    key: DedupKey
    kind: str
    created_at: float


class InboxStore(Protocol):
    """Durable inbox + outbox. `commit` writes a receipt and its dispatch atomically."""

    def has(self, key: DedupKey) -> bool: ...
    def seen(self, session_generation: int, event_id: str) -> SeenEvent | None: ...
    def watermark(self, session_generation: int, stream_key: str) -> Watermark | None: ...
    def dispatched(self, dispatch_key: str) -> bool: ...
    def commit(self, receipt: InboxReceipt, dispatch: OutboxDispatch | None) -> None: ...


@frozen_record
class Acceptance:
    """What `accept_stream_event` decided, and what it learned."""

    outcome: Outcome
    event_id: str
    digest: str
    reason: RejectReason | None = None
    detail: str = ""
    message: jsonrpc.Message | None = None
    receipt: InboxReceipt | None = None
    dispatch: OutboxDispatch | None = None
    bound_server_stream_id: str | None = None
    bound_server_generation: int | None = None
    ends_stream: bool = False
    """The accepted message is this stream's response."""

    @property
    def accepted(self) -> bool:
        return self.outcome is Outcome.ACCEPTED


def _reject(event_id: str, digest: str, reason: RejectReason, detail: str) -> Acceptance:
    return Acceptance(Outcome.REJECTED, event_id, digest, reason=reason, detail=detail)


type _Refusal = tuple[RejectReason, str]
"""Why a check refuses an event: the reason and its detail."""


def accept_stream_event(
    store: InboxStore,
    *,
    client_id: str,
    session: SessionView,
    conn: ConnectionView,
    stream: StreamView,
    event: SseEvent,
    event_id: str,
    now: float,
    checks: frozenset[Check] = ALL_CHECKS,
) -> Acceptance:
    """Judge one SSE event and, if it is accepted, commit its receipt and dispatch.

    `event_id` is the event's ID, or a connection-unique synthetic one (starting with `~`)
    when the server sent none. `checks` exists for tests that show what each check stops.

    The checks run here in the order of the module docstring, each a helper that returns
    the reason and detail of a refusal (or None); the first refusal decides. The store is
    read only as far as the checks get, as in one function.
    """
    digest = message_digest(event.data)
    gen = session.generation
    # 1-3: the connection must belong to the current session, version and subject.
    bad = _check_connection(session, conn, checks)
    if bad is not None:
        return _reject(event_id, digest, *bad)
    # 4: the event ID (known scheme); what it names is read even when the check is off.
    parsed, bad = _check_event_id(session, stream, event_id, digest, checks)
    if bad is not None:
        return _reject(event_id, digest, *bad)
    # 5: duplicates are not errors, and not accepted twice.
    key = DedupKey(gen, stream.stream_key, event_id, digest)
    if Check.DUPLICATE in checks and store.has(key):
        return Acceptance(Outcome.DUPLICATE, event_id, digest, detail="dedup key already in the inbox")
    seen = None if event_id.startswith("~") else store.seen(gen, event_id)
    bad = (
        _check_other_stream(seen, stream, checks)  # 6
        or _check_cursor(store, gen, stream, None if parsed is None else parsed.sequence, checks)  # 7
        or _check_digest(seen, digest, checks)  # 8
    )
    if bad is not None:
        return _reject(event_id, digest, *bad)
    # 9-10: the data is JSON-RPC, and correlates with the stream.
    message, bad = _check_message(event, stream, checks)
    if bad is not None:
        return _reject(event_id, digest, *bad)
    return _commit(store, client_id, session, conn, stream, key, parsed, message, event.data, now)


def _check_connection(
    session: SessionView, conn: ConnectionView, checks: frozenset[Check]
) -> _Refusal | None:
    """1-3: the session (generation, active), the protocol version, the token's subject."""
    gen = session.generation
    if Check.SESSION in checks and (not session.active or conn.session_generation != gen):
        return (
            RejectReason.STALE_SESSION,
            f"connection of session generation {conn.session_generation}, current is {gen}"
            + ("" if session.active else " (not active)"),
        )
    if Check.VERSION in checks:
        answered = conn.answered_protocol_version
        if conn.protocol_version != session.protocol_version or (
            answered is not None and answered != session.protocol_version
        ):
            return (
                RejectReason.PROTOCOL_VERSION_MISMATCH,
                f"sent {conn.protocol_version!r}, answered {answered!r}, negotiated {session.protocol_version!r}",
            )
    if Check.SUBJECT in checks and conn.auth_subject != session.auth_subject:
        return RejectReason.SUBJECT_MISMATCH, "token subject is not the session's"
    return None


def _check_event_id(
    session: SessionView, stream: StreamView, event_id: str, digest: str, checks: frozenset[Check]
) -> tuple[ParsedEventId | None, _Refusal | None]:
    """4: a known-scheme ID names this session, server generation and stream, and the
    content it was made for (`digest`, the data's, computed once per event). What it
    names (the parsed ID: sequence, server stream, generation) is returned even when the
    check is off."""
    if not session.structured_ids or event_id.startswith("~"):
        return None, None
    parsed = parse_event_id(event_id)
    if parsed is None:
        return None, (
            RejectReason.MALFORMED_EVENT_ID,
            "not an e1 event ID",
        ) if Check.EVENT_ID in checks else None
    verdict = classify_structured(
        parsed,
        session_tag=session.session_tag or "",
        generation=session.server_generation,
        stream_id=stream.server_stream_id,
        digest=digest,
    )
    reason = _STRUCTURED_REASON.get(verdict)
    if reason is not None and Check.EVENT_ID in checks:
        return parsed, (reason, f"event ID is {verdict}")
    return parsed, None


def _check_other_stream(
    seen: SeenEvent | None, stream: StreamView, checks: frozenset[Check]
) -> _Refusal | None:
    """6: an ID already accepted on another stream of this session."""
    if seen is not None and Check.EVENT_ID in checks and seen.stream_key != stream.stream_key:
        return RejectReason.CROSSED_STREAM, f"event ID was accepted on {seen.stream_key}"
    return None


def _check_cursor(
    store: InboxStore, gen: int, stream: StreamView, sequence: int | None, checks: frozenset[Check]
) -> _Refusal | None:
    """7: the cursor only moves forward by one."""
    if sequence is None or Check.CURSOR not in checks:
        return None
    wm = store.watermark(gen, stream.stream_key)
    if wm is not None and wm.sequence is not None:
        if sequence <= wm.sequence:
            return RejectReason.CURSOR_REGRESSION, f"sequence {sequence} after watermark {wm.sequence}"
        if sequence > wm.sequence + 1:
            return RejectReason.CURSOR_GAP, f"sequence {sequence} skips from {wm.sequence}"
    elif sequence > 1:
        return RejectReason.CURSOR_GAP, f"first event of the stream has sequence {sequence}"
    return None


def _check_digest(seen: SeenEvent | None, digest: str, checks: frozenset[Check]) -> _Refusal | None:
    """8: the same ID never with another content."""
    if seen is not None and Check.DIGEST in checks and seen.message_digest != digest:
        return RejectReason.CONTENT_MISMATCH, "event ID seen before with other content"
    return None


def _check_message(
    event: SseEvent, stream: StreamView, checks: frozenset[Check]
) -> tuple[jsonrpc.Message | None, _Refusal | None]:
    """9: the data is JSON-RPC; 10: correlation. A priming event (no data) carries no
    message, and is refused only after the stream's response."""
    if not event.is_message:
        if Check.CORRELATION in checks and stream.ended:
            return None, (RejectReason.STREAM_ALREADY_ENDED, "event after the response")
        return None, None
    try:
        message = jsonrpc.parse_message(event.data)
    except RemoteProtocolError as e:
        return None, (RejectReason.MALFORMED_MESSAGE, str(e))
    if Check.CORRELATION in checks:
        bad = _correlate(message, stream)
        if bad is not None:
            return message, bad
    return message, None


def _commit(
    store: InboxStore,
    client_id: str,
    session: SessionView,
    conn: ConnectionView,
    stream: StreamView,
    key: DedupKey,
    parsed: ParsedEventId | None,
    message: jsonrpc.Message | None,
    data: str,
    now: float,
) -> Acceptance:
    """The receipt and its dispatch, written in one `commit` (atomic in the store)."""
    server_stream_id = None if parsed is None else parsed.stream_id
    receipt = InboxReceipt(
        client_id=client_id,
        key=key,
        sequence=None if parsed is None else parsed.sequence,
        server_stream_id=server_stream_id,
        kind="priming" if message is None else str(message.kind),
        jsonrpc_id=None if message is None or message.id is None else str(message.id),
        method=None if message is None else message.method,
        conn_id=conn.conn_id,
        accepted_at=now,
        data=data,
    )
    dispatch = None
    if message is not None:
        dkey = _dispatch_key(message, stream, key)
        if not store.dispatched(dkey):
            dispatch = OutboxDispatch(client_id, dkey, key, str(message.kind), now)
    store.commit(receipt, dispatch)
    return Acceptance(
        Outcome.ACCEPTED,
        key.event_id,
        key.message_digest,
        message=message,
        receipt=receipt,
        dispatch=dispatch,
        bound_server_stream_id=server_stream_id if stream.server_stream_id is None else None,
        bound_server_generation=(
            parsed.generation if parsed is not None and session.server_generation is None else None
        ),
        ends_stream=message is not None and message.kind.is_response,
        detail="" if dispatch is not None or message is None else "operation already dispatched",
    )


_STRUCTURED_REASON = {
    CursorVerdict.FOREIGN_SESSION: RejectReason.FOREIGN_SESSION,
    CursorVerdict.OTHER_GENERATION: RejectReason.OTHER_GENERATION,
    CursorVerdict.OTHER_STREAM: RejectReason.CROSSED_STREAM,
    CursorVerdict.TAMPERED: RejectReason.CONTENT_TAMPERED,
}


def _correlate(message: jsonrpc.Message, stream: StreamView) -> tuple[RejectReason, str] | None:
    if stream.ended:
        return RejectReason.STREAM_ALREADY_ENDED, "message after the response"
    if message.kind.is_response:
        if stream.request_id is None:
            return RejectReason.RESPONSE_ON_STANDALONE_STREAM, "a GET stream carries no response"
        if message.id != stream.request_id:
            return (
                RejectReason.RESPONSE_ID_MISMATCH,
                f"response to {message.id!r} on the stream of {stream.request_id!r}",
            )
    elif message.method == jsonrpc.PROGRESS:
        token = message.progress_token
        if stream.progress_token is None or token != stream.progress_token:
            return RejectReason.PROGRESS_TOKEN_MISMATCH, f"progress token {token!r} is not this stream's"
    return None


def _dispatch_key(message: jsonrpc.Message, stream: StreamView, key: DedupKey) -> str:
    if message.kind.is_response and stream.operation_key is not None:
        return f"op:{stream.operation_key}"
    return f"ev:{key.session_generation}:{key.stream_key}:{key.event_id}"
