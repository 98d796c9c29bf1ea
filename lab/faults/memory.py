"""The proxy's bounded memory of recent events, event IDs and session tokens (pure).

The crossing, foreign, replay, Last-Event-ID and old-token faults draw from it. It holds
raw tokens and payloads in memory only; nothing of it is written anywhere.
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from typing import NamedTuple

from lab.faults.decisions import Decision
from lab.faults.facts import stream_of


class Remembered(NamedTuple):
    """An event as the server sent it, with where it came from (a tuple: made per event)."""

    flow: str
    idx: int
    """Its index among the events of its flow (the tap's `index` of its `sent` record)."""
    session: str | None
    stream: str
    event_id: str | None
    data: str
    digest: str
    event: str | None


class Memory:
    """Bounded memory of recent events per (session, stream), event IDs, and session tokens.

    A pipe asks once per stream for its queue (`queue`) and then appends to it directly:
    remembering an event costs one deque append, since it happens for every event.
    """

    def __init__(
        self,
        *,
        sessions: int = 2048,
        streams: int = 8,
        depth: int = 16,
        pool: int = 64,
        ids: int = 65536,
        tokens: int = 1024,
    ) -> None:
        self._max_sessions, self._max_streams, self._depth = sessions, streams, depth
        self._sessions: OrderedDict[str, OrderedDict[str, deque[Remembered]]] = OrderedDict()
        self._recent: deque[deque[Remembered]] = deque(maxlen=pool)
        """Queues of the most recently opened streams, of any session (for other_session)."""
        self._max_ids = ids
        self._ids: OrderedDict[str, str] = OrderedDict()
        self._max_tokens = tokens
        self._tokens: OrderedDict[str, str] = OrderedDict()

    def queue(self, session: str | None, stream: str) -> deque[Remembered]:
        """The queue of recent events of (session, stream), created if needed."""
        skey = session or ""
        streams = self._sessions.get(skey)
        if streams is None:
            streams = self._sessions[skey] = OrderedDict()
            if len(self._sessions) > self._max_sessions:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(skey)
        q = streams.get(stream)
        if q is None:
            q = streams[stream] = deque(maxlen=self._depth)
            if len(streams) > self._max_streams:
                streams.popitem(last=False)
            self._recent.append(q)
        else:
            streams.move_to_end(stream)
        return q

    def remember(self, r: Remembered) -> None:
        self.queue(r.session, r.stream).append(r)
        if r.event_id is not None and stream_of(r.event_id) is None:
            self.note_id(r.event_id, r.stream)

    def note_id(self, event_id: str, stream: str) -> None:
        """Remember where an opaque (not `e1`) ID was seen, for resumptions that cite it."""
        self._ids[event_id] = stream
        if len(self._ids) > self._max_ids:
            self._ids.popitem(last=False)

    def stream_of_id(self, event_id: str) -> str | None:
        """The stream an ID was seen on (the `e1` stream ID when the ID says it)."""
        return stream_of(event_id) or self._ids.get(event_id)

    def recent(self, session: str | None, stream: str, depth: int) -> list[Remembered]:
        """Up to `depth` most recent events of that stream, oldest first."""
        streams = self._sessions.get(session or "")
        q = streams.get(stream) if streams is not None else None
        return list(q)[-depth:] if q else []

    def other_stream(self, session: str | None, stream: str, d: Decision) -> Remembered | None:
        """A recent event with an ID from another stream of the same session."""
        streams = self._sessions.get(session) if session is not None else None
        if streams is None:
            return None
        cands = [q[-1] for key, q in streams.items() if key != stream and q and q[-1].event_id is not None]
        return cands[d.pick(len(cands))] if cands else None

    def other_session(self, session: str | None, d: Decision) -> Remembered | None:
        """A recent event with an ID from another session."""
        cands = [q[-1] for q in self._recent if q and q[-1].session != session and q[-1].event_id is not None]
        return cands[d.pick(len(cands))] if cands else None

    def other_request(self, stream: str, request_id: object, d: Decision) -> Remembered | None:
        """Without sessions (the modern era, where events carry no IDs): the latest message
        of another request's stream that names its request (its `id`, or its progress
        token) and does not name `request_id`. Only such a message can be told foreign by a
        client: a log message names no request, and request IDs are each client's own (so
        another client's message for the same ID is no different from its own)."""
        cands = [q[-1] for q in self._recent if q and q[-1].session is None and q[-1].stream != stream]
        if not cands:
            return None
        start = d.pick(len(cands))
        for i in range(len(cands)):
            got = cands[(start + i) % len(cands)]
            named = _request_named(got.data)
            if named is not None and named != request_id:
                return got
        return None

    def remember_token(self, session: str, token: str) -> None:
        self._tokens[session] = token
        self._tokens.move_to_end(session)
        if len(self._tokens) > self._max_tokens:
            self._tokens.popitem(last=False)

    def other_token(self, session: str | None, token: str | None, d: Decision) -> str | None:
        """A token an earlier, other session was opened with, different from `token`."""
        cands = [t for s, t in reversed(self._tokens.items()) if s != session and t != token][:16]
        return cands[d.pick(len(cands))] if cands else None


def _request_named(data: str) -> object:
    """The request the message `data` answers (`id`) or reports progress of (its progress
    token); None if it names none."""
    try:
        msg = json.loads(data)
    except ValueError:
        return None
    if not isinstance(msg, dict):
        return None
    params = msg.get("params")
    token = params.get("progressToken") if isinstance(params, dict) else None
    return msg.get("id", token)
