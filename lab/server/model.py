"""What the reference server holds in memory: sessions, their streams, stored events, and
the live connections that carry a stream. Plain records; `ServerState` (state.py) owns
every change to them.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from lab.wire import jsonrpc

EVENT_OVERHEAD = 256
"""Bytes counted per stored event besides its wire form (its record, ID and digest): the
unit of `max_session_event_bytes` is the event as sent plus this."""


@dataclass(slots=True)
class StoredEvent:
    seq: int
    """Position in its stream, from 0."""
    order: int
    """Position among every event the server emitted (server-wide, increasing)."""
    event_id: str | None
    wire: bytes
    digest: str
    kind: str
    jsonrpc_id: str | None

    @property
    def cost(self) -> int:
        return len(self.wire) + EVENT_OVERHEAD


class LiveConn:
    """One HTTP response streaming one stream: a buffer the connection task drains.

    A connection whose unsent backlog grows past `limit` bytes (a client that does not
    read) is ended with reason `slow_consumer`: the stream goes on, and the client may
    resume it from its cursor."""

    __slots__ = (
        "close_after",
        "conn",
        "end_reason",
        "ended",
        "limit",
        "pending",
        "pending_bytes",
        "retry_ms",
        "sent",
        "wake",
    )

    def __init__(self, conn: str | None, limit: int) -> None:
        self.conn = conn
        self.limit = limit
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self.wake = asyncio.Event()
        self.ended = False
        self.end_reason = ""
        self.sent = 0
        self.close_after: int | None = None
        self.retry_ms: int | None = None

    def push(self, wire: bytes, counts: bool = True) -> None:
        if self.ended:
            return
        self.pending.append(wire)
        self.pending_bytes += len(wire)
        if counts:
            self.sent += 1
        self.wake.set()
        if self.pending_bytes > self.limit:
            self.pending.clear()
            self.pending_bytes = 0
            self.end("slow_consumer")

    def end(self, reason: str) -> None:
        if not self.ended:
            self.ended = True
            self.end_reason = reason
            self.wake.set()

    def take(self) -> bytes:
        data = b"".join(self.pending)
        self.pending.clear()
        self.pending_bytes = 0
        self.wake.clear()
        return data


@dataclass(eq=False, slots=True)
class Stream:
    session: Session
    stream_id: str
    opened_by: str
    request_id: jsonrpc.JsonRpcId | None
    resumable: bool
    generation: int
    opened_at: float
    close_after: int | None = None
    retry_ms: int | None = None
    events: deque[StoredEvent] = field(default_factory=deque)
    next_seq: int = 0
    complete: bool = False
    subscriber: LiveConn | None = None
    last_acked: str | None = None
    closed_at: float | None = None
    close_reason: str | None = None
    task: asyncio.Task[None] | None = None

    @property
    def last_sent(self) -> str | None:
        return self.events[-1].event_id if self.events else None

    @property
    def first_seq(self) -> int:
        """Sequence of the oldest event still retained (`next_seq` when none is)."""
        return self.events[0].seq if self.events else self.next_seq

    @property
    def busy(self) -> bool:
        """A client is connected to it, or its tool is still running."""
        return self.subscriber is not None or (self.task is not None and not self.task.done())


@dataclass(eq=False, slots=True)
class Session:
    sid: str
    pseudonym: str
    tag: str
    subject: str | None
    version: str
    generation: int
    created_at: float
    last_seen: float
    resumable: bool
    alive: bool = True
    end_reason: str | None = None
    streams: dict[str, Stream] = field(default_factory=dict)
    request_ids: set[jsonrpc.JsonRpcId] = field(default_factory=set)
    gets: int = 0
    standalone: Stream | None = None
    open_streams: int = 0
    """Streams of this session not closed yet (bounded by `max_session_streams`)."""
    retained: int = 0
    """Cost of the events its streams retain (bounded by `max_session_event_bytes`)."""
    cursors: dict[str, tuple[Stream, int]] = field(default_factory=dict)
    """Opaque event ID -> (stream, sequence): where an opaque cursor points (empty for `e1`)."""
    log_level: str | None = None
    """Set by `logging/setLevel`; None: every level is sent."""

    @property
    def busy(self) -> bool:
        return any(st.busy for st in self.streams.values())
