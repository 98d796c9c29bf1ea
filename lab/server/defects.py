"""Deliberate misbehaviours of the reference server (`lab serve --defect NAME`, repeatable).

Each one copies a mistake real MCP servers make, so that the lab can prove that the
checker catches it: a detector that has never been seen to fire is not a detector. Each
is small and isolated: one flag, checked at the one place whose behaviour it changes
(the comment there names it). Without `--defect` the server follows every rule.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import Protocol


class Defect(enum.StrEnum):
    SHARED_EVENT_STORE = "shared-event-store"
    REPLAY_OTHER_STREAMS = "replay-other-streams"
    REPLAY_FROM_START = "replay-from-start"
    UNKNOWN_CURSOR_SILENT = "unknown-cursor-silent"
    REPLAY_MISORDERED = "replay-misordered"
    NO_IDEMPOTENCY = "no-idempotency"
    ANY_ORIGIN = "any-origin"
    UNKNOWN_SESSION_400 = "unknown-session-400"
    RESPONSE_ON_GET = "response-on-get"
    NO_PRIMING = "no-priming"
    NO_RETRY_FIELD = "no-retry-field"
    DELETED_SESSION_ALIVE = "deleted-session-alive"
    SLOW_RESUME = "slow-resume"
    BROADCAST = "broadcast"
    RESUME_FORGET = "resume-forget"
    RESUME_EMPTY = "resume-empty"
    SERVE_WITHOUT_SESSION = "serve-without-session"
    UNDECLARED_CAPABILITY = "undeclared-capability"
    PER_STREAM_IDS = "per-stream-ids"
    MODERN_HEADERS_UNCHECKED = "modern-headers-unchecked"
    MODERN_MINTS_SESSION = "modern-mints-session"
    MODERN_NO_IDEMPOTENCY = "modern-no-idempotency"
    MODERN_SENDS_AFTER_CLOSE = "modern-sends-after-close"
    STALLS_AT_CAPACITY = "stalls-at-capacity"


SLOW_RESUME_S = 6.0
"""How long the defect `slow-resume` holds a resumption's replay back (s)."""
STALL_SESSIONS = 20
"""The defect `stalls-at-capacity`: past this many live sessions, requests go unanswered."""

DESCRIPTIONS: dict[Defect, str] = {
    Defect.SHARED_EVENT_STORE: (
        "one event store for all sessions, streams keyed by the JSON-RPC request id (and one "
        "constant key for every standalone GET): a resumption replays what other sessions' "
        "streams with the same key sent after the cursor"
    ),
    Defect.REPLAY_OTHER_STREAMS: (
        "a resumption also replays the events the session's other streams sent after the cursor"
    ),
    Defect.REPLAY_FROM_START: "a resumption ignores the cursor and replays the stream from its start",
    Defect.UNKNOWN_CURSOR_SILENT: (
        "a Last-Event-ID the server cannot honour gets 200 and a stream that never carries an event"
    ),
    Defect.REPLAY_MISORDERED: "a resumption replays the response before the progress that preceded it",
    Defect.NO_IDEMPOTENCY: "ledger.append performs the write again for a repeated idempotency key",
    Defect.ANY_ORIGIN: "no Origin check: an illegal Origin is served",
    Defect.UNKNOWN_SESSION_400: "an unknown, expired or deleted session gets 400 instead of 404",
    Defect.RESPONSE_ON_GET: ("every JSON-RPC response is also sent on the session's standalone GET stream"),
    Defect.NO_PRIMING: "streams start without the priming event (an event ID and empty data)",
    Defect.NO_RETRY_FIELD: "a server-initiated close (ticker close_after) sends no `retry` field first",
    Defect.DELETED_SESSION_ALIVE: "DELETE answers 200 but the session keeps working",
    Defect.STALLS_AT_CAPACITY: (
        f"past {STALL_SESSIONS} live sessions (its capacity) the server takes every request of a "
        "session and never answers it, as a server whose workers are all busy: what a capacity check "
        "must catch"
    ),
    Defect.SLOW_RESUME: (
        f"a resumption is answered at once but replays nothing for {SLOW_RESUME_S:g} s "
        "(longer than the default resume budget of 5 s): the target's own share of every recovery"
    ),
    Defect.BROADCAST: (
        "every progress notification is also sent, under a new event ID, on the session's "
        "standalone GET stream (one message on two streams)"
    ),
    Defect.RESUME_FORGET: (
        "a resumption on a known cursor is answered 200 and replays nothing: what the stream "
        "sent after the cursor is forgotten (a live stream goes on with its new events; a "
        "finished one closes at once)"
    ),
    Defect.RESUME_EMPTY: (
        "a resumption on a known cursor is answered 200 with a fresh priming event and closed, "
        "replaying nothing"
    ),
    Defect.SERVE_WITHOUT_SESSION: (
        "a request without MCP-Session-Id after the handshake is served (on the token subject's "
        "latest session) instead of refused with 400"
    ),
    Defect.UNDECLARED_CAPABILITY: (
        "each write also sends notifications/resources/updated on its stream, though the "
        "server declares no `resources` capability"
    ),
    Defect.PER_STREAM_IDS: (
        "event IDs are counted per stream (0, 1, ... on every stream of a session), and a "
        "cursor is looked up as the first stream that sent that ID: a resumption of one "
        "stream can replay another's events"
    ),
    Defect.MODERN_HEADERS_UNCHECKED: (
        "in the modern era (2026-07-28), Mcp-Method and Mcp-Name are not compared with the body: "
        "a request whose headers the body contradicts is served"
    ),
    Defect.MODERN_MINTS_SESSION: (
        "in the modern era (2026-07-28), every answer carries a fresh Mcp-Session-Id, as a "
        "handshake-era server would"
    ),
    Defect.MODERN_NO_IDEMPOTENCY: (
        "in the modern era (2026-07-28) only, ledger.append ignores the idempotency key: a write "
        "re-issued after a broken stream is performed again (the handshake era's path keeps its "
        "receipts: a server whose modern path breaks what its handshake path does right)"
    ),
    Defect.MODERN_SENDS_AFTER_CLOSE: (
        "in the modern era (2026-07-28), a call whose response stream closed before its answer is "
        "not cancelled: it runs on, and its later messages (progress, the answer) go out on another "
        "open response of the same token subject (a dual-era server routing the modern era's "
        "messages as its handshake path routes a session's)"
    ),
}

DEFECT_NAMES: tuple[str, ...] = tuple(d.value for d in Defect)


def help_text() -> str:
    """The defect list as `lab serve --help` shows it."""
    return "\n".join(f"  {d.value}: {DESCRIPTIONS[d]}" for d in Defect)


class Event(Protocol):
    @property
    def event_id(self) -> str | None: ...


class SharedEventStore[E: Event]:
    """The defect `shared-event-store`: events of every session under one key space, as
    SDK examples do that name a stream after its JSON-RPC request id. Bounded like the
    honest store (`retention` events per key)."""

    STANDALONE = "standalone"

    def __init__(self, retention: int) -> None:
        self._retention = retention
        self._streams: dict[str, deque[E]] = {}
        self._home: dict[str, str] = {}

    @staticmethod
    def key(request_id: object | None) -> str:
        return SharedEventStore.STANDALONE if request_id is None else f"request:{request_id!r}"

    def add(self, key: str, ev: E) -> None:
        if ev.event_id is None:
            return
        q = self._streams.setdefault(key, deque())
        q.append(ev)
        self._home[ev.event_id] = key
        if len(q) > self._retention:
            old = q.popleft()
            if old.event_id is not None:
                self._home.pop(old.event_id, None)

    def after(self, cursor: str) -> tuple[str, list[E]] | None:
        """The key the cursor was filed under and every event stored there after it
        (whichever session sent them); None if the cursor is unknown."""
        key = self._home.get(cursor)
        if key is None:
            return None
        q = self._streams[key]
        for i, ev in enumerate(q):
            if ev.event_id == cursor:
                return key, list(q)[i + 1 :]
        return None
