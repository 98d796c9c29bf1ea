"""The tap's SSE pipe: what the server sent, what the client got, and the faults between (pure).

`SsePipe.feed(chunk) -> bytes` is what the tap addon hands mitmproxy as
`flow.response.stream`: bytes of the server's SSE response go in, in any chunking; they
are decoded into events (`lab.wire.sse.SseDecoder`), every event is recorded as *sent*
(before any fault), a write call's answer also as a `result`, the flow's event faults
(`lab.faults.events.EventFaults`, when the fault addon gave any) say what happens to it,
and what goes on to the client is re-encoded (`encode_event`) and recorded as
*forwarded* (or *dropped*). A chunk that carried only comments (keep-alives) is passed on
as one empty comment, so idle streams stay alive through the proxy.

Two shortcuts, both giving the client the same events and the checker the same records:
a chunk of whole events that no fault can touch (no event-level rule is due on any of
them, nothing armed: `EventFaults.quiet`; each is still remembered where the plan needs
it) is passed on as it came, not re-encoded; and an event forwarded untouched at once
gets no `forwarded` record of its own, its `sent` record carries `"fwd": <forwarded
index>` instead (docs/ledgers.md).

Records go to a list the caller drains (per-event ones as ready JSON text: they are the
hot path, see `as_record`). Nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from hashlib import sha256
from typing import Any, Final, Protocol

from lab.faults.events import EventFaults, EventOutcome
from lab.faults.kinds.base import Fired
from lab.faults.memory import Remembered
from lab.wire.capabilities import gated_method
from lab.wire.event_ids import parse_event_id
from lab.wire.sse import SseDecoder, SseEvent, encode_event

type Record = str | dict[str, Any]
"""A tap record: a dict, or (per-event records, the hot path) its JSON text."""


class MessageWatch(Protocol):
    """Looks at each message the server sent on a flow and gives the records it makes of
    it (lab.faults.results.ResultWatch: write answers; lab.faults.declarations
    .InitializeWatch: an initialize's declarations)."""

    def records(self, data: str, t: float, index: int | None = None) -> list[dict[str, Any]]: ...


KEEPALIVE: Final = b":\n\n"

MAX_EVENT_CHARS: Final = 32 * 1024 * 1024
"""The most of one unfinished SSE event the pipe holds (characters: its data lines and
its unfinished line). Past it the pipe gives the stream up: an `oversize` record, nothing
more decoded or forwarded, and the caller closes the client's connection. Above the lab
client's own bound (16 MiB, `ClientConfig.max_message_bytes`), which acts first on a lab
client: this one keeps the proxy's memory whatever the client (a target that sends a
100 MB event must not take mitmdump's)."""

_SAFE = re.compile(r"[A-Za-z0-9_.:#/+=@~-]*")


def js(value: str | None) -> str:
    """A JSON string literal (or null), skipping json.dumps for the common safe strings."""
    if value is None:
        return "null"
    if _SAFE.fullmatch(value):
        return f'"{value}"'
    return json.dumps(value)


def as_record(r: Record) -> dict[str, Any]:
    """A record as a dict (the pipe writes its per-event records pre-serialized)."""
    return json.loads(r) if isinstance(r, str) else r


def reencode(ev: SseEvent, event_id: str | None) -> bytes:
    """`encode_event` of the decoded event under `event_id`, with a fast path for the usual
    shape (one data line, no event type, no retry) that gives the same bytes."""
    data = ev.data
    if ev.event is None and ev.retry is None and ev.has_data and data and "\n" not in data:
        if event_id is None:
            return f"data: {data}\n\n".encode()
        return f"id: {event_id}\ndata: {data}\n\n".encode()
    return encode_event(data if ev.has_data else None, id=event_id, event=ev.event, retry=ev.retry)


class SsePipe:
    """One SSE response: `feed(chunk) -> bytes to forward`; `feed(b"")` at the end.

    After a cut (`cut` is set), the caller closes the client connection once the returned
    bytes are written; later chunks are recorded as sent and dropped.
    """

    __slots__ = (
        "_decoder",
        "_ended",
        "_flow_js",
        "_fwd",
        "_head_drop",
        "_head_fwd",
        "_head_sent",
        "_sent",
        "_session_js",
        "clock",
        "cut",
        "faults",
        "over_limit",
        "results",
        "sink",
    )

    def __init__(
        self,
        flow: str,
        session: str | None,
        sink: list[Record],
        clock: Callable[[], float],
        *,
        faults: EventFaults | None = None,
        results: MessageWatch | None = None,
    ) -> None:
        self.sink = sink
        self.clock = clock
        self.faults = faults
        self.results = results
        self._decoder = SseDecoder()
        self._sent = 0
        self._fwd = 0
        self._ended = False
        self.cut: Fired | None = None
        self.over_limit: int | None = None
        """Characters of the unfinished event when the pipe gave the stream up (None: not)."""
        self._flow_js = js(flow)
        self._session_js = js(session)
        self._head_sent = '{"type":"sent","flow":' + self._flow_js + ',"t":'
        self._head_fwd = '{"type":"forwarded","flow":' + self._flow_js + ',"t":'
        self._head_drop = '{"type":"dropped","flow":' + self._flow_js + ',"t":'

    def _give_up(self, held: int) -> None:
        """An event outgrew MAX_EVENT_CHARS: drop what is held, say so, take nothing more."""
        self.over_limit = held
        self._decoder.end_of_stream()
        self._ended = True
        flow: str = json.loads(self._flow_js)
        self.sink.append(
            {
                "type": "oversize",
                "flow": flow,
                "t": self.clock(),
                "index": self._sent,
                "chars": held,
                "limit": MAX_EVENT_CHARS,
            }
        )

    def feed(self, chunk: bytes) -> bytes:
        if self._ended:
            return b""
        held = self._decoder.pending_chars
        if held > MAX_EVENT_CHARS:  # (the chunks so far left an event over the bound)
            self._give_up(held)
            return b""
        if not chunk:
            self._ended = True
            self._decoder.end_of_stream()
            return b""
        decoder = self._decoder
        # Pass the chunk on as it came when it is whole events (the decoder held nothing back
        # before it nor after it) and no fault can act on them: re-encoding would give the
        # client the same events. Only what the tap records is then worked out per event.
        faults = self.faults
        whole = decoder.at_boundary and self.cut is None
        events = decoder.feed(chunk)
        if not events:
            # Only comments or a partial block so far: pass keep-alives on, never half an event.
            return KEEPALIVE if not decoder.in_block and self.cut is None else b""
        now = self.clock()
        ts = repr(now)
        if (
            whole
            and decoder.at_boundary
            and (faults is None or faults.quiet(self._sent, self._sent + len(events)))
        ):
            # No fault is due on any of them (most chunks, even under the gate's faults):
            # passed on as they came, each recorded and, where the plan needs, remembered.
            for ev in events:
                self._untouched(ev, now, ts)
            return chunk
        out: list[bytes] = []
        for ev in events:
            self._one(ev, now, ts, out)
        return b"".join(out)

    # ------------------------------------------------------------------ one event

    def _sent_record(self, ev: SseEvent, index: int, ts: str, fwd: str) -> tuple[str | None, str, str]:
        """Append the `sent` record of event `index` (`fwd`: its short-form tail, see
        `_untouched`); its (stream ID, JSON of its ID, digest)."""
        eid = ev.id
        digest = sha256(ev.data.encode()).hexdigest()  # = message_digest, inlined: once per event
        parsed = parse_event_id(eid) if eid else None
        if parsed is not None:
            sid: str | None = parsed.stream_id
            eid_js = f'"{eid}"'  # an e1 ID has only [A-Za-z0-9_.-]: nothing to escape
            sid_js = f'"{sid}"'
        else:
            sid, eid_js, sid_js = None, js(eid), "null"
        # The method, only of a message that needs a declared capability (the checker's
        # `declared_capabilities`): one regex search per event, a parse only on a hit.
        method = gated_method(ev.data) if ev.has_data else None
        self.sink.append(
            f'{self._head_sent}{ts},"index":{index},"event_id":{eid_js},"digest":"{digest}",'
            f'"has_data":{"true" if ev.has_data else "false"},"priming":{"true" if ev.is_priming else "false"},'
            f'"stream_id":{sid_js},"session":{self._session_js},'
            f'"retry":{"null" if ev.retry is None else ev.retry}'
            f"{'' if method is None else f',"method":"{method}"'}{fwd}}}"
        )
        return sid, eid_js, digest

    def _untouched(self, ev: SseEvent, now: float, ts: str) -> None:
        """An event forwarded as it came, at once: its `sent` record carries `"fwd": N`, the
        short form of the `forwarded` record (index N) that would only repeat it with no
        fault (docs/ledgers.md; the checker expands it, lab.checker.inputs.tap_forms)."""
        index = self._sent
        self._sent += 1
        sid, _, digest = self._sent_record(ev, index, ts, f',"fwd":{self._fwd}')
        self._fwd += 1
        if self.results is not None and ev.is_message:
            self.sink.extend(self.results.records(ev.data, now, index))
        if self.faults is not None:
            self.faults.passed(index, ev, sid, digest)

    def _one(self, ev: SseEvent, now: float, ts: str, out: list[bytes]) -> None:
        index = self._sent
        faults = self.faults
        if self.cut is None and (faults is None or faults.quiet(index, index + 1)):
            out.append(reencode(ev, ev.id))  # (half of a chunk: the rest is not yet whole)
            self._untouched(ev, now, ts)
            return
        self._sent += 1
        eid = ev.id
        at = len(self.sink)
        sid, eid_js, digest = self._sent_record(ev, index, ts, "")
        if self.results is not None and ev.is_message:
            self.sink.extend(self.results.records(ev.data, now, index))
        if self.cut is not None:
            self._drop(index, ts, self.cut)
            return
        o: EventOutcome | None = faults(index, ev, sid, digest, now) if faults is not None else None
        if o is None:  # forwarded untouched after all: the short form on its `sent` record
            out.append(reencode(ev, eid))
            sent = self.sink[at]
            assert isinstance(sent, str)
            self.sink[at] = f'{sent[:-1]},"fwd":{self._fwd}}}'
            self._fwd += 1
            return
        for copy, fired in o.before:
            self._forward_copy(copy, ts, fired, out)
        if o.cut is not None:
            self.cut = o.cut
            self._drop(index, ts, o.cut)
        elif o.drop is not None:
            self._drop(index, ts, o.drop)
        elif o.rename is not None:
            new_id, fired = o.rename
            self._forward(reencode(ev, new_id), js(new_id), digest, self._flow_js, index, ts, fired, out)
        else:
            self._forward(reencode(ev, eid), eid_js, digest, self._flow_js, index, ts, None, out)

    # ------------------------------------------------------------------ output

    def _forward(
        self,
        raw: bytes,
        eid_js: str,
        digest: str,
        source_flow_js: str | None,
        source_index: int,
        ts: str,
        fired: Fired | None,
        out: list[bytes],
    ) -> None:
        out.append(raw)
        source = "null" if source_flow_js is None else f'{{"flow":{source_flow_js},"index":{source_index}}}'
        tail = (
            '"fault":null,"rule":null,"decision":null}'
            if fired is None
            else f'"fault":"{fired.fault}","rule":{js(fired.rule)},"decision":"{fired.decision}"}}'
        )
        self.sink.append(
            f'{self._head_fwd}{ts},"index":{self._fwd},"event_id":{eid_js},"digest":"{digest}",'
            f'"source":{source},{tail}'
        )
        self._fwd += 1

    def _forward_copy(self, r: Remembered, ts: str, fired: Fired, out: list[bytes]) -> None:
        ev = SseEvent(data=r.data, event=r.event, id=r.event_id)
        self._forward(reencode(ev, r.event_id), js(r.event_id), r.digest, js(r.flow), r.idx, ts, fired, out)

    def _drop(self, index: int, ts: str, fired: Fired) -> None:
        self.sink.append(
            f'{self._head_drop}{ts},"index":{index},"fault":"{fired.fault}","rule":{js(fired.rule)},'
            f'"decision":"{fired.decision}"}}'
        )
