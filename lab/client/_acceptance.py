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

Checks are pure; the store is the only effect, and an in-memory store (`MemoryInbox`) and
a durable SQLite one (`lab.inbox.SqliteInbox`) implement the same protocol.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class ConnectionView:
    """How the HTTP connection that delivered the event was opened (and answered)."""

    conn_id: int
    session_generation: int
    protocol_version: str
    auth_subject: str | None
    answered_protocol_version: str | None = None
    """A `MCP-Protocol-Version` header on the response, if the server sent one."""


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class DedupKey:
    session_generation: int
    stream_key: str
    event_id: str
    message_digest: str


@dataclass(frozen=True, slots=True)
class Watermark:
    event_id: str
    sequence: int | None


@dataclass(frozen=True, slots=True)
class SeenEvent:
    stream_key: str
    message_digest: str


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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


@dataclass(slots=True)
class _Verdicts:
    parsed: ParsedEventId | None = None
    sequence: int | None = None
    server_stream_id: str | None = None
    server_generation: int | None = None


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
    """
    data = event.data
    digest = message_digest(data)
    gen = session.generation

    # 1-3: the connection must belong to the current session, version and subject.
    if Check.SESSION in checks and (not session.active or conn.session_generation != gen):
        return _reject(
            event_id,
            digest,
            RejectReason.STALE_SESSION,
            f"connection of session generation {conn.session_generation}, current is {gen}"
            + ("" if session.active else " (not active)"),
        )
    if Check.VERSION in checks:
        answered = conn.answered_protocol_version
        if conn.protocol_version != session.protocol_version or (
            answered is not None and answered != session.protocol_version
        ):
            return _reject(
                event_id,
                digest,
                RejectReason.PROTOCOL_VERSION_MISMATCH,
                f"sent {conn.protocol_version!r}, answered {answered!r}, negotiated {session.protocol_version!r}",
            )
    if Check.SUBJECT in checks and conn.auth_subject != session.auth_subject:
        return _reject(event_id, digest, RejectReason.SUBJECT_MISMATCH, "token subject is not the session's")

    # 4: the event ID (known scheme).
    v = _Verdicts()
    synthetic = event_id.startswith("~")
    if session.structured_ids and not synthetic:
        v.parsed = parse_event_id(event_id)
        if v.parsed is None:
            if Check.EVENT_ID in checks:
                return _reject(event_id, digest, RejectReason.MALFORMED_EVENT_ID, "not an e1 event ID")
        else:
            v.sequence = v.parsed.sequence
            v.server_stream_id = v.parsed.stream_id
            v.server_generation = v.parsed.generation
            verdict = classify_structured(
                v.parsed,
                session_tag=session.session_tag or "",
                generation=session.server_generation,
                stream_id=stream.server_stream_id,
                data=data,
            )
            reason = _STRUCTURED_REASON.get(verdict)
            if reason is not None and Check.EVENT_ID in checks:
                return _reject(event_id, digest, reason, f"event ID is {verdict}")

    # 5: duplicates are not errors, and not accepted twice.
    key = DedupKey(gen, stream.stream_key, event_id, digest)
    if Check.DUPLICATE in checks and store.has(key):
        return Acceptance(Outcome.DUPLICATE, event_id, digest, detail="dedup key already in the inbox")

    # 6: an ID already accepted on another stream of this session.
    seen = None if synthetic else store.seen(gen, event_id)
    if seen is not None and Check.EVENT_ID in checks and seen.stream_key != stream.stream_key:
        return _reject(
            event_id, digest, RejectReason.CROSSED_STREAM, f"event ID was accepted on {seen.stream_key}"
        )

    # 7: the cursor only moves forward by one.
    if v.sequence is not None and Check.CURSOR in checks:
        wm = store.watermark(gen, stream.stream_key)
        if wm is not None and wm.sequence is not None:
            if v.sequence <= wm.sequence:
                return _reject(
                    event_id,
                    digest,
                    RejectReason.CURSOR_REGRESSION,
                    f"sequence {v.sequence} after watermark {wm.sequence}",
                )
            if v.sequence > wm.sequence + 1:
                return _reject(
                    event_id,
                    digest,
                    RejectReason.CURSOR_GAP,
                    f"sequence {v.sequence} skips from {wm.sequence}",
                )
        elif v.sequence > 1:
            return _reject(
                event_id,
                digest,
                RejectReason.CURSOR_GAP,
                f"first event of the stream has sequence {v.sequence}",
            )

    # 8: the same ID never with another content.
    if seen is not None and Check.DIGEST in checks and seen.message_digest != digest:
        return _reject(
            event_id, digest, RejectReason.CONTENT_MISMATCH, "event ID seen before with other content"
        )

    message: jsonrpc.Message | None = None
    ends_stream = False
    if event.is_message:
        # 9: the data is JSON-RPC.
        try:
            message = jsonrpc.parse_message(data)
        except RemoteProtocolError as e:
            return _reject(event_id, digest, RejectReason.MALFORMED_MESSAGE, str(e))
        # 10: correlation.
        if Check.CORRELATION in checks:
            bad = _correlate(message, stream)
            if bad is not None:
                return _reject(event_id, digest, bad[0], bad[1])
        ends_stream = message.kind.is_response
    elif Check.CORRELATION in checks and stream.ended:
        return _reject(event_id, digest, RejectReason.STREAM_ALREADY_ENDED, "event after the response")

    receipt = InboxReceipt(
        client_id=client_id,
        key=key,
        sequence=v.sequence,
        server_stream_id=v.server_stream_id,
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
        event_id,
        digest,
        message=message,
        receipt=receipt,
        dispatch=dispatch,
        bound_server_stream_id=v.server_stream_id if stream.server_stream_id is None else None,
        bound_server_generation=v.server_generation if session.server_generation is None else None,
        ends_stream=ends_stream,
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


class MemoryInbox:
    """An in-memory `InboxStore` with the same semantics as the SQLite one (for unit tests
    and the model-based tests; it is not durable)."""

    def __init__(self, *, enforce_unique: bool = True) -> None:
        """`enforce_unique=False` drops the store's own uniqueness guard (the SQLite
        constraints), so a test can show what the acceptance checks alone prevent."""
        self.enforce_unique = enforce_unique
        self.receipts: list[InboxReceipt] = []
        self.dispatches: list[OutboxDispatch] = []
        self._keys: set[DedupKey] = set()
        self._seen: dict[tuple[int, str], SeenEvent] = {}
        self._wm: dict[tuple[int, str], Watermark] = {}
        self._dkeys: set[str] = set()

    def has(self, key: DedupKey) -> bool:
        return key in self._keys

    def seen(self, session_generation: int, event_id: str) -> SeenEvent | None:
        return self._seen.get((session_generation, event_id))

    def watermark(self, session_generation: int, stream_key: str) -> Watermark | None:
        return self._wm.get((session_generation, stream_key))

    def dispatched(self, dispatch_key: str) -> bool:
        return dispatch_key in self._dkeys

    def commit(self, receipt: InboxReceipt, dispatch: OutboxDispatch | None) -> None:
        k = receipt.key
        dup = k in self._keys or (dispatch is not None and dispatch.dispatch_key in self._dkeys)
        if dup and self.enforce_unique:
            raise ValueError(f"duplicate commit of {k}")  # the SQLite store's UNIQUE constraints
        self._keys.add(k)
        self.receipts.append(receipt)
        if not k.event_id.startswith("~"):
            self._seen.setdefault(
                (k.session_generation, k.event_id), SeenEvent(k.stream_key, k.message_digest)
            )
            self._wm[(k.session_generation, k.stream_key)] = Watermark(k.event_id, receipt.sequence)
        if dispatch is not None:
            self._dkeys.add(dispatch.dispatch_key)
            self.dispatches.append(dispatch)
