"""How the reference server names its events, and finds a cursor's place again
(`lab serve --event-ids e1|seq|uuid`).

- `e1` (default): structured, MAC'd IDs (lab.wire.event_ids). The ID itself names its
  session, generation, stream and sequence, so the server needs no index, and it can say
  precisely why a cursor is refused (tampered, foreign_session, evicted, ...).
- `seq`: server-wide sequential integers ("1", "2", ...), as many servers send.
- `uuid`: a random UUID per event.

The last two are opaque: the ID says nothing, so each session keeps an index from ID to
(stream, sequence), trimmed together with the events it points at. A cursor the index
does not hold is `unknown_cursor`. Resumption works the same either way: the cursor picks
the stream, and only that stream is replayed, from after the cursor.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Container
from typing import Protocol

from lab.server.model import Session, StoredEvent, Stream
from lab.wire.event_ids import DIGEST_PREFIX_LEN, CursorVerdict, EventIdCodec

UNKNOWN_CURSOR = "unknown_cursor"


class EventNaming(Protocol):
    scheme: str

    def mint(self, st: Stream, seq: int, order: int, digest: str) -> str: ...

    def remember(self, st: Stream, ev: StoredEvent) -> None: ...

    def forget(self, s: Session, ev: StoredEvent) -> None: ...

    def locate(self, s: Session, cursor: str, generations: Container[int]) -> tuple[str, Stream | None, int]:
        """(verdict, stream, sequence) of `cursor` in session `s`; stream None if refused."""
        ...


class E1Naming:
    scheme = "e1"

    def __init__(self, key: bytes) -> None:
        self.codec = EventIdCodec(key or secrets.token_bytes(32))

    def mint(self, st: Stream, seq: int, order: int, digest: str) -> str:
        return self.codec.mint(st.session.tag, st.generation, st.stream_id, seq, "", digest=digest)

    def remember(self, st: Stream, ev: StoredEvent) -> None:
        pass  # the ID names its place

    def forget(self, s: Session, ev: StoredEvent) -> None:
        pass

    def locate(self, s: Session, cursor: str, generations: Container[int]) -> tuple[str, Stream | None, int]:
        verdict, parsed = self.codec.classify(cursor, session_tag=s.tag, generations=generations)
        if verdict is not CursorVerdict.VALID or parsed is None:
            return str(verdict), None, -1
        st = s.streams.get(parsed.stream_id)
        if st is None:
            return "unknown_stream", None, -1
        if not st.resumable:
            return "not_resumable", None, -1
        if parsed.sequence < st.first_seq - 1:
            return "evicted", None, -1
        if parsed.sequence >= st.next_seq:
            return str(CursorVerdict.TAMPERED), None, -1
        held = parsed.sequence - st.first_seq
        if 0 <= held < len(st.events) and st.events[held].digest[:DIGEST_PREFIX_LEN] != parsed.digest_prefix:
            # An ID with this place but other content: never so within one process; after a
            # restart whose store lost its last batch (lab serve --store), the place may
            # hold an event minted since, and the client's cursor names one it lost.
            return str(CursorVerdict.TAMPERED), None, -1
        return str(CursorVerdict.VALID), st, parsed.sequence


class _OpaqueNaming:
    scheme = ""

    def mint(self, st: Stream, seq: int, order: int, digest: str) -> str:
        raise NotImplementedError

    def remember(self, st: Stream, ev: StoredEvent) -> None:
        if ev.event_id is not None:
            st.session.cursors[ev.event_id] = (st, ev.seq)

    def forget(self, s: Session, ev: StoredEvent) -> None:
        if ev.event_id is not None:
            s.cursors.pop(ev.event_id, None)

    def locate(self, s: Session, cursor: str, generations: Container[int]) -> tuple[str, Stream | None, int]:
        place = s.cursors.get(cursor)
        if place is None:
            return UNKNOWN_CURSOR, None, -1
        st, seq = place
        if s.streams.get(st.stream_id) is not st:
            return "unknown_stream", None, -1
        if st.generation not in generations:
            return str(CursorVerdict.OTHER_GENERATION), None, -1
        return str(CursorVerdict.VALID), st, seq


class SequentialNaming(_OpaqueNaming):
    """Server-wide sequential integers: the server's emission order, as text."""

    scheme = "seq"

    def mint(self, st: Stream, seq: int, order: int, digest: str) -> str:
        return str(order)


class PerStreamNaming(_OpaqueNaming):
    """The defect `per-stream-ids`: each stream counts its own events ("0", "1", ... on
    every stream, as a server that keeps one counter per stream does), so one ID names
    several streams of a session, and a cursor is looked up as "the first stream that
    sent that ID" (the mistake that comes with it)."""

    scheme = "per-stream"

    def mint(self, st: Stream, seq: int, order: int, digest: str) -> str:
        return str(seq)

    def remember(self, st: Stream, ev: StoredEvent) -> None:
        if ev.event_id is not None:
            st.session.cursors.setdefault(ev.event_id, (st, ev.seq))

    def forget(self, s: Session, ev: StoredEvent) -> None:
        place = s.cursors.get(ev.event_id) if ev.event_id is not None else None
        if place is not None and place[1] == ev.seq and ev.event_id is not None:
            s.cursors.pop(ev.event_id, None)


class UuidNaming(_OpaqueNaming):
    scheme = "uuid"

    def mint(self, st: Stream, seq: int, order: int, digest: str) -> str:
        return str(uuid.uuid4())


def naming(scheme: str, key: bytes) -> EventNaming:
    if scheme == "e1":
        return E1Naming(key)
    if scheme == "seq":
        return SequentialNaming()
    if scheme == "uuid":
        return UuidNaming()
    raise ValueError(f"unknown event ID scheme {scheme!r}")
