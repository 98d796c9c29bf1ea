"""The session's streams as records: made, their connection closed, and the deadlines by
which the silent ones count as lost.

A tool call opens its stream and ends it; what comes on a stream, and what happens when
one is lost, is `_streams`. Both need these few operations, so they live a layer below
both (`_calls` under `_streams`, not beside it): neither part has to call the other to
open, watch or close a stream.
"""

from __future__ import annotations

from collections.abc import Iterator

from lab.client._client_state import ClientState
from lab.client._http import Connections
from lab.client._model import Call, Conn, Stream
from lab.client._states import Machine, Role, Trigger


class StreamTable:
    __slots__ = ("_watched", "http", "state")

    def __init__(self, state: ClientState, http: Connections) -> None:
        self.state = state
        self.http = http
        self._watched: dict[str, tuple[float, str]] = {}
        """Call streams that must deliver a message by a deadline: key -> (deadline, cause)."""

    def new_stream(self, conn: Conn, request_id: int | None, call: Call | None, sid: str | None) -> Stream:
        assert conn.stream_key is not None
        st = Stream(
            conn.stream_key, Machine(Role.STREAM), self.state.generation, request_id, call, sid, conn.conn_id
        )
        self.state.streams[st.key] = st
        return st

    def close_conn(self, st: Stream, now: float, reason: str) -> None:
        self.unwatch(st.key)
        conn_id, st.conn_id = st.conn_id, None
        self.http.abort_id(conn_id, now, reason)

    def abandon_all(self, now: float, reason: str) -> None:
        """The client leaves or stops: it stops reading every stream."""
        for st in list(self.state.streams.values()):
            if st.machine.can(Trigger.ABANDONED):
                st.machine.process(Trigger.ABANDONED)
            self.close_conn(st, now, reason)

    # ------------------------------------------------------------------ silent streams

    def watch(self, st: Stream, deadline: float, cause: str) -> None:
        self._watched[st.key] = (deadline, cause)

    def unwatch(self, key: str | None) -> None:
        if key is not None:
            self._watched.pop(key, None)

    def next_deadline(self) -> float | None:
        if not self._watched:
            return None
        return min((t for t, _ in self._watched.values()), default=None)

    def due(self, now: float) -> Iterator[tuple[str, str]]:
        """(key, cause) of each stream whose deadline has come, no longer watched. Lazy on
        purpose: what the caller does with one stream (a loss, a fallback) may change the
        watch of the next, and each is taken off only when its turn comes."""
        for key, (deadline, cause) in list(self._watched.items()):
            if deadline > now:
                continue
            del self._watched[key]
            yield key, cause
